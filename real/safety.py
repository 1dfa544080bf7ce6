"""Every safety limit of a real arm, in one place (DESIGN.md §6, RELIABILITY.md A1-A5, A7-A10, A13; the end-effector
space bounds of A11 live in ``real/ee_bounds.py``, they need our MuJoCo model for IK, and are re-exported here as
``real.safety.EEBounds`` / ``EEBoundsConfig``, imported on first use).

Units are LeRobot's, per joint, as the robot reports them: an SO-101 follower with ``use_degrees=True`` speaks
degrees for the five body joints and 0..100 for the gripper (``MotorNormMode.RANGE_0_100``); ``so101_sim`` speaks
degrees for all six. Every command to a robot goes through ``SafetyFilter.command``:

    limits = limits_from_robot(robot, margin_deg=2.0)           # calibration range minus the margin
    safety = SafetyFilter(SafetyConfig(), limits)
    cmd = safety.command(proposal, present)                       # proposal: LeRobot action dict / array [6]
    sent = robot.send_action(safety.as_action(cmd.values))        # what is recorded as the dataset's action

What the filter does, per tick, in this order:

1. validates the proposal (a dict with exactly the robot's joint names and real numbers; or an array [6] / [1, 6];
   a chunk [H, 6] / [1, H, 6] of the expected horizon): NaN, inf, a missing or extra key, a wrong dtype, shape or
   horizon -> the frame is **rejected**: the command holds the present position, ``rejects`` +1, a warning names the
   reason; ``max_consecutive_rejects`` in a row -> ``SafeStop``;
2. clamps to the present position ± the per-tick cap (``max_relative_target``: 5 deg body, 10 units gripper); on
   the first tick after torque-enable the cap is ``first_tick_tol`` (1 deg): the arm holds where it is;
3. clamps to the joint limits (calibration range minus ``margin_deg``, computed in raw ticks so that LeRobot's own
   rounding in ``_unnormalize`` cannot carry a command past them: DEGREES mode does not clamp at all,
   ``motors_bus.py:_unnormalize``).

Torque goes off through ``torque_off_all`` (every motor tried, failures named, a short per-packet timeout: bounded
time) on every exit path of a ``SafetyGuard`` (an exception, Ctrl-C, SIGTERM, a lost teleoperator, the watchdog,
the thermal supervisor), which callers open *inside* any dataset context so that torque is off before the dataset is
finalised. On a follower arm the guard's ``ThermalSupervisor`` reads every motor's temperature and status twice a
second: a warning at 55 degC, a safe stop at 60 degC or on an overload / over-current / over-temperature status bit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np

log = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    """``EEBounds`` and ``EEBoundsConfig`` from ``real.ee_bounds`` (loaded lazily: it builds the MuJoCo model)."""
    if name in ("EEBounds", "EEBoundsConfig", "EEBoundsConfigError"):
        from real import ee_bounds

        return getattr(ee_bounds, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

STS3215_RESOLUTION = 4096  # ticks per turn
MAX_TICK = STS3215_RESOLUTION - 1
HOMING_OFFSET_MAX = 2047  # Homing_Offset is sign-magnitude with the sign at bit 11


# ------------------------------------------------------------------------------------------------- errors
class SafetyConfigError(ValueError):
    """A configuration that cannot run safely (no per-step cap, a policy of the wrong action size, ...)."""


class CalibrationError(SafetyConfigError):
    """A missing, malformed or mismatched calibration: nothing is written to the motors."""


class DeviceSetupError(SafetyConfigError):
    """A port, camera or device that cannot be opened; nothing has moved."""


class SafeStop(RuntimeError):
    """The control loop stopped for safety and its guard sent torque-off (``torque_off_note`` says whether every motor
    took it). ``reason`` says why."""

    exit_code = 5

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WatchdogTrip(SafeStop):
    """The control loop stalled past the watchdog's deadline."""


class BusLost(SafeStop):
    """The motor bus stopped answering (consecutive failures) or its error rate stayed too high."""


class TeleopLost(SafeStop):
    """The teleoperator disconnected during a take-over: hold, then torque off; never back to the policy."""


class Overheat(SafeStop):
    """A motor reached ``temperature_stop_c`` or reported an overload / over-temperature / over-current status."""


class Terminated(SafeStop):
    """SIGTERM."""

    exit_code = 143


