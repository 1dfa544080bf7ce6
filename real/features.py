"""LeRobot's SO-101 feature names and units <-> our frame convention, in one place.

LeRobot's SO-101 follower (``so101_follower``, default ``use_degrees=True``) and our simulated one (``so101_sim``)
speak flat dicts: ``shoulder_pan.pos`` ... ``wrist_roll.pos`` in **degrees** and ``gripper.pos`` in LeRobot's
**0..100** range (``MotorNormMode.RANGE_0_100``: 0 at the calibrated minimum, 100 at the maximum), plus one
``(H, W, 3)`` uint8 image per camera under the camera's name.

Our frame convention (the contract of the sim view, the dataset writer, the loader and the VLA) is all six joints in
degrees: ``observation.state`` float32 [N, 6], ``action`` joint targets float32 [N, 6], images uint8 [N, 3, H, W].
The five body joints pass through unchanged; the gripper maps linearly between 0..100 and its degree range
(``GripperRange``). Degrees <-> the simulator's radians stays in ``sim.so101`` (``deg_to_rad``/``rad_to_deg``).

    g = sim_gripper_range()                                    # the simulated gripper: -10 deg .. 100 deg
    state = state_from_robot(robot.get_observation(), g)       # float32 [1, 6] degrees
    robot.send_action(action_to_robot(targets_deg, g))         # targets_deg float [6] or [1, 6] degrees
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from policies import keys
from sim import so101

MOTORS: tuple[str, ...] = so101.JOINT_NAMES  # LeRobot's motor names, in its order (= our joint order)
POS_FEATURES: tuple[str, ...] = so101.LEROBOT_STATE_NAMES  # "<motor>.pos", the robot's state and action keys
GRIPPER_FEATURE = POS_FEATURES[so101.JOINT_NAMES.index(so101.GRIPPER)]
GRIPPER_INDEX = so101.JOINT_NAMES.index(so101.GRIPPER)
STS3215_RESOLUTION = 4096  # ticks per turn of the SO-101's servos (LeRobot's model_resolution_table)


@dataclass(frozen=True)
class GripperRange:
    """The gripper's degree range that LeRobot's 0..100 spans: ``deg = low_deg + pct / 100 * (high_deg - low_deg)``.

    Attributes:
        low_deg: degrees at 0 (the calibrated minimum; closed on the SO-101).
        high_deg: degrees at 100 (the calibrated maximum; open).
    """

    low_deg: float
    high_deg: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low_deg) and math.isfinite(self.high_deg)) or self.high_deg <= self.low_deg:
            raise ValueError(f"GripperRange needs finite low_deg < high_deg, got {self.low_deg}, {self.high_deg}")

    def to_deg(self, pct: torch.Tensor) -> torch.Tensor:
        """LeRobot's 0..100 -> degrees (no clamping: a value outside 0..100 maps outside the range)."""
        return self.low_deg + pct / 100.0 * (self.high_deg - self.low_deg)

    def to_pct(self, deg: torch.Tensor) -> torch.Tensor:
        """Degrees -> LeRobot's 0..100 (no clamping)."""
        return (deg - self.low_deg) * (100.0 / (self.high_deg - self.low_deg))

    @classmethod
    def from_calibration(cls, range_min: int, range_max: int) -> GripperRange:
        """The range a real gripper's calibration spans, in the degrees LeRobot's DEGREES mode would report for
        the same ticks (0 deg at the middle of the calibrated range: ``(tick - mid) * 360 / 4095``)."""
        if range_max <= range_min:
            raise ValueError(f"gripper calibration needs range_min < range_max, got {range_min}, {range_max}")
        mid, scale = (range_min + range_max) / 2.0, 360.0 / (STS3215_RESOLUTION - 1)
        return cls((range_min - mid) * scale, (range_max - mid) * scale)


@functools.lru_cache(maxsize=1)
def sim_gripper_range() -> GripperRange:
    """The simulated SO-101's gripper: the target range of our model (joint range within the actuator's control
    range, ``SO101Arm.low/high``), about -10 deg (closed, pads pressed) .. 100 deg (open)."""
    import mujoco

    model = mujoco.MjModel.from_xml_path(str(so101.SCENE_XML))
    arm = so101.SO101Arm(model, torch.device("cpu"), 1.0, 1.0)
    lo, hi = so101.rad_to_deg(torch.stack([arm.low[GRIPPER_INDEX], arm.high[GRIPPER_INDEX]]).double()).tolist()
    return GripperRange(lo, hi)


