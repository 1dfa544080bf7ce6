"""The SO-101 arm as the tasks see it: joint names and order, units, and the action mapping.

Joint order and names are LeRobot's (``lerobot.robots.so_follower``): LeRobot speaks degrees
(``shoulder_pan.pos`` ...), the simulator radians. ``deg_to_rad``/``rad_to_deg`` are the one place
the two meet; ``real/`` and the dataset code call them too.
"""

from __future__ import annotations

import math
from pathlib import Path

import mujoco
import torch

ASSETS = Path(__file__).parent / "assets"
SCENE_XML = ASSETS / "so101_scene.xml"

JOINT_NAMES: tuple[str, ...] = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
ARM_JOINTS = JOINT_NAMES[:5]
GRIPPER = "gripper"
LEROBOT_STATE_NAMES = tuple(f"{j}.pos" for j in JOINT_NAMES)  # LeRobot observation.state / action feature names
ACTION_MODES = ("delta", "absolute", "delta_absolute_gripper")  # see SO101Arm


def deg_to_rad(x: torch.Tensor) -> torch.Tensor:
    """LeRobot joint degrees -> simulator radians."""
    return x * (math.pi / 180.0)


def rad_to_deg(x: torch.Tensor) -> torch.Tensor:
    """Simulator radians -> LeRobot joint degrees."""
    return x * (180.0 / math.pi)


class SO101Arm:
    """Index bookkeeping and the action mapping for the six SO-101 joints inside a bound model.

    Actions are relative joint-position targets: ``target = clip(qpos + a * max_delta, ctrlrange)`` with ``a`` in
    [-1, 1]. Relative to the measured position (not the previous target), so a blocked joint never winds up a
    large error, and the per-step change is capped like the real arm's safety filter (RELIABILITY.md A2).

    ``action_mode`` (``ACTION_MODES``): "delta" as above; "absolute" maps ``a`` onto each joint's range;
    "delta_absolute_gripper" moves the five arm joints by deltas and maps the gripper's ``a`` onto its range, the
    target then capped to ``max_delta_gripper`` from the measured opening (the jaw closes no faster than in "delta").
    With deltas, a policy's exploration noise random-walks the jaw, which then sits at a limit; with an absolute
    gripper the noise scatters around an opening the policy's mean chooses.
    """

    def __init__(self, model: mujoco.MjModel, device: torch.device, max_delta: float, max_delta_gripper: float,
                 action_mode: str = "delta") -> None:
        if action_mode not in ACTION_MODES:
            raise ValueError(f"action_mode must be one of {ACTION_MODES}, got {action_mode!r}")
        self.action_mode = action_mode
        jids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in JOINT_NAMES]
        aids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_ACTUATOR, n) for n in JOINT_NAMES]
        if min(jids) < 0 or min(aids) < 0:
            raise ValueError(f"model lacks SO-101 joints/actuators named {JOINT_NAMES}")
        self.qpos_idx = torch.tensor([int(model.jnt_qposadr[j]) for j in jids], device=device)
        self.qvel_idx = torch.tensor([int(model.jnt_dofadr[j]) for j in jids], device=device)
        self.act_idx = torch.tensor(aids, device=device)
        self._owns_ctrl = aids == list(range(model.nu))  # the arm's actuators are the whole ctrl vector, in order
        cr = torch.as_tensor(model.actuator_ctrlrange[aids], dtype=torch.float32, device=device)
        jr = torch.as_tensor(model.jnt_range[jids], dtype=torch.float32, device=device)
        # Targets stay inside both the actuator's control range and the joint's range.
        self.low = torch.maximum(cr[:, 0], jr[:, 0])
        self.high = torch.minimum(cr[:, 1], jr[:, 1])
        self.max_delta = torch.full((6,), float(max_delta), device=device)
        self.max_delta[5] = float(max_delta_gripper)

    def qpos(self, qpos: torch.Tensor) -> torch.Tensor:
        """[N, 6] joint positions (rad)."""
        return qpos[:, self.qpos_idx].float()

    def qvel(self, qvel: torch.Tensor) -> torch.Tensor:
        """[N, 6] joint velocities (rad/s)."""
        return qvel[:, self.qvel_idx].float()

    def action_to_ctrl(self, qpos: torch.Tensor, ctrl: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """[N, 6] action in [-1, 1] -> the full ctrl vector [N, nu] with the arm's targets written in."""
        if self.action_mode == "delta":
            target = self.qpos(qpos) + action * self.max_delta
        elif self.action_mode == "absolute":
            target = self.low + (action + 1.0) * 0.5 * (self.high - self.low)
        else:
            q = self.qpos(qpos)
            target = q + action * self.max_delta
            grip = self.low[5] + (action[:, 5] + 1.0) * 0.5 * (self.high[5] - self.low[5])
            target[:, 5] = torch.minimum(torch.maximum(grip, q[:, 5] - self.max_delta[5]), q[:, 5] + self.max_delta[5])
        target = torch.maximum(torch.minimum(target, self.high), self.low)
        if self._owns_ctrl:
            return target.to(ctrl.dtype)
        out = ctrl.clone()
        out[:, self.act_idx] = target.to(out.dtype)
        return out

    def ctrl_to_action(self, joint_pos: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Inverse of ``action_to_ctrl``: joint targets [N, 6] (rad) from measured joint positions [N, 6] (rad)
        -> actions [N, 6] clipped to [-1, 1] (what a teleoperator's joint targets become; the scripted experts)."""
        delta = (target - joint_pos) / self.max_delta
        absolute = 2.0 * (target - self.low) / (self.high - self.low) - 1.0
        if self.action_mode == "delta":
            a = delta
        elif self.action_mode == "absolute":
            a = absolute
        else:
            a = torch.cat([delta[:, :5], absolute[:, 5:]], dim=1)
        return a.clamp(-1.0, 1.0)