# ------------------------------------------------------------------------------------------------- config
@dataclass
class SafetyConfig:
    """The limits of ``robot-rl deploy`` / ``record`` (``safety.*``). A missing cap is refused, never defaulted away.

    Joint units: see the module docstring (degrees for the body joints; the gripper in the robot's own units).
    """

    margin_deg: float = 2.0  # deg kept free inside each joint's calibrated range (2 deg = 23 STS3215 ticks)
    max_relative_target: float | None = 5.0  # deg per tick, body joints: |goal - present| <= this
    max_relative_target_gripper: float | None = 10.0  # gripper units per tick (0..100 real, degrees in so101_sim)
    first_tick_tol: float = 1.0  # deg (units for the gripper): the first command after torque-enable stays this close
    max_consecutive_rejects: int = 3  # malformed actions in a row before a safe stop
    watchdog_s: float = 0.15  # s without a completed tick before the watchdog turns torque off (30 Hz tick: 33 ms)
    torque_off_packet_ms: int = 10  # per-motor packet timeout while turning torque off (6 motors: <= 60 ms)
    read_retries: int = 2  # immediate extra attempts of a failed state read (each one counted in ``retries``)
    max_consecutive_read_failures: int = 3  # ticks in a row without a state read before ``BusLost``
    error_window_s: float = 1.0  # s of read attempts over which the error rate is measured
    max_error_rate: float = 0.05  # failed / all read attempts in the window above which the loop stops
    # read attempts the window holds at least (it reaches further back than error_window_s to get them): at 30 Hz, 1 s
    # is 30 reads, too few to tell 1% from 5% (a false stop would be likely within minutes); 200 reads tell them apart
    min_window_reads: int = 200
    # Thermal / overload supervisor (A8, a follower arm's bus only): Present_Temperature, Status and Present_Current of
    # every motor are read every thermal_poll_s (0.5 s, i.e. at least 1 Hz with room for a late tick, so a status
    # fault stops the arm within 1 s of showing); None: off (never on hardware)
    thermal_poll_s: float | None = 0.5
    temperature_warn_c: float = 55.0  # degC: a warning (once per motor) at or above this
    temperature_stop_c: float = 60.0  # degC: safe stop + torque off at or above this (STS3215 Max_Temperature_Limit 70)
    # Status register bits that stop the arm (STS3215 "Status", address 65: bit 0 voltage, 1 angle sensor,
    # 2 temperature, 3 current, 5 overload); default: temperature | current | overload
    status_stop_mask: int = 0b101100

    def __post_init__(self) -> None:
        for name in ("max_relative_target", "max_relative_target_gripper"):
            v = getattr(self, name)
            if v is None:
                raise SafetyConfigError(f"safety.{name} is required on a robot (a per-tick change cap; "
                                        "LeRobot's default of None lets any jump through)")
            if not (math.isfinite(v) and v > 0):
                raise SafetyConfigError(f"safety.{name} must be a finite number > 0, got {v}")
        checks = {"margin_deg": self.margin_deg >= 0, "first_tick_tol": self.first_tick_tol > 0,
                  "max_consecutive_rejects": self.max_consecutive_rejects >= 1, "watchdog_s": self.watchdog_s > 0,
                  "torque_off_packet_ms": self.torque_off_packet_ms >= 1, "read_retries": self.read_retries >= 0,
                  "max_consecutive_read_failures": self.max_consecutive_read_failures >= 1,
                  "error_window_s": self.error_window_s > 0, "max_error_rate": 0 < self.max_error_rate <= 1,
                  "thermal_poll_s": self.thermal_poll_s is None or self.thermal_poll_s > 0,
                  "temperature_stop_c": self.temperature_warn_c <= self.temperature_stop_c,
                  "status_stop_mask": 0 <= self.status_stop_mask <= 255}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise SafetyConfigError(f"safety: out of range: {', '.join(f'{k}={getattr(self, k)}' for k in bad)}")


# ------------------------------------------------------------------------------------------------- limits
@dataclass(frozen=True)
class JointLimits:
    """Per-joint command bounds and caps in the robot's units, joints in the robot's action order.

    ``names``: LeRobot action keys ("shoulder_pan.pos", ...); ``low``/``high`` float64 [A]; ``units_per_deg``
    float64 [A]: how many of the joint's units make a degree (1 for degrees), to turn the degree caps into units.
    ``gripper``: bool [A], the joints capped by ``max_relative_target_gripper`` (in their own units).
    """

    names: tuple[str, ...]
    low: np.ndarray
    high: np.ndarray
    units_per_deg: np.ndarray
    gripper: np.ndarray

    def __post_init__(self) -> None:
        a = len(self.names)
        for k in ("low", "high", "units_per_deg", "gripper"):
            if np.shape(getattr(self, k)) != (a,):
                raise SafetyConfigError(f"JointLimits.{k} must have shape [{a}], got {np.shape(getattr(self, k))}")
        if not (np.isfinite(self.low).all() and np.isfinite(self.high).all() and (self.low < self.high).all()):
            raise SafetyConfigError(f"joint limits must be finite with low < high: {self.describe()}")

    def describe(self) -> str:
        return ", ".join(f"{n}: [{lo:.2f}, {hi:.2f}]" for n, lo, hi in zip(self.names, self.low, self.high, strict=True))


def _tick_bounds(cal: Any, margin_deg: float) -> tuple[int, int]:
    m = math.ceil(margin_deg * MAX_TICK / 360.0 - 1e-9)
    lo, hi = int(cal.range_min) + m, int(cal.range_max) - m
    if lo >= hi:
        raise CalibrationError(f"motor id {cal.id}: range [{cal.range_min}, {cal.range_max}] leaves nothing inside a "
                               f"{margin_deg} deg margin")
    return lo, hi


