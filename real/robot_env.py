"""A LeRobot ``Robot`` (an SO-101 follower, ``so101_sim``) as our ``VecEnv``: one env, no auto-reset, every command
through ``real.safety.SafetyFilter`` (DESIGN.md §3, §6).

    robot = make_robot(...)                               # a LeRobot Robot, not connected
    safety = SafetyFilter(SafetyConfig(), limits_from_robot(robot, 2.0))
    safe_connect(robot, safety)                           # no prompts; the arm holds where it is
    with SafetyGuard(robot, cfg) as guard:                # torque off on every way out
        env = RobotEnv(robot, safety, guard, cameras=("front", "wrist"), task="pick up the cube")
        frame, info = env.reset()
        frame, reward, terminated, truncated, info = env.step(targets_deg)   # [1, 6] degrees (or a chunk [1, H, 6])

Frames are our LeRobot convention (``policies.keys``): ``observation.state`` float32 [1, 6] degrees (the gripper
too: ``real.features`` maps the robot's 0..100 to degrees), ``observation.images.<cam>`` uint8 [1, 3, H, W], ``task``
list[str], and ``capture_time`` float32 [1] (when the read returned, s since the episode's first one). Actions are
absolute joint targets in degrees [1, 6] or a chunk [1, H, 6] (its first step is executed); a teleoperator's action
dict (robot units) is accepted too. ``info[keys.ACTION_COL]`` (= ``info[APPLIED_ACTION]``)
is the command the robot really received, in degrees: the clipped one, the one to record (A2). ``info[ACTOR]`` says
who chose it. The step paces itself with a ``ControlClock`` (30 Hz by default) and counts missed deadlines.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from policies import keys
from real import features
from real.safety import (
    CalibrationError,
    DeviceSetupError,
    ReadMonitor,
    SafeStop,
    SafetyFilter,
    SafetyGuard,
    check_calibration,
)
from robot_rl.env import EpisodeTracker, ObsSpec, VecEnv, actor_ids

log = logging.getLogger(__name__)

REJECTED = "rejected"  # info: bool, this step's proposal was malformed and the arm held position
STALE = "stale"  # info: bool, the state read failed this tick (nothing was sent)
CLOCK = "clock"  # info: the ControlClock's statistics


# ------------------------------------------------------------------------------------------------- clock
class ControlClock:
    """Paces a loop at ``fps`` and measures it: ``wait()`` at the end of each tick sleeps until the next deadline.

    ``work_s`` holds each tick's busy time (start to ``wait``), ``period_s`` each tick's full period; a tick whose
    work overran the period is a missed deadline (the next deadline is then counted from now, no catch-up burst).
    ``sleep=False`` measures without sleeping (tests that run faster than real time).
    """

    def __init__(self, fps: float = 30.0, sleep: bool = True, history: int = 100_000) -> None:
        if not fps > 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.period, self.sleep = 1.0 / fps, sleep
        self.work_s: deque[float] = deque(maxlen=history)
        self.period_s: deque[float] = deque(maxlen=history)
        self.missed = 0
        self._start: float | None = None
        self._deadline = 0.0

    def start(self) -> None:
        self._start = time.perf_counter()
        self._deadline = self._start + self.period

    def wait(self) -> None:
        now = time.perf_counter()
        if self._start is None:
            self.start()
            return
        self.work_s.append(now - self._start)
        if now > self._deadline:
            self.missed += 1
            self._deadline = now
        elif self.sleep:
            time.sleep(self._deadline - now)
        end = time.perf_counter()
        self.period_s.append(end - self._start)
        self._start = end
        self._deadline += self.period

    def stats(self) -> dict[str, float]:
        """p50 / p99 / max of the busy time and the period, ms; missed deadlines; ticks."""
        out: dict[str, float] = {"ticks": len(self.work_s), "missed": self.missed}
        for name, xs in (("work", self.work_s), ("period", self.period_s)):
            if xs:
                a = np.fromiter(xs, float) * 1e3
                out.update({f"{name}_p50_ms": float(np.percentile(a, 50)), f"{name}_p99_ms": float(np.percentile(a, 99)),
                            f"{name}_max_ms": float(a.max())})
        return out


# ------------------------------------------------------------------------------------------------- connect
def gripper_range_of(robot: Any) -> features.GripperRange:
    """The degree range the robot's gripper 0..100 spans: its own ``gripper_range`` (so101_sim), else its bus
    calibration (a follower arm)."""
    g = getattr(robot, "gripper_range", None)
    if isinstance(g, features.GripperRange):
        return g
    cal = getattr(getattr(robot, "bus", None), "calibration", None) or {}
    if features.MOTORS[features.GRIPPER_INDEX] not in cal:
        raise CalibrationError(f"{robot}: no gripper calibration to map its 0..100 range to degrees")
    c = cal[features.MOTORS[features.GRIPPER_INDEX]]
    return features.GripperRange.from_calibration(c.range_min, c.range_max)


# LeRobot's robot.name -> the --robot.type its CLI takes for our arm (the SO-100/101 follower class is named
# "so_follower", which lerobot-calibrate refuses)
CALIBRATE_TYPES = {"so_follower": "so101_follower"}


def calibrate_command(robot: Any) -> str:
    """The ``lerobot-calibrate`` command line for ``robot``: its CLI type, port and id."""
    port = getattr(getattr(robot, "bus", None), "port", None)
    return (f"lerobot-calibrate --robot.type={CALIBRATE_TYPES.get(robot.name, robot.name)}"
            + (f" --robot.port={port}" if port else "") + f" --robot.id={robot.id}")


def safe_connect(robot: Any, safety: SafetyFilter | None = None) -> None:
    """Connect without any prompt and without moving (A3, A10).

    A follower arm (a robot with a motor ``bus``): the calibration file must be present and valid, and equal to what
    the motors hold (else ``CalibrationError``: run ``lerobot-calibrate``; nothing is written); the port must open
    (else ``DeviceSetupError`` naming it); ``Goal_Position`` is set to the present position before torque comes on
    (a stale goal register would make the arm jump), then every camera is connected (a missing one is named), then
    LeRobot's ``configure()`` enables torque. ``LeRobot``'s own read retries are turned off: ``RobotEnv`` retries and
    counts them (A7). Any other robot: ``robot.connect(calibrate=False)``, its errors named.
    """
    bus = getattr(robot, "bus", None)
    if bus is None or not hasattr(bus, "sync_read"):
        try:
            robot.connect(calibrate=False)
        except Exception as e:
            raise DeviceSetupError(f"{robot}: cannot connect ({type(e).__name__}: {e})") from e
        if safety is not None:
            safety.on_torque_enabled()
        return
    if not getattr(robot, "calibration", None):
        raise CalibrationError(f"no calibration for robot id {robot.id!r} (looked for {robot.calibration_fpath}): "
                               f"calibrate first ({calibrate_command(robot)})")
    check_calibration(robot.calibration, {m: mo.id for m, mo in bus.motors.items()})
    if hasattr(robot, "config") and hasattr(robot.config, "num_read_retries"):
        robot.config.num_read_retries = 0
    try:
        bus.connect()
    except Exception as e:
        raise DeviceSetupError(f"robot.port={bus.port}: cannot open the motor bus ({type(e).__name__}: "
                               f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from e
    try:
        if not bus.is_calibrated:
            raise CalibrationError(f"the motors' calibration differs from {robot.calibration_fpath}: recalibrate "
                                   f"({calibrate_command(robot)})")
        present = bus.sync_read("Present_Position", normalize=False, num_retry=2)
        bus.sync_write("Goal_Position", present, normalize=False)  # the arm holds when torque comes on
        for name, cam in getattr(robot, "cameras", {}).items():
            try:
                cam.connect()
            except Exception as e:
                raise DeviceSetupError(f"camera {name!r} ({type(cam).__name__}): cannot open "
                                       f"({type(e).__name__}: {e})") from e
        robot.configure()  # LeRobot's: torque off, write the servo settings, torque on
    except BaseException:
        try:
            bus.disconnect(disable_torque=False)  # leave the motors as found: nothing moved
        except Exception:  # noqa: BLE001, S110
            pass
        raise
    if safety is not None:
        safety.on_torque_enabled()


def safe_disconnect(robot: Any) -> None:
    """Close the robot's connections after torque is off (no second torque-off attempt with retries)."""
    try:
        bus = getattr(robot, "bus", None)
        if bus is not None and hasattr(bus, "sync_read"):
            if bus.is_connected:
                bus.disconnect(disable_torque=False)
            for cam in getattr(robot, "cameras", {}).values():
                if getattr(cam, "is_connected", False):
                    cam.disconnect()
        elif getattr(robot, "is_connected", False):
            robot.disconnect()
    except Exception as e:  # noqa: BLE001 - closing must not hide why the loop ended
        log.warning("disconnecting %s: %s", robot, e)