def _missing(values: Mapping[str, Any], names: Sequence[str], what: str) -> None:
    missing = [n for n in names if n not in values]
    if missing:
        raise KeyError(f"{what} lacks {missing}; an SO-101 {what} has {list(names)}")


def robot_to_deg(values: torch.Tensor, gripper: GripperRange) -> torch.Tensor:
    """float32 [..., 6] in the robot's units (body degrees, gripper 0..100) -> all degrees."""
    out = values.double().clone()
    out[..., GRIPPER_INDEX] = gripper.to_deg(out[..., GRIPPER_INDEX])
    return out.float()


def deg_to_robot(values: torch.Tensor, gripper: GripperRange) -> torch.Tensor:
    """float32 [..., 6] all degrees -> the robot's units (body degrees, gripper 0..100)."""
    out = values.double().clone()
    out[..., GRIPPER_INDEX] = gripper.to_pct(out[..., GRIPPER_INDEX])
    return out.float()


def vector_from_dict(values: Mapping[str, Any], what: str = "observation") -> torch.Tensor:
    """float32 [6] of the ``<motor>.pos`` entries of a robot dict, in our joint order, in the dict's own units.

    Raises:
        KeyError: naming the missing ``.pos`` keys.
    """
    _missing(values, POS_FEATURES, what)
    return torch.tensor([float(values[n]) for n in POS_FEATURES], dtype=torch.float32)


def dict_from_vector(values: torch.Tensor) -> dict[str, float]:
    """``{"<motor>.pos": float}`` of a [6] or [1, 6] vector (units unchanged)."""
    v = values.detach().reshape(-1).cpu().double()
    if v.numel() != len(POS_FEATURES):
        raise ValueError(f"an SO-101 joint vector has {len(POS_FEATURES)} values, got shape {tuple(values.shape)}")
    return {n: float(x) for n, x in zip(POS_FEATURES, v.tolist())}


def state_from_robot(obs: Mapping[str, Any], gripper: GripperRange) -> torch.Tensor:
    """float32 [1, 6] degrees: ``observation.state`` of a robot observation dict (robot units)."""
    return robot_to_deg(vector_from_dict(obs, "observation"), gripper)[None]


def images_from_robot(obs: Mapping[str, Any], cameras: Sequence[str]) -> dict[str, torch.Tensor]:
    """``{observation.images.<cam>: uint8 [1, 3, H, W]}`` of a robot observation's ``(H, W, 3)`` uint8 images."""
    _missing(obs, cameras, "observation")
    out = {}
    for cam in cameras:
        img = np.asarray(obs[cam])
        if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
            raise ValueError(f"camera {cam!r}: expected an (H, W, 3) uint8 image, got {img.dtype} {img.shape}")
        out[keys.lerobot_image_key(cam)] = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].clone()
    return out


def frame_from_robot(obs: Mapping[str, Any], cameras: Sequence[str], task: str,
                     gripper: GripperRange) -> dict[str, Any]:
    """Our frame (``observation.state`` [1, 6] degrees, ``observation.images.<cam>`` uint8 [1, 3, H, W],
    ``task`` [1]) of a robot observation dict."""
    return {keys.OBS_STATE: state_from_robot(obs, gripper), **images_from_robot(obs, cameras), keys.TASK: [task]}


def action_to_robot(targets_deg: torch.Tensor, gripper: GripperRange) -> dict[str, float]:
    """The robot's action dict (body degrees, gripper 0..100) of joint targets float [6] or [1, 6] in degrees."""
    return dict_from_vector(deg_to_robot(targets_deg.reshape(-1), gripper))


def action_from_robot(action: Mapping[str, Any], gripper: GripperRange) -> torch.Tensor:
    """float32 [1, 6] degrees: the joint targets of a robot action dict (robot units)."""
    return robot_to_deg(vector_from_dict(action, "action"), gripper)[None]