def limits_from_calibration(calibration: Mapping[str, Any], norm_modes: Mapping[str, Any], margin_deg: float,
                            gripper: str = "gripper") -> JointLimits:
    """Limits in LeRobot's units from a motor calibration (``MotorCalibration`` per motor name).

    Bounds are ``[range_min + m, range_max - m]`` ticks with ``m = ceil(margin_deg * 4095 / 360)`` (23 at 2 deg),
    turned into units the way ``MotorsBus._unnormalize`` turns them back (``int()`` of a positive float floors), with
    a quarter tick of slack: a command within the bounds lands on a tick within them.
    """
    names, low, high, upd, grip = [], [], [], [], []
    for motor, cal in calibration.items():
        mode = str(getattr(norm_modes[motor], "value", norm_modes[motor]))
        lo_t, hi_t = _tick_bounds(cal, margin_deg)
        mn, mx = int(cal.range_min), int(cal.range_max)
        k = MAX_TICK / 360.0  # ticks per degree
        if mode == "degrees":  # raw = int(v * k + mid)
            mid = (mn + mx) / 2
            lo, hi, per_deg = (lo_t + 0.25 - mid) / k, (hi_t + 0.25 - mid) / k, 1.0
        elif mode == "range_0_100":  # raw = int(v' / 100 * (max - min) + min), v' = 100 - v with drive_mode
            s = (mx - mn) / 100.0
            lo, hi, per_deg = (lo_t + 0.25 - mn) / s, (hi_t + 0.25 - mn) / s, k / s
            if cal.drive_mode:
                lo, hi = 100.0 - hi, 100.0 - lo
        elif mode == "range_m100_100":  # raw = int((v' + 100) / 200 * (max - min) + min), v' = -v with drive_mode
            s = (mx - mn) / 200.0
            lo, hi, per_deg = (lo_t + 0.25 - mn) / s - 100.0, (hi_t + 0.25 - mn) / s - 100.0, k / s
            if cal.drive_mode:
                lo, hi = -hi, -lo
        else:
            raise CalibrationError(f"motor {motor!r}: normalisation mode {mode!r} is not supported")
        names.append(f"{motor}.pos")
        low.append(lo)
        high.append(hi)
        upd.append(per_deg)
        grip.append(motor == gripper)
    return JointLimits(tuple(names), np.array(low), np.array(high), np.array(upd), np.array(grip))


def limits_from_degrees(names: Sequence[str], low_deg: Sequence[float], high_deg: Sequence[float],
                        margin_deg: float, gripper_index: int | None = None) -> JointLimits:
    """Limits of a robot that speaks degrees on every joint (``so101_sim``): ``[low + margin, high - margin]``."""
    lo, hi = np.asarray(low_deg, float) + margin_deg, np.asarray(high_deg, float) - margin_deg
    grip = np.zeros(len(names), bool)
    if gripper_index is not None:
        grip[gripper_index] = True
    return JointLimits(tuple(names), lo, hi, np.ones(len(names)), grip)


def limits_from_robot(robot: Any, margin_deg: float) -> JointLimits:
    """The limits of a LeRobot ``Robot``: from its bus calibration (a follower arm), else from its own
    ``joint_limits_deg()`` -> {action key: (low, high)} (a robot in degrees), else from our SO-101 model
    (``limits_from_sim_model``: so101_sim)."""
    bus = getattr(robot, "bus", None)
    if bus is not None and getattr(bus, "calibration", None):
        check_calibration(bus.calibration, {m: mo.id for m, mo in bus.motors.items()})
        return limits_from_calibration(bus.calibration, {m: mo.norm_mode for m, mo in bus.motors.items()}, margin_deg)
    names = list(robot.action_features)
    if hasattr(robot, "joint_limits_deg"):
        lim = robot.joint_limits_deg()
        missing = [n for n in names if n not in lim]
        if missing:
            raise SafetyConfigError(f"{type(robot).__name__}.joint_limits_deg() lacks {missing}")
        return limits_from_degrees(names, [lim[n][0] for n in names], [lim[n][1] for n in names], margin_deg,
                                   names.index("gripper.pos") if "gripper.pos" in names else None)
    return limits_from_sim_model(names, margin_deg)


def limits_from_sim_model(names: Sequence[str], margin_deg: float) -> JointLimits:
    """The limits of our simulated SO-101 (``so101_sim``: body degrees, gripper 0..100): the model's target range
    (``SO101Arm.low/high``, within the joint and actuator ranges) minus the margin; the gripper's 0..100 minus the
    margin in its units (``real.features.sim_gripper_range``)."""
    import mujoco
    import torch

    from real import features
    from sim import so101

    if list(names) != list(features.POS_FEATURES):
        raise CalibrationError(f"a robot without calibration and with action keys {list(names)} (not the SO-101's "
                               f"{list(features.POS_FEATURES)}): no joint limits to enforce")
    model = mujoco.MjModel.from_xml_path(str(so101.SCENE_XML))
    arm = so101.SO101Arm(model, torch.device("cpu"), 1.0, 1.0)
    low = so101.rad_to_deg(arm.low.double()).numpy() + margin_deg
    high = so101.rad_to_deg(arm.high.double()).numpy() - margin_deg
    g = features.sim_gripper_range()
    per_deg = 100.0 / (g.high_deg - g.low_deg)
    i = features.GRIPPER_INDEX
    low[i], high[i] = margin_deg * per_deg, 100.0 - margin_deg * per_deg
    upd = np.ones(len(names))
    upd[i] = per_deg
    grip = np.zeros(len(names), bool)
    grip[i] = True
    return JointLimits(tuple(names), low, high, upd, grip)