# ------------------------------------------------------------------------------------------------- the env
@dataclass
class Observation:
    """One read of the robot: its raw dict, the present position in robot units float64 [6], whether it is stale,
    and when the read returned (``time.perf_counter``; a stale one keeps its read's time)."""

    raw: dict[str, Any]
    present: np.ndarray
    stale: bool = False
    time: float = 0.0


class RobotEnv(VecEnv):
    """The arm as a ``VecEnv`` with ``num_envs = 1`` and ``autoreset = False`` (module docstring).

    Args:
        robot: a connected LeRobot ``Robot`` (``safe_connect``) whose action keys are the SO-101's.
        safety: the robot's filter (its limits in robot units).
        guard: the ``SafetyGuard`` whose lock serialises bus access and whose watchdog the loop kicks; None: none.
        cameras: camera names read into ``observation.images.<cam>`` (robot observation keys).
        task: the language instruction put in every frame (None: the robot's own ``instruction`` at each reset, as
            ``so101_sim`` gives it).
        fps: control rate, Hz.
        max_episode_length: steps before ``truncated``.
        clock: the pacing clock (default: ``ControlClock(fps)``).
    """

    autoreset = False
    resumable = False

    def __init__(self, robot: Any, safety: SafetyFilter, guard: SafetyGuard | None = None,
                 cameras: Sequence[str] = (), task: str | None = None, fps: float = 30.0, max_episode_length: int = 900,
                 clock: ControlClock | None = None) -> None:
        if list(safety.names) != list(features.POS_FEATURES):
            raise DeviceSetupError(f"RobotEnv drives an SO-101: action keys {list(features.POS_FEATURES)}, the "
                                   f"robot's filter has {list(safety.names)}")
        feats = robot.observation_features
        missing = [c for c in cameras if c not in feats]
        if missing:
            raise DeviceSetupError(f"camera(s) {missing} are not among the robot's observations "
                                   f"{[k for k, v in feats.items() if isinstance(v, tuple)]}")
        self.robot, self.safety, self.guard = robot, safety, guard
        self.cameras, self.fixed_task = tuple(cameras), task
        self.task = task if task is not None else str(getattr(robot, "instruction", ""))
        self.num_envs, self.device, self.action_dim = 1, torch.device("cpu"), len(safety.names)
        self.control_dt, self.max_episode_length = 1.0 / fps, int(max_episode_length)
        self.gripper = gripper_range_of(robot)
        self.episodes = EpisodeTracker(1, self.device)  # info[EPISODE] as every backend gives it
        shapes: dict[str, tuple[int, ...]] = {keys.OBS_STATE: (self.action_dim,)}
        for cam in self.cameras:
            h, w, _ = feats[cam]
            shapes[keys.lerobot_image_key(cam)] = (3, h, w)
        self.obs_spec = ObsSpec(shapes, dtypes={keys.lerobot_image_key(c): torch.uint8 for c in self.cameras})
        self.clock = clock or ControlClock(fps)
        self.reads = ReadMonitor(safety.cfg)
        self.steps = 0
        self._ended = False
        self._obs: Observation | None = None
        self._last_sent: torch.Tensor | None = None  # [1, 6] degrees, the last command the robot received
        self._episode_t0 = 0.0  # perf_counter of the episode's first read

    @property
    def instructions(self) -> list[str]:  # type: ignore[override]
        return [self.task]

    # ---------------------------------------------------------------------------------------- reading
    def _lock(self) -> Any:
        import contextlib

        return self.guard.lock if self.guard is not None else contextlib.nullcontext()

    def observe(self) -> Observation:
        """Read the robot, retrying a failed bus read (a ``ConnectionError`` or the port's ``OSError``) at once up to
        ``read_retries`` times (each one counted); ``BusLost`` after ``max_consecutive_read_failures`` ticks without a
        read or an error rate past the limit. Any other exception (a camera's, a ``TimeoutError`` included, the
        robot's own) propagates: the guard turns torque off."""
        cfg = self.safety.cfg
        error: BaseException | None = None
        for attempt in range(1 + cfg.read_retries):
            try:
                with self._lock():
                    raw = self.robot.get_observation()
            except OSError as e:  # LeRobot's ConnectionError (no status packet), or the port's own (an unplugged USB
                # adapter: pyserial's SerialException is an OSError); a TimeoutError is a camera's: it propagates
                if isinstance(e, TimeoutError):
                    raise
                error = e
                self.reads.attempt(False)
                if attempt:
                    self.reads.retries += 1
                continue
            self.reads.attempt(True)
            if attempt:
                self.reads.retries += 1
            self.reads.tick(True)
            present = np.array([float(raw[n]) for n in self.safety.names])
            self._obs = Observation(raw, present, time=time.perf_counter())
            return self._obs
        self.reads.tick(False, error)  # raises BusLost past the limit
        if self._obs is None:
            raise SafeStop(f"the first state read failed: {error}")
        self._obs = Observation(self._obs.raw, self._obs.present, stale=True, time=self._obs.time)
        return self._obs

    def frame(self, obs: Observation | None = None) -> dict[str, Any]:
        """Our frame of an observation (default: the latest), with its capture time: s since the episode's first
        read (``keys.CAPTURE_TIME_COL``, float32 [1]; RELIABILITY C4)."""
        obs = obs or self._obs
        state = features.robot_to_deg(torch.from_numpy(obs.present).float(), self.gripper)[None]
        return {keys.OBS_STATE: state, **features.images_from_robot(obs.raw, self.cameras), keys.TASK: [self.task],
                keys.CAPTURE_TIME_COL: torch.tensor([obs.time - self._episode_t0], dtype=torch.float32)}

    @property
    def present(self) -> np.ndarray:
        """float64 [6] the last read position, robot units."""
        return self._obs.present

    # ---------------------------------------------------------------------------------------- contract
    def reset(self, seed: int | None = None, env_ids: torch.Tensor | None = None) -> tuple[dict[str, Any], dict]:
        """Start an episode where the arm is (a person resets the scene; ``so101_sim`` starts a new one)."""
        import contextlib

        with self.guard.paused() if self.guard is not None else contextlib.nullcontext():
            if hasattr(self.robot, "reset_scene"):
                with self._lock():
                    self.robot.reset_scene(seed)
            obs = self.observe()
        self._episode_t0 = obs.time
        if self.fixed_task is None:
            self.task = str(getattr(self.robot, "instruction", ""))
        self.steps, self._ended = 0, False
        self.episodes.reset()
        self.clock.start()
        return self.frame(obs), {}

    def to_robot_units(self, action: Any) -> Any:
        """A degree target tensor [.., 6] in robot units (the gripper to 0..100); anything else as it is (the filter
        judges it)."""
        if isinstance(action, torch.Tensor) and action.dtype.is_floating_point and action.dim() >= 1 \
                and action.shape[-1] == self.action_dim:
            return features.deg_to_robot(action.detach().cpu().double(), self.gripper).double()
        return action

    def step(self, action: Any, actor: int | torch.Tensor | None = None, horizon: int | None = None
             ) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Command one tick: ``action`` float [1, 6] degrees, a chunk [1, H, 6] (its first step; ``horizon``: the H it
        must have, default its own), or a teleoperator's action dict (robot units). Malformed -> hold position
        (``info[REJECTED]``); then wait for the tick's deadline and read the robot."""
        if self._ended:
            raise RuntimeError("the episode ended: call reset() before stepping again (a robot does not auto-reset)")
        if self._obs is None:
            raise RuntimeError("call reset() first")
        if self.guard is not None:
            self.guard.tick()
        who = actor_ids(actor, 1, self.device)
        chunk = isinstance(action, torch.Tensor) and action.dim() == 3
        proposal = self.to_robot_units(action)
        sent_deg, rejected = None, False
        if not self._obs.stale:  # without a fresh read nothing is sent: the servos keep their last goal
            cmd = self.safety.command(proposal, self._obs.present, chunk_horizon=(horizon or action.shape[1]) if chunk else None)
            rejected = cmd.rejected
            with self._lock():
                if self.guard is not None and self.guard.stopped.is_set():
                    raise SafeStop("the guard sent torque-off (watchdog); nothing more is sent")
                sent = self.robot.send_action(self.safety.as_action(cmd.values))
            sent_units = np.array([float(sent.get(n, v)) for n, v in zip(self.safety.names, cmd.values, strict=True)])
            sent_deg = features.robot_to_deg(torch.from_numpy(sent_units).float(), self.gripper)[None]
        self.clock.wait()
        obs = self.observe()
        if sent_deg is None:  # nothing sent: the servos keep the previous command (or hold where they were)
            sent_deg = self._last_sent if self._last_sent is not None else \
                features.robot_to_deg(torch.from_numpy(obs.present).float(), self.gripper)[None]
        self._last_sent = sent_deg
        self.steps += 1
        success = torch.tensor([bool(getattr(self.robot, "task_success", lambda: False)())])
        truncated = torch.tensor([self.steps >= self.max_episode_length])
        self._ended = bool(truncated[0])
        reward, frame = torch.zeros(1), self.frame(obs)
        self.episodes.add(reward, success)
        # the VecEnv contract's keys (robot_rl.env): no auto-reset here, so the last observation is this one
        info = {keys.ACTION_COL: sent_deg, keys.APPLIED_ACTION: sent_deg, keys.ACTOR: who, keys.SUCCESS: success,
                keys.FINAL_OBS: frame, REJECTED: rejected, STALE: obs.stale, keys.LOG: self.counters()}
        if self._ended:
            info[keys.EPISODE] = self.episodes.stats()
        return frame, reward, torch.zeros(1, dtype=torch.bool), truncated, info

    def end_episode(self) -> None:
        """Mark the running episode ended (a take-over or a success ends it early)."""
        self._ended = True

    def counters(self) -> dict[str, float]:
        """Safety and timing counters for the logger."""
        c = {"safety/rejects": float(self.safety.rejects), "safety/clips": float(self.safety.clips),
             "bus/read_failures": float(self.reads.failures), "bus/retries": float(self.reads.retries),
             "clock/missed": float(self.clock.missed)}
        return c

    def close(self) -> None:
        safe_disconnect(self.robot)


__all__ = ["CLOCK", "REJECTED", "STALE", "ControlClock", "Observation", "RobotEnv", "gripper_range_of",
           "safe_connect", "safe_disconnect"]
