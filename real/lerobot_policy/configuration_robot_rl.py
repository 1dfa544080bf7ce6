"""``RobotRLConfig``: our exported policies (flow VLA, Gaussian) as a LeRobot policy type, ``robot_rl``.

A LeRobot policy folder of this type (written by ``real.lerobot_policy.export_for_lerobot``) holds LeRobot's
``config.json`` (this config), ``policy_preprocessor.json`` / ``policy_postprocessor.json`` and our exported policy,
untouched, in the subfolder ``policy_subdir`` (``config.json`` + ``model.safetensors`` + ``processor.*``), loaded
and checked by ``policies.load_policy``. LeRobot finds the model in ``modeling_robot_rl`` and the processors in
``processor_robot_rl`` by its naming convention.
"""

from __future__ import annotations

from dataclasses import dataclass

from lerobot.configs.policies import PreTrainedConfig
from lerobot.configs.types import FeatureType
from lerobot.optim.optimizers import AdamWConfig
from lerobot.utils.constants import ACTION, OBS_STATE

from sim.so101 import ACTION_MODES

GRIPPER_UNITS = ("degrees", "percent")


@PreTrainedConfig.register_subclass("robot_rl")
@dataclass
class RobotRLConfig(PreTrainedConfig):
    """LeRobot's view of one of our exported policies. The robot side speaks LeRobot's SO-101 units (body joints in
    degrees, gripper 0..100); the policy side what the policy was trained on.

    Fields beyond LeRobot's (``input_features``/``output_features`` describe the robot side: ``observation.state``
    [6], ``observation.images.<cam>`` [3, H, W], ``action`` [6]):
    """

    policy_subdir: str = "robot_rl_policy"  # folder, inside the LeRobot policy folder, holding our export
    # The gripper's units in the policy's training data: "degrees" (our simulator's frames, robot-rl collect) --
    # converted from/to the robot's 0..100 over [gripper_low_deg, gripper_high_deg] -- or "percent" (recorded
    # from an SO-101 through LeRobot, lerobot-record) -- passed through.
    gripper_units: str = "degrees"
    gripper_low_deg: float = -10.0  # degrees at the robot's gripper 0 (our model's closed limit)
    gripper_high_deg: float = 100.0  # degrees at the robot's gripper 100 (open limit)
    n_action_steps: int | None = None  # actions executed per chunk before asking again; None: the policy's own (its per-task value where it keeps one)
    # State policies (Gaussian, tanh-Gaussian) act in [-1, 1]; the arm's action mapping they were trained with
    # (sim.so101.SO101Arm) turns that into joint targets: "delta" (target = q + a * max_delta) or "absolute".
    action_mode: str = "delta"
    max_delta: float = 0.08  # rad per control step at |a| = 1, body joints (delta mode)
    max_delta_gripper: float = 0.15  # rad per control step at |a| = 1, gripper (delta mode)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gripper_units not in GRIPPER_UNITS:
            raise ValueError(f"policy.gripper_units must be one of {GRIPPER_UNITS}, got {self.gripper_units!r}")
        if not self.gripper_high_deg > self.gripper_low_deg:
            raise ValueError(f"policy.gripper_low_deg < gripper_high_deg needed, got {self.gripper_low_deg}, "
                             f"{self.gripper_high_deg}")
        if self.action_mode not in ACTION_MODES:
            raise ValueError(f"policy.action_mode must be one of {ACTION_MODES}, got {self.action_mode!r}")
        if self.n_action_steps is not None and self.n_action_steps < 1:
            raise ValueError(f"policy.n_action_steps must be >= 1 or None, got {self.n_action_steps}")
        if not (self.max_delta > 0 and self.max_delta_gripper > 0):
            raise ValueError(f"policy.max_delta and max_delta_gripper must be > 0 rad, got {self.max_delta}, "
                             f"{self.max_delta_gripper}")

    @property
    def observation_delta_indices(self) -> None:
        return None

    @property
    def action_delta_indices(self) -> None:
        return None

    @property
    def reward_delta_indices(self) -> None:
        return None

    def get_optimizer_preset(self) -> AdamWConfig:
        return AdamWConfig(lr=1e-4)  # unused: robot_rl policies are trained by robot-rl, not lerobot-train

    def get_scheduler_preset(self) -> None:
        return None

    def validate_features(self) -> None:
        state = (self.input_features or {}).get(OBS_STATE)
        if state is None or state.type is not FeatureType.STATE or tuple(state.shape) != (6,):
            raise ValueError(f"a robot_rl policy reads {OBS_STATE!r} [6] (the SO-101's joints); input_features "
                             f"are {self.input_features}")
        action = (self.output_features or {}).get(ACTION)
        if action is None or tuple(action.shape) != (6,):
            raise ValueError(f"a robot_rl policy writes {ACTION!r} [6]; output_features are {self.output_features}")