def check_calibration(calibration: Any, motor_ids: Mapping[str, int]) -> None:
    """Refuse a calibration that would move a motor somewhere unintended (RELIABILITY A10): not one entry per motor,
    a wrong id, a range outside 0..4095 or with min >= max, a homing offset beyond sign-magnitude 11 bits, a drive
    mode other than 0/1. Raises ``CalibrationError`` naming the motor and field."""
    if not isinstance(calibration, Mapping):
        raise CalibrationError(f"calibration must map motor names to calibrations, got {type(calibration).__name__}")
    missing, extra = sorted(set(motor_ids) - set(calibration)), sorted(set(calibration) - set(motor_ids))
    if missing or extra:
        raise CalibrationError(f"calibration motors differ from the robot's: missing {missing}, unexpected {extra}")
    for motor, cal in calibration.items():
        try:
            vals = {k: getattr(cal, k) for k in ("id", "drive_mode", "homing_offset", "range_min", "range_max")}
        except AttributeError as e:
            raise CalibrationError(f"motor {motor!r}: {e}") from None
        for k, v in vals.items():
            if isinstance(v, bool) or not isinstance(v, int | np.integer):
                raise CalibrationError(f"motor {motor!r}: {k} must be an integer, got {v!r}")
        if vals["id"] != motor_ids[motor]:
            raise CalibrationError(f"motor {motor!r}: id {vals['id']} but the robot's motor has id {motor_ids[motor]}")
        if not 0 <= vals["range_min"] < vals["range_max"] <= MAX_TICK:
            raise CalibrationError(f"motor {motor!r}: range [{vals['range_min']}, {vals['range_max']}] must satisfy "
                                   f"0 <= range_min < range_max <= {MAX_TICK}")
        if abs(vals["homing_offset"]) > HOMING_OFFSET_MAX:
            raise CalibrationError(f"motor {motor!r}: homing_offset {vals['homing_offset']} overflows "
                                   f"+-{HOMING_OFFSET_MAX}")
        if vals["drive_mode"] not in (0, 1):
            raise CalibrationError(f"motor {motor!r}: drive_mode {vals['drive_mode']} must be 0 or 1")


def load_calibration_file(path: str | Path, motor_ids: Mapping[str, int]) -> dict[str, Any]:
    """Read and check a LeRobot calibration JSON (``{motor: {id, drive_mode, homing_offset, range_min, range_max}}``)
    without touching any device. Raises ``CalibrationError`` naming the file and what is wrong."""
    from lerobot.motors import MotorCalibration

    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"no calibration file at {path}: calibrate the arm first "
                               "(lerobot-calibrate --robot.type=so101_follower --robot.port=... --robot.id=...)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CalibrationError(f"{path}: not a JSON calibration ({type(e).__name__}: {str(e)[:100]})") from None
    if not isinstance(raw, dict):
        raise CalibrationError(f"{path}: holds a JSON {type(raw).__name__}, not an object of motors")
    fields = ("id", "drive_mode", "homing_offset", "range_min", "range_max")
    cal = {}
    for motor, entry in raw.items():
        if not isinstance(entry, dict) or sorted(entry) != sorted(fields):
            raise CalibrationError(f"{path}: motor {motor!r} must hold exactly {list(fields)}, got {entry!r:.120}")
        cal[motor] = MotorCalibration(**entry)
    try:
        check_calibration(cal, motor_ids)
    except CalibrationError as e:
        raise CalibrationError(f"{path}: {e}") from None
    return cal


# ------------------------------------------------------------------------------------------------- filter
class ActionRejected(ValueError):
    """A malformed action or chunk (the reason says which key / value / shape)."""


@dataclass(frozen=True)
class SafeCommand:
    """What the filter let through this tick: ``values`` float64 [A] in the robot's units, and why."""

    values: np.ndarray
    rejected: bool = False
    clipped: bool = False
    reason: str | None = None


def _number(key: str, v: Any) -> float:
    import torch

    if isinstance(v, bool | np.bool_ | str | bytes):
        raise ActionRejected(f"{key}: {type(v).__name__} is not a number")
    if isinstance(v, torch.Tensor):
        if v.numel() != 1 or not (v.dtype.is_floating_point or v.dtype in (torch.int32, torch.int64)):
            raise ActionRejected(f"{key}: tensor {v.dtype} {list(v.shape)} is not one real number")
        v = v.item()
    elif isinstance(v, np.ndarray):
        if v.size != 1 or v.dtype.kind not in "fiu":
            raise ActionRejected(f"{key}: array {v.dtype} {v.shape} is not one real number")
        v = v.item()
    if not isinstance(v, float | int | np.floating | np.integer):
        raise ActionRejected(f"{key}: {type(v).__name__} is not a number")
    x = float(v)
    if not math.isfinite(x):
        raise ActionRejected(f"{key}: {x} is not finite")
    return x


def _array(x: Any, what: str) -> np.ndarray:
    import torch

    if isinstance(x, torch.Tensor):
        if not (x.dtype.is_floating_point or x.dtype in (torch.int32, torch.int64)):
            raise ActionRejected(f"{what}: dtype {x.dtype} is not real")
        return x.detach().cpu().double().numpy()
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "fiu":
            raise ActionRejected(f"{what}: dtype {x.dtype} is not real")
        return x.astype(np.float64)
    raise ActionRejected(f"{what}: {type(x).__name__} is neither a dict of joints, a tensor nor an array")


