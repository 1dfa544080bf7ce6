"""Shared pieces of the real-robot tests: LeRobot's SO-101 follower on the fault-injecting bus, a calibration, and
small scripted policies / teleoperators (test fixtures that implement the contracts, not mocks of what can run)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from policies import Policy, keys
from policies.processor import Features, Processor
from real.faults import FaultPlan, install_fault_bus
from real.safety import MAX_TICK

MOTORS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
# A plausible SO-101 calibration (ranges as lerobot-calibrate writes them; wrist_roll turns fully).
CALIBRATION = {
    "shoulder_pan": {"id": 1, "drive_mode": 0, "homing_offset": 52, "range_min": 770, "range_max": 3300},
    "shoulder_lift": {"id": 2, "drive_mode": 0, "homing_offset": -1200, "range_min": 820, "range_max": 3200},
    "elbow_flex": {"id": 3, "drive_mode": 0, "homing_offset": 1100, "range_min": 850, "range_max": 3100},
    "wrist_flex": {"id": 4, "drive_mode": 0, "homing_offset": -900, "range_min": 830, "range_max": 3250},
    "wrist_roll": {"id": 5, "drive_mode": 0, "homing_offset": 20, "range_min": 0, "range_max": 4095},
    "gripper": {"id": 6, "drive_mode": 0, "homing_offset": 1400, "range_min": 2000, "range_max": 3400},
}
MARGIN_TICKS = math.ceil(2.0 * MAX_TICK / 360.0)  # 23: the default 2 deg margin


def write_calibration(folder: Path, robot_id: str = "arm", calibration: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{robot_id}.json"
    path.write_text(json.dumps(calibration or CALIBRATION))
    return path


def follower(tmp_path: Path, plan: FaultPlan | None = None, use_degrees: bool = True, calibration: dict | None = None,
             **servo_kwargs: Any) -> tuple[Any, Any]:
    """LeRobot's SO-101 follower (``lerobot.robots.so_follower``) with its serial bus replaced by the fault bus:
    ``(robot, bus)``, not connected."""
    from lerobot.robots.so_follower import SO101Follower, SO101FollowerConfig

    cal_dir = tmp_path / "calibration"
    write_calibration(cal_dir, calibration=calibration)
    robot = SO101Follower(SO101FollowerConfig(port="/dev/sim-so101", id="arm", calibration_dir=cal_dir,
                                              use_degrees=use_degrees))
    bus = install_fault_bus(robot, plan or FaultPlan(), **servo_kwargs)
    return robot, bus


def tick_bounds(calibration: dict | None = None) -> dict[int, tuple[int, int]]:
    """Motor id -> [range_min + 23, range_max - 23]: where every Goal_Position tick must land."""
    cal = calibration or CALIBRATION
    return {c["id"]: (c["range_min"] + MARGIN_TICKS, c["range_max"] - MARGIN_TICKS) for c in cal.values()}


def ticks_per_unit(motor: str, use_degrees: bool = True, calibration: dict | None = None) -> float:
    c = (calibration or CALIBRATION)[motor]
    if motor == "gripper":
        return (c["range_max"] - c["range_min"]) / 100.0
    if use_degrees:
        return MAX_TICK / 360.0
    return (c["range_max"] - c["range_min"]) / 200.0


class ScriptedPolicy(Policy):
    """A deployable-policy double that reads LeRobot frames (``observation.state``) and proposes ``fn(state)``:
    [1, 6] degrees, or a chunk [1, H, 6] when ``horizon > 1``. Counts its calls; ``fn`` may return anything (a
    malformed chunk) or raise."""

    type_name, config_class = "test_scripted", dict

    def __init__(self, fn: Any, horizon: int = 1, executed_steps: int | None = None, action_dim: int = 6) -> None:
        super().__init__()
        self.fn = fn
        self._h, self._e = horizon, executed_steps or horizon
        self.processor = Processor(Features(inputs={keys.OBS_STATE: [6]}, action_dim=action_dim))
        self.calls = 0
        self.dummy = nn.Parameter(torch.zeros(1))

    @property
    def horizon(self) -> int:
        return self._h

    @property
    def executed_steps(self) -> int:
        return self._e

    def act(self, obs: dict[str, Any], deterministic: bool = True) -> torch.Tensor:
        self.calls += 1
        return self.fn(obs[keys.OBS_STATE].clone(), self.calls)

    def reset(self, env_ids: Any = None) -> None:
        pass

    @property
    def device(self) -> torch.device:
        return self.dummy.device


class ScriptedTeleop:
    """A teleoperator double: ``get_action`` gives ``fn(tick)`` (robot units dict) or raises what ``fn`` raises."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.calls = fn, 0

    def get_action(self) -> dict[str, float]:
        self.calls += 1
        return self.fn(self.calls)


def goal_units(bus: Any, raw: dict[int, int], use_degrees: bool = True) -> np.ndarray:
    """The robot units a raw Goal_Position write stands for (LeRobot's ``_normalize`` of those ticks)."""
    ids = {m.id: name for name, m in bus.motors.items()}
    norm = bus._normalize(dict(raw))
    return np.array([norm[i] for i in sorted(ids)])
