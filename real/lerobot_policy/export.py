"""Write one of our exported policies as a LeRobot policy folder (type ``robot_rl``) that LeRobot's deployment path
loads: ``lerobot-rollout --policy.path=<out> --robot.type=so101_sim ...`` (or ``so101_follower``).

    python -m real.lerobot_policy.export runs/<run>/checkpoints/<it>/policy out/lerobot_policy [--gripper-units percent]

The folder holds LeRobot's ``config.json`` (``RobotRLConfig``: the robot-side features, the unit conversion, the
arm's action mapping for state policies), the two pipeline files and our export, copied unchanged, in
``robot_rl_policy/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.utils.constants import ACTION, OBS_STATE

from policies import keys, load_policy
from real import features
from real.lerobot_policy.configuration_robot_rl import RobotRLConfig
from real.lerobot_policy.modeling_robot_rl import PROPRIO, RobotRLPolicy, policy_kind
from real.lerobot_policy.processor_robot_rl import make_robot_rl_pre_post_processors

ARM_FIELDS = ("action_mode", "max_delta", "max_delta_gripper")  # of a task config (sim.tasks.common.ArmTaskConfig)


def _arm_settings(policy_dir: Path) -> dict[str, object]:
    """The action mapping of the task a checkpoint's policy was trained on (``<checkpoint>/meta.json``), if any."""
    meta = policy_dir.parent / "meta.json"
    if not meta.is_file():
        return {}
    task_cfg = json.loads(meta.read_text()).get("task_config") or {}
    return {k: task_cfg[k] for k in ARM_FIELDS if k in task_cfg}


def export_for_lerobot(policy_dir: str | Path, out_dir: str | Path, gripper_units: str = "degrees",
                       device: str = "cpu", n_action_steps: int | None = None) -> Path:
    """Write ``out_dir`` (created; an existing LeRobot policy there is overwritten) from our exported policy folder
    ``policy_dir`` and return it.

    Args:
        policy_dir: a folder saved by ``Policy.save`` (``robot-rl offline``'s ``checkpoints/<it>/policy``).
        out_dir: the LeRobot policy folder to write.
        gripper_units: the gripper's units in the policy's training data ("degrees": our simulator; "percent":
            recorded through LeRobot from an SO-101 or ``so101_sim``).
        device: torch device LeRobot runs it on.
        n_action_steps: actions executed per chunk (None: the policy's own ``executed_steps``).

    Raises:
        ValueError: the policy reads inputs an SO-101 does not report through LeRobot (``policy_kind``).
    """
    policy_dir, out_dir = Path(policy_dir), Path(out_dir)
    inner = load_policy(policy_dir, device=device)
    arm = _arm_settings(policy_dir)
    if not arm and policy_kind(inner) == PROPRIO:  # normalised actions, mapped to joint targets the task's way
        print(f"export: no meta.json beside {policy_dir} (a checkpoint's policy has one): its actions will be mapped "
              f"to joint targets the way the task config defaults say (action_mode {RobotRLConfig.action_mode!r}); "
              f"export runs/<run>/checkpoints/<it>/policy to keep the training's", file=sys.stderr)
    inputs = {OBS_STATE: PolicyFeature(FeatureType.STATE, (len(features.POS_FEATURES),))}
    for key, shape in inner.processor.features.inputs.items():
        if key.startswith(keys.OBS_IMAGES):
            inputs[key] = PolicyFeature(FeatureType.VISUAL, tuple(shape))
    g = features.sim_gripper_range()
    cfg = RobotRLConfig(device=device, input_features=inputs,
                        output_features={ACTION: PolicyFeature(FeatureType.ACTION, (len(features.POS_FEATURES),))},
                        gripper_units=gripper_units, gripper_low_deg=g.low_deg, gripper_high_deg=g.high_deg,
                        n_action_steps=n_action_steps, **arm)
    policy = RobotRLPolicy(cfg, inner=inner)
    policy.save_pretrained(out_dir)
    pre, post = make_robot_rl_pre_post_processors(cfg)
    pre.save_pretrained(out_dir)
    post.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("policy_dir", help="our exported policy folder (config.json + model.safetensors + processor.*)")
    p.add_argument("out_dir", help="the LeRobot policy folder to write")
    p.add_argument("--gripper-units", default="degrees", choices=("degrees", "percent"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--n-action-steps", type=int, default=None)
    a = p.parse_args(argv)
    out = export_for_lerobot(a.policy_dir, a.out_dir, a.gripper_units, a.device, a.n_action_steps)
    print(f"LeRobot policy folder: {out} (lerobot-rollout --policy.path={out} ...)")


if __name__ == "__main__":
    main()