class SafetyFilter:
    """Validates, caps and clamps every command (see the module docstring).

    Args:
        cfg: the limits' configuration.
        limits: joint bounds in the robot's units, in its action order.

    Attributes:
        rejects: malformed frames so far; ``clips``: commands that were changed by the cap or the limits.
    """

    def __init__(self, cfg: SafetyConfig, limits: JointLimits) -> None:
        self.cfg, self.limits = cfg, limits
        self.names = limits.names
        self.cap = np.where(limits.gripper, float(cfg.max_relative_target_gripper),
                            float(cfg.max_relative_target) * limits.units_per_deg)
        self.first_cap = np.minimum(self.cap, np.where(limits.gripper, cfg.first_tick_tol,
                                                       cfg.first_tick_tol * limits.units_per_deg))
        self.rejects = self.consecutive_rejects = self.clips = 0
        self._first_tick = True  # torque was enabled (connect) and nothing has been commanded since

    @property
    def action_dim(self) -> int:
        return len(self.names)

    def check_policy(self, action_dim: int, horizon: int | None = None, names: Sequence[str] | None = None) -> None:
        """At startup: a policy whose actions do not fit the robot is a hard error, never a silent zero-fill (A13)."""
        if action_dim != self.action_dim:
            raise SafetyConfigError(f"the policy outputs {action_dim} action values, the robot takes {self.action_dim} "
                                    f"({list(self.names)})")
        if horizon is not None and horizon < 1:
            raise SafetyConfigError(f"the policy's horizon must be >= 1, got {horizon}")
        if names is not None and list(names) != list(self.names):
            raise SafetyConfigError(f"the policy's action names {list(names)} differ from the robot's {list(self.names)}")

    def on_torque_enabled(self) -> None:
        """The next command may move at most ``first_tick_tol`` from the present position (A3)."""
        self._first_tick = True

    # ---------------------------------------------------------------------------------------- validation
    def parse(self, action: Any) -> np.ndarray:
        """float64 [A] of a LeRobot action dict (exactly the robot's keys), or an array / tensor [A] or [1, A].
        Raises ``ActionRejected``."""
        if isinstance(action, Mapping):
            keys = set(action)
            missing = [n for n in self.names if n not in keys]
            extra = sorted(str(k) for k in keys - set(self.names))
            if missing or extra:
                raise ActionRejected(f"action keys: missing {missing}, unexpected {extra[:5]}")
            return np.array([_number(n, action[n]) for n in self.names])
        a = _array(action, "action")
        if a.shape not in ((self.action_dim,), (1, self.action_dim)):
            raise ActionRejected(f"action has shape {list(a.shape)}, expected [{self.action_dim}] or "
                                 f"[1, {self.action_dim}]")
        a = a.reshape(self.action_dim)
        if not np.isfinite(a).all():
            raise ActionRejected(f"action holds NaN/inf at {[self.names[i] for i in np.flatnonzero(~np.isfinite(a))]}")
        return a

    def parse_chunk(self, chunk: Any, horizon: int) -> np.ndarray:
        """float64 [H, A] of a chunk [H, A] or [1, H, A] of exactly ``horizon`` steps, all finite (A13)."""
        c = _array(chunk, "action chunk")
        want = (horizon, self.action_dim)
        if c.shape not in (want, (1, *want)):
            raise ActionRejected(f"action chunk has shape {list(c.shape)}, expected {list(want)} or [1, {horizon}, "
                                 f"{self.action_dim}]")
        c = c.reshape(want)
        if not np.isfinite(c).all():
            raise ActionRejected(f"action chunk holds NaN/inf at steps {sorted({int(t) for t in np.nonzero(~np.isfinite(c))[0]})}")
        return c

    # ---------------------------------------------------------------------------------------- commands
    def clamp(self, target: np.ndarray, present: np.ndarray) -> np.ndarray:
        """float64 [A]: ``target`` within present ± cap, then within the joint limits (the limits win when the
        present position lies outside them: a calibrated arm starts within its range, at most the margin out)."""
        cap = self.first_cap if self._first_tick else self.cap
        return np.clip(np.clip(target, present - cap, present + cap), self.limits.low, self.limits.high)

    def command(self, proposal: Any, present: Any, chunk_horizon: int | None = None) -> SafeCommand:
        """The command for this tick from a proposal (see ``parse``; a chunk with ``chunk_horizon``: its first
        step) and the present position float [A] (robot units). A rejected proposal holds the present position."""
        now = self._present(present)
        try:
            target = self.parse_chunk(proposal, chunk_horizon)[0] if chunk_horizon else self.parse(proposal)
        except ActionRejected as e:
            return self.reject(now, str(e))
        self.consecutive_rejects = 0
        out = self.clamp(target, now)
        self._first_tick = False
        clipped = not np.array_equal(out, target)
        self.clips += int(clipped)
        return SafeCommand(out, clipped=clipped)

    def reject(self, present: Any, reason: str) -> SafeCommand:
        """Hold the present position for a malformed frame; count it; stop after too many in a row."""
        now = self._present(present)
        self.rejects += 1
        self.consecutive_rejects += 1
        # every reject is counted; the log names the first ten, then one in a hundred (a policy emitting garbage
        # at 30 Hz would otherwise flood it, and a formatted record costs ~0.3 ms)
        if self.rejects <= 10 or self.rejects % 100 == 0:
            log.warning("safety: rejected a malformed action (%s); holding position (%d rejected so far)", reason,
                        self.rejects)
        if self.consecutive_rejects >= self.cfg.max_consecutive_rejects:
            raise SafeStop(f"{self.consecutive_rejects} malformed actions in a row (last: {reason})")
        return SafeCommand(self.hold(now), rejected=True, reason=reason)

    def hold(self, present: Any) -> np.ndarray:
        """float64 [A]: the present position, within the limits (and the cap)."""
        now = self._present(present)
        out = self.clamp(now, now)
        self._first_tick = False
        return out

    def as_action(self, values: np.ndarray) -> dict[str, float]:
        """LeRobot's action dict of float64 [A] values."""
        return {n: float(v) for n, v in zip(self.names, values, strict=True)}

    def _present(self, present: Any) -> np.ndarray:
        if isinstance(present, Mapping):
            p = np.array([float(present.get(n, math.nan)) for n in self.names])
        else:
            p = np.asarray(present if isinstance(present, np.ndarray) else _array(present, "present position"),
                           np.float64).reshape(-1)
        if p.shape != (self.action_dim,) or not np.isfinite(p).all():
            raise SafeStop(f"the present position is unusable: {p.tolist()} (expected {self.action_dim} finite values)")
        return p


