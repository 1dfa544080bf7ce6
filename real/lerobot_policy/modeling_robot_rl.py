"""``RobotRLPolicy``: a LeRobot ``PreTrainedPolicy`` around one of our exported policies, so LeRobot's deployment
path (``lerobot-rollout --policy.path=<folder>``, ``make_policy`` + ``make_pre_post_processors``) runs it.

LeRobot hands the policy a batch in the robot's units -- ``observation.state`` float [B, 6] (SO-101: body degrees,
gripper 0..100), ``observation.images.<cam>`` float [B, 3, H, W] in [0, 1], ``task`` str or list[str] -- and expects
``action`` [B, 6] in the same units. The wrapper converts to what the policy was trained on and back:

- the flow VLA (reads ``observation.state`` + images + task, writes joint targets in degrees): the gripper between
  0..100 and degrees (``RobotRLConfig.gripper_units``), images resized to the policy's size;
- state policies (Gaussian, tanh-Gaussian) that read only ``proprio`` (the six joints, rad) and act in [-1, 1]:
  joints to radians, and their action through the arm's action mapping (``sim.so101.SO101Arm.action_to_ctrl``)
  into joint targets. A state policy that reads task state the robot does not report (a cube's pose) is refused
  when loaded, naming what it reads.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.pretrained import PreTrainedPolicy
from lerobot.utils.constants import OBS_STATE

from policies import ActionQueue, Policy, keys, load_policy
from real import features
from real.lerobot_policy.configuration_robot_rl import RobotRLConfig
from real.lerobot_policy.read_config import read_policy_config
from sim import so101

FRAME, PROPRIO = "frame", "proprio"  # what the wrapped policy reads: a LeRobot frame, or the joints in radians


def policy_kind(policy: Policy) -> str:
    """``FRAME`` (reads ``observation.state`` [6], optionally images, and the task) or ``PROPRIO`` (reads only the
    joints in rad). Raises ``ValueError`` naming the inputs a LeRobot SO-101 cannot provide."""
    inputs = policy.processor.features.inputs
    if policy.processor.features.action_dim != len(so101.JOINT_NAMES):
        raise ValueError(f"{type(policy).__name__} acts in {policy.processor.features.action_dim} dims; an SO-101 "
                         f"takes {len(so101.JOINT_NAMES)} joint targets")
    images = {k for k in inputs if k.startswith(keys.OBS_IMAGES)}
    if keys.OBS_STATE in inputs and set(inputs) == {keys.OBS_STATE, *images}:
        return FRAME
    if set(inputs) == {keys.PROPRIO} and inputs[keys.PROPRIO] == [len(so101.JOINT_NAMES)]:
        return PROPRIO
    raise ValueError(f"{type(policy).__name__} reads {inputs}; through LeRobot an SO-101 reports only its joints and "
                     f"camera images: a policy must read {keys.OBS_STATE!r} (+ images) or only {keys.PROPRIO!r} [6]. "
                     "State policies trained on privileged task state (object poses) run in simulation only")


@functools.lru_cache(maxsize=8)
def _arm(action_mode: str, max_delta: float, max_delta_gripper: float) -> so101.SO101Arm:
    import mujoco

    model = mujoco.MjModel.from_xml_path(str(so101.SCENE_XML))
    return so101.SO101Arm(model, torch.device("cpu"), max_delta, max_delta_gripper, action_mode)


class RobotRLPolicy(PreTrainedPolicy):
    """Our exported policy behind LeRobot's policy interface (module docstring).

    Args:
        config: the LeRobot config (``RobotRLConfig``).
        inner: the loaded policy (``policies.load_policy``); ``from_pretrained`` passes it. There is no policy to
            build from scratch: robot_rl policies are trained by robot-rl.
    """

    config_class = RobotRLConfig
    name = "robot_rl"

    def __init__(self, config: RobotRLConfig, inner: Policy | None = None, **kwargs: Any) -> None:
        super().__init__(config)
        if inner is None:
            raise ValueError("a robot_rl policy wraps a policy exported by robot-rl: load one with --policy.path=<a "
                             "folder written by real.lerobot_policy.export_for_lerobot>; LeRobot cannot build or "
                             "train it from scratch")
        config.validate_features()
        self.kind = policy_kind(inner)
        if self.kind == PROPRIO and config.gripper_units != "degrees":
            raise ValueError("a state policy acts on the simulator's joints: policy.gripper_units must be 'degrees'")
        self.inner = inner
        self.gripper = features.GripperRange(config.gripper_low_deg, config.gripper_high_deg)
        horizon = int(inner.horizon)
        self.n_action_steps = min(horizon, config.n_action_steps or int(inner.executed_steps))
        self._pending: list[torch.Tensor] = []  # queued actions [B, 6] in the policy's space
        self._ensembler: ActionQueue | None = None  # for instructions the policy runs with temporal ensembling

    # ------------------------------------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, pretrained_name_or_path: str | Path, *, config: PreTrainedConfig | None = None,
                        **kwargs: Any) -> RobotRLPolicy:
        """Load from a local LeRobot policy folder: its ``config.json`` (unless ``config`` is given) and our export
        in ``config.policy_subdir``, checked by ``policies.load_policy``."""
        path = Path(pretrained_name_or_path)
        if not path.is_dir():
            raise FileNotFoundError(f"robot_rl policies load from a local folder; {path} is none")
        if config is None:
            config = read_policy_config(path)  # LeRobot's own reader leaves a temporary file per call
        if not isinstance(config, RobotRLConfig):
            raise TypeError(f"{path}: a {type(config).__name__} is no robot_rl config")
        inner = load_policy(path / config.policy_subdir, device=config.device or "cpu")
        policy = cls(config, inner=inner)
        policy.to(config.device)
        policy.eval()
        return policy

    def _save_pretrained(self, save_directory: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """LeRobot's ``config.json`` and our export in ``policy_subdir`` (no ``model.safetensors``: the weights
        are the export's)."""
        self.config._save_pretrained(save_directory)
        self.inner.save(Path(save_directory) / self.config.policy_subdir)

    # ------------------------------------------------------------------------------------- LeRobot's API
    def get_optim_params(self) -> Any:
        return self.parameters()

    def reset(self) -> None:
        """Drop queued actions and the wrapped policy's per-episode state (LeRobot calls this between episodes)."""
        self._pending.clear()
        self._ensembler = None
        self.inner.reset()

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict | None]:
        raise NotImplementedError("robot_rl policies are trained by robot-rl (robot-rl offline / train), not by "
                                  "lerobot-train")

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Any], **kwargs: Any) -> torch.Tensor:
        """float32 [B, H, 6] in the robot's units: the policy's whole chunk (H = 1 for a state policy)."""
        frame, state_deg = self._inputs(batch)
        out = self._act(frame)
        return torch.stack([self._to_robot(out[:, i], state_deg) for i in range(out.shape[1])], dim=1)

    @torch.no_grad()
    def select_action(self, batch: dict[str, Any], **kwargs: Any) -> torch.Tensor:
        """float32 [B, 6] in the robot's units: the next action, from a queue of the first ``n_action_steps``
        actions of the latest chunk (a new chunk is asked for when the queue is empty), or, for an instruction the
        policy runs with ACT's temporal ensembling (``temporal_ensemble_for``), the blend of every chunk's
        prediction for this step (``policies.execution.ActionQueue``; a chunk every ``n_action_steps``)."""
        frame, state_deg = self._inputs(batch)
        if int(self.inner.horizon) > 1 and self.inner.temporal_ensemble_for(self._task(frame)) is not None:
            b = state_deg.shape[0]
            if self._ensembler is None or self._ensembler.num_envs != b:
                self._ensembler = ActionQueue(self.inner, b, len(so101.JOINT_NAMES),
                                              query_every=self.n_action_steps if self.config.n_action_steps else None)
            return self._to_robot(self._ensembler(frame), state_deg)
        if not self._pending or self._pending[0].shape[0] != state_deg.shape[0]:
            out = self._act(frame)
            self._pending = [out[:, i] for i in range(self._steps_for(frame))]
        return self._to_robot(self._pending.pop(0), state_deg)

    # ------------------------------------------------------------------------------------------ internals
    def _steps_for(self, frame: dict[str, Any]) -> int:
        """Actions queued from a new chunk: ``config.n_action_steps`` when set, else the wrapped policy's for the
        batch's (first) instruction (``executed_steps_for``), at most the horizon."""
        if self.config.n_action_steps:
            return self.n_action_steps
        return min(int(self.inner.horizon), int(self.inner.executed_steps_for(self._task(frame))))

    @staticmethod
    def _task(frame: dict[str, Any]) -> str | None:
        """The batch's (first) instruction, None when it has none."""
        return (frame.get(keys.TASK) or [None])[0]

    def _inputs(self, batch: dict[str, Any]) -> tuple[dict[str, Any], torch.Tensor]:
        """(the wrapped policy's observation, the joints in degrees [B, 6]) of a LeRobot batch."""
        if OBS_STATE not in batch:
            raise KeyError(f"the batch has no {OBS_STATE!r}; it has {sorted(batch)}")
        state = batch[OBS_STATE].to(self.inner.device).float()
        if state.dim() == 1:
            state = state[None]
        if state.shape[-1] != len(so101.JOINT_NAMES):
            raise ValueError(f"{OBS_STATE!r} has shape {list(state.shape)}; an SO-101 reports [B, 6]")
        b = state.shape[0]
        state_deg = features.robot_to_deg(state, self.gripper)
        if self.kind == PROPRIO:
            return {keys.PROPRIO: so101.deg_to_rad(state_deg)}, state_deg
        frame: dict[str, Any] = {keys.OBS_STATE: state_deg if self.config.gripper_units == "degrees" else state}
        for key, shape in self.inner.processor.features.inputs.items():
            if key == keys.OBS_STATE:
                continue
            if key not in batch:
                raise KeyError(f"the policy reads {key!r}, which the batch lacks (it has {sorted(batch)}); map "
                               "cameras with --rename_map")
            img = batch[key].to(self.inner.device)
            img = img[None] if img.dim() == 3 else img
            img = img.float() / 255.0 if img.dtype == torch.uint8 else img.float()
            if list(img.shape[-2:]) != list(shape[-2:]):
                img = F.interpolate(img, size=tuple(shape[-2:]), mode="bilinear", antialias=True, align_corners=False)
            frame[key] = img.clamp(0.0, 1.0)
        task = batch.get(keys.TASK, "")
        frame[keys.TASK] = [task] * b if isinstance(task, str) else [str(t) for t in task]
        return frame, state_deg

    def _act(self, frame: dict[str, Any]) -> torch.Tensor:
        """[B, H, 6] actions in the policy's space, checked finite."""
        out = self.inner.act(frame, deterministic=True)
        out = out[:, None] if out.dim() == 2 else out
        if not bool(torch.isfinite(out).all()):
            raise ValueError(f"{type(self.inner).__name__} produced non-finite actions; nothing is sent")
        return out

    def _to_robot(self, action: torch.Tensor, state_deg: torch.Tensor) -> torch.Tensor:
        """[B, 6] robot units of one step of the policy's actions (``state_deg``: the joints they start from)."""
        if self.kind == FRAME:
            act = action.float()
            return features.deg_to_robot(act, self.gripper) if self.config.gripper_units == "degrees" else act
        cfg = self.config
        arm = _arm(cfg.action_mode, float(cfg.max_delta), float(cfg.max_delta_gripper))
        b, nq, nu = action.shape[0], int(arm.qpos_idx.max()) + 1, int(arm.act_idx.max()) + 1
        qpos = torch.zeros(b, nq, dtype=torch.float64)
        qpos[:, arm.qpos_idx] = so101.deg_to_rad(state_deg.double().cpu())
        ctrl = arm.action_to_ctrl(qpos, torch.zeros(b, nu, dtype=torch.float64), action.double().cpu().clamp(-1, 1))
        target_deg = so101.rad_to_deg(ctrl[:, arm.act_idx]).float()
        return features.deg_to_robot(target_deg, self.gripper).to(action.device)