# ------------------------------------------------------------------------------------------------- read errors
class ReadMonitor:
    """Counts state-read attempts and failures; stops the loop when the bus is lost (``max_consecutive_read_failures``
    ticks in a row) or its error rate over the window (``error_window_s``, at least ``min_window_reads`` attempts)
    exceeds ``max_error_rate`` (A6, A7)."""

    def __init__(self, cfg: SafetyConfig) -> None:
        self.cfg = cfg
        self.retries = self.failures = self.reads = self.failed_ticks = 0
        self._window: deque[tuple[float, bool]] = deque()
        self._fails_in_window = 0

    def attempt(self, ok: bool) -> None:
        now = time.monotonic()
        self.reads += 1
        self.failures += int(not ok)
        self._window.append((now, not ok))
        self._fails_in_window += int(not ok)
        while len(self._window) > self.cfg.min_window_reads and now - self._window[0][0] > self.cfg.error_window_s:
            self._fails_in_window -= int(self._window.popleft()[1])
        n = len(self._window)
        if n >= self.cfg.min_window_reads and self._fails_in_window / n > self.cfg.max_error_rate:
            raise BusLost(f"bus error rate {self._fails_in_window}/{n} reads over {self.cfg.error_window_s} s exceeds "
                          f"{self.cfg.max_error_rate:.0%}")

    def tick(self, ok: bool, error: BaseException | None = None) -> None:
        self.failed_ticks = 0 if ok else self.failed_ticks + 1
        if self.failed_ticks >= self.cfg.max_consecutive_read_failures:
            raise BusLost(f"no state read for {self.failed_ticks} ticks in a row (last error: {error})")


# ------------------------------------------------------------------------------------------------- torque off
@dataclass
class TorqueOffReport:
    """Result of ``torque_off_all``: the motors disabled, those that failed (name -> error) and the time it took."""

    disabled: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def describe(self) -> str:
        bad = "; ".join(f"{m}: {e}" for m, e in self.failed.items())
        return (f"torque off on {len(self.disabled)} motors in {self.seconds * 1e3:.1f} ms"
                + (f"; FAILED on {list(self.failed)} ({bad})" if self.failed else ""))


def torque_off_all(robot: Any, packet_ms: int = 10) -> TorqueOffReport:
    """Disable torque on every motor, best effort, in bounded time (A5): each motor gets one ``Torque_Enable = 0``
    write with a ``packet_ms`` packet timeout and no retries; a failing motor is named and the others are still tried
    (LeRobot's ``disable_torque`` stops at the first failure). A robot without a motor bus is asked through its own
    ``disable_torque()`` if it has one (a simulated arm without one has no torque: only the commands stop)."""
    t0 = time.perf_counter()
    report = TorqueOffReport()
    bus = getattr(robot, "bus", None)
    if bus is not None and hasattr(bus, "motors") and hasattr(bus, "write"):
        port = getattr(bus, "port_handler", None)
        try:
            if port is not None:
                port.is_using = False  # an interrupted transaction would block every later one
                port.clearPort()
                port.setPacketTimeoutMillis(packet_ms)
        except Exception as e:  # noqa: BLE001 - go on: the writes below report per motor
            log.debug("torque off: preparing the port failed: %s", e)
        for motor in bus.motors:
            try:
                bus.write("Torque_Enable", motor, 0, num_retry=0)
                report.disabled.append(motor)
            except Exception as e:  # noqa: BLE001 - every motor is tried, whatever one raised
                report.failed[motor] = f"{type(e).__name__}: {str(e).strip()[:120]}"
    else:  # no motor bus: the robot's own disable_torque(); a simulated arm without one has no torque to cut (the
        # guard stops sending commands; it is disconnected later, from the thread that owns it)
        name = type(robot).__name__
        try:
            if hasattr(robot, "disable_torque"):
                robot.disable_torque()
            report.disabled.append(name)
        except Exception as e:  # noqa: BLE001
            report.failed[name] = f"{type(e).__name__}: {str(e)[:120]}"
    report.seconds = time.perf_counter() - t0
    (log.error if report.failed else log.info)("safety: %s", report.describe())
    return report


def torque_off_note(exc: BaseException) -> str:
    """How torque stands after ``exc`` left a ``SafetyGuard``, in words for the operator: turned off (on how many
    motors), or FAILED on named motors (the servos hold torque until power is cut: the e-stop), or unconfirmed when
    no guard saw the exception (it was raised before the loop's guard opened or after it closed)."""
    report = getattr(exc, "torque_off_report", None)
    if report is None:
        return "torque-off not confirmed (the error came outside the safety guard)"
    if report.failed:
        return (f"TORQUE-OFF FAILED on {sorted(report.failed)}: those servos may still hold torque until their power "
                f"is cut (use the e-stop)")
    return f"torque was turned off ({len(report.disabled)} disabled in {report.seconds * 1e3:.0f} ms)"


# ------------------------------------------------------------------------------------------------- watchdog
class Watchdog:
    """A thread that calls ``on_trip`` once if ``kick`` is not called for ``deadline_s`` (a stalled control loop,
    A9). ``paused()`` suspends it around long planned work (writing an episode while the arm holds)."""

    def __init__(self, deadline_s: float, on_trip: Callable[[float], None]) -> None:
        self.deadline_s, self.on_trip = deadline_s, on_trip
        self.tripped_after: float | None = None  # seconds the loop had been silent when it tripped
        self._last = time.monotonic()
        self._paused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="robot-rl-watchdog", daemon=True)

    @property
    def started(self) -> bool:
        return self._thread.is_alive() or self._stop.is_set()

    def start(self) -> Watchdog:
        self._last = time.monotonic()
        self._thread.start()
        return self

    def kick(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=1.0)

    class _Pause:
        def __init__(self, dog: Watchdog) -> None:
            self.dog = dog

        def __enter__(self) -> None:
            self.dog._paused += 1

        def __exit__(self, *exc: object) -> None:
            self.dog._paused -= 1
            self.dog.kick()

    def paused(self) -> Watchdog._Pause:
        return Watchdog._Pause(self)

    def _run(self) -> None:
        period = min(0.01, self.deadline_s / 5)
        while not self._stop.wait(period):
            silent = time.monotonic() - self._last
            if not self._paused and silent > self.deadline_s:
                self.tripped_after = silent
                try:
                    self.on_trip(silent)
                except Exception:
                    log.exception("watchdog: torque off failed")
                return


# ------------------------------------------------------------------------------------------------- thermal
class ThermalSupervisor:
    """A8: every ``cfg.thermal_poll_s`` reads ``Present_Temperature`` (degC), ``Status`` (bit flags) and
    ``Present_Current`` (raw) of every motor of a follower's bus; a warning (once per motor) at
    ``temperature_warn_c``, ``Overheat`` at ``temperature_stop_c`` or when a ``status_stop_mask`` bit is set.

    ``poll`` is called from the control loop (``SafetyGuard.tick``, under the guard's bus lock); a read that fails is
    logged and tried again at the next poll (a dead bus is the state reads' business: ``ReadMonitor``).

    Attributes:
        temperatures, status, current: motor name -> the last value read.
        warned: motor names warned about; polls: completed polls; failures: failed polls.
    """

    def __init__(self, bus: Any, cfg: SafetyConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.bus, self.cfg, self.clock = bus, cfg, clock
        self.temperatures: dict[str, int] = {}
        self.status: dict[str, int] = {}
        self.current: dict[str, int] = {}
        self.warned: set[str] = set()
        self.polls = self.failures = 0
        self._next = -math.inf

    def poll(self) -> None:
        """Read the registers if ``thermal_poll_s`` has passed since the last poll; raise ``Overheat`` on a limit."""
        now = self.clock()
        if now < self._next:
            return
        self._next = now + float(self.cfg.thermal_poll_s or math.inf)
        try:
            temps = self.bus.sync_read("Present_Temperature", normalize=False, num_retry=0)
            status = self.bus.sync_read("Status", normalize=False, num_retry=0)
            current = self.bus.sync_read("Present_Current", normalize=False, num_retry=0)
        except Exception as e:  # noqa: BLE001 - a missed poll is retried next time
            self.failures += 1
            log.warning("thermal supervisor: reading temperature/status failed (%s: %s)", type(e).__name__, e)
            return
        self.polls += 1
        self.temperatures, self.status, self.current = dict(temps), dict(status), dict(current)
        hot = {m: t for m, t in temps.items() if t >= self.cfg.temperature_stop_c}
        flagged = {m: s for m, s in status.items() if s & self.cfg.status_stop_mask}
        if hot or flagged:
            parts = [f"{m} at {t} degC (stop at {self.cfg.temperature_stop_c:g})" for m, t in hot.items()]
            parts += [f"{m} status {s:#010b} (stop mask {self.cfg.status_stop_mask:#010b})" for m, s in flagged.items()]
            raise Overheat("; ".join(parts))
        for m, t in temps.items():
            if t >= self.cfg.temperature_warn_c and m not in self.warned:
                self.warned.add(m)
                log.warning("thermal supervisor: %s at %d degC (warning at %g, safe stop at %g)", m, t,
                            self.cfg.temperature_warn_c, self.cfg.temperature_stop_c)


# ------------------------------------------------------------------------------------------------- guard
class SafetyGuard:
    """Torque off on every way out of a control loop: open it *inside* any dataset context, so that

        with recorder:                       # finalised last
            with SafetyGuard(robot, cfg) as guard:
                while ...: guard.tick(); ...   # kicks the watchdog, raises WatchdogTrip if it fired

    turns torque off first on a normal end, an exception, Ctrl-C, SIGTERM (raised as ``Terminated`` in the main
    thread), a watchdog trip (from the watchdog's thread, at once; the loop then raises ``WatchdogTrip``) or the
    thermal supervisor (``ThermalSupervisor``, polled from ``tick`` on a robot with a motor bus: torque off, then
    ``Overheat``). ``report`` holds the last ``TorqueOffReport``; ``stopped`` is set once torque went off (send
    nothing after); ``thermal`` is the supervisor (None without a motor bus or with ``cfg.thermal_poll_s=None``).
    """

    def __init__(self, robot: Any, cfg: SafetyConfig, watchdog: bool = True,
                 on_torque_off: Callable[[TorqueOffReport], None] | None = None) -> None:
        self.robot, self.cfg = robot, cfg
        self.lock = threading.RLock()  # held around every bus transaction of the loop; the watchdog waits briefly
        self.report: TorqueOffReport | None = None
        self.stopped = threading.Event()
        self.on_torque_off = on_torque_off
        self._watchdog = Watchdog(cfg.watchdog_s, self._trip) if watchdog else None
        bus = getattr(robot, "bus", None)
        self.thermal = ThermalSupervisor(bus, cfg) if cfg.thermal_poll_s is not None and bus is not None \
            and hasattr(bus, "sync_read") else None
        self._old_sigterm: Any = None

    def torque_off(self) -> TorqueOffReport:
        """Turn torque off now (idempotent: a second call writes again, which is harmless and cheap)."""
        self.stopped.set()
        report = torque_off_all(self.robot, self.cfg.torque_off_packet_ms)
        self.report = report
        if self.on_torque_off is not None:
            self.on_torque_off(report)
        return report

    def _trip(self, silent: float) -> None:
        got = self.lock.acquire(timeout=0.02)  # a loop stuck inside a bus call still gets its torque off
        try:
            log.error("watchdog: control loop silent for %.0f ms (deadline %.0f ms): torque off", silent * 1e3,
                      self.cfg.watchdog_s * 1e3)
            self.torque_off()
        finally:
            if got:
                self.lock.release()

    def tick(self) -> None:
        """Once per control tick: raise ``WatchdogTrip`` if the watchdog fired, else kick it."""
        if self._watchdog is not None and self._watchdog.tripped_after is not None:
            raise WatchdogTrip(f"control loop stalled {self._watchdog.tripped_after * 1e3:.0f} ms (deadline "
                               f"{self.cfg.watchdog_s * 1e3:.0f} ms)")
        if self.stopped.is_set():
            raise SafeStop("torque is off; the loop cannot continue")
        if self._watchdog is not None:
            if not self._watchdog.started:
                self._watchdog.start()  # armed at the loop's first tick: setting up is not a stall
            self._watchdog.kick()
        if self.thermal is not None:
            try:
                with self.lock:
                    self.thermal.poll()
            except Overheat as e:
                log.error("thermal supervisor: %s: torque off", e.reason)
                self.torque_off()
                raise

    def paused(self) -> Any:
        """Context: suspend the watchdog around planned long work (the arm holds its last command)."""
        import contextlib

        return self._watchdog.paused() if self._watchdog is not None else contextlib.nullcontext()

    def __enter__(self) -> Self:
        def on_sigterm(signum: int, frame: Any) -> None:
            raise Terminated("SIGTERM")

        try:
            self._old_sigterm = signal.signal(signal.SIGTERM, on_sigterm)
        except ValueError:  # not the main thread
            self._old_sigterm = None
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        try:
            if self.report is None or exc_type is not None or not self.stopped.is_set():
                report = self.torque_off()
                if exc_type is not None:
                    log.error("safety: stopped by %s: %s; %s", exc_type.__name__, exc, report.describe())
            if exc is not None and self.report is not None:  # what the way out can tell the operator (torque_off_note)
                with contextlib.suppress(AttributeError):  # an exception type without a __dict__ carries no note
                    exc.torque_off_report = self.report  # type: ignore[union-attr]
        finally:
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)


__all__ = [
    "ActionRejected", "BusLost", "CalibrationError", "DeviceSetupError", "JointLimits", "Overheat", "ReadMonitor",
    "SafeCommand", "SafeStop", "SafetyConfig", "SafetyConfigError", "SafetyFilter", "SafetyGuard", "TeleopLost",
    "Terminated", "ThermalSupervisor", "TorqueOffReport", "Watchdog", "WatchdogTrip", "check_calibration",
    "limits_from_calibration", "limits_from_degrees", "limits_from_robot", "limits_from_sim_model",
    "load_calibration_file", "torque_off_all", "torque_off_note",
]
