"""Who drives the arm each tick -- the policy or a person at a teleoperator -- and the control session that records
it (RELIABILITY.md A3, A12; DESIGN.md §6).

    driver = PolicyDriver(policy, safety, robot)           # any exported policy, chunked or not
    takeover = KeyboardTakeover("space")                    # or ScheduledTakeover([...]) in tests / demos
    with SafetyGuard(robot, cfg) as guard:
        result = run_session(env, driver, teleop, takeover, recorder, guard, episodes=5)

Each tick the take-over source is read first; when it is engaged the teleoperator's action is applied in that same
tick (take-over latency <= 1 tick), recorded with ``intervention = True`` (``actor = human``), the policy's own
proposal kept in ``policy_action`` (the policy keeps running during a take-over) and the applied, clipped command in
``action``. When the source releases, the policy's queued chunk is dropped and it plans again from where the arm
is; every command -- the first after a switch included -- passes the per-tick cap of ``SafetyFilter``. If the
teleoperator fails during a take-over the arm holds and the session stops (``TeleopLost``): torque goes off through
the guard; control never silently returns to the policy.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from policies import keys
from policies.execution import add_to_ensemble
from real.robot_env import RobotEnv, safe_disconnect
from real.safety import ActionRejected, SafetyConfigError, SafetyFilter, SafetyGuard, TeleopLost
from robot_rl.hil import Arbiter, Polled

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------- take-over
class TakeoverSource(Protocol):
    def engaged(self) -> bool:
        """Polled once per tick: whether the person has control now."""

    def close(self) -> None: ...


class AlwaysHuman:
    """Teleoperation only (``robot-rl record``): the person always has control."""

    def engaged(self) -> bool:
        return True

    def close(self) -> None:
        pass


class NeverHuman:
    """No take-over device: the policy always drives."""

    def engaged(self) -> bool:
        return False

    def close(self) -> None:
        pass


class ScheduledTakeover:
    """A programmable take-over: control switches at the given poll indices (ticks, counted across episodes),
    starting with the policy. ``ScheduledTakeover([10, 20])``: the person drives ticks 10..19."""

    def __init__(self, switches: Iterable[int]) -> None:
        self.switches = sorted(int(s) for s in switches)
        self.tick = 0

    def engaged(self) -> bool:
        on = sum(s <= self.tick for s in self.switches) % 2 == 1
        self.tick += 1
        return on

    def close(self) -> None:
        pass


class KeyboardTakeover:
    """A key (or a USB foot pedal, which types a key) toggles the take-over: each press flips between the policy and
    the person (holding the key does not flip it again). Keys are read through LeRobot's ``KeyboardTeleop`` (pynput:
    an X11 session, a Windows desktop or macOS with input monitoring granted; not Wayland, not a headless machine).

    Args:
        key: the key's character ("t") or pynput name ("space", "f12").
        keyboard: anything with LeRobot's ``Teleoperator.get_action()`` returning the keys held now (LeRobot's
            ``KeyboardTeleop`` does: characters, or pynput ``Key`` objects whose ``str`` is ``Key.<name>``); None:
            LeRobot's, connected here. The caller's keyboard is not disconnected by ``close``.
    """

    def __init__(self, key: str = "space", keyboard: Any = None) -> None:
        self.owned = keyboard is None
        self.keyboard = _lerobot_keyboard() if keyboard is None else keyboard
        self.key, self.on, self._down = key, False, False

    def engaged(self) -> bool:
        down = self.key in _keys_held(self.keyboard)
        if down and not self._down:  # a press toggles
            self.on = not self.on
            log.warning("take-over: %s", "person" if self.on else "policy")
        self._down = down
        return self.on

    def close(self) -> None:
        _release(self.keyboard, self.owned)


# ------------------------------------------------------------------------------------------------ episode marks
SUCCESS, FAILURE = "success", "failure"  # the person's marks on an episode


class EpisodeMark(Protocol):
    def poll(self) -> str | None:
        """Polled once per tick, after the step: ``SUCCESS`` (the person marks the task done), ``FAILURE`` (the
        person gives the episode up) or None. A mark ends the episode."""

    def close(self) -> None: ...


class ScheduledMark:
    """Marks at the given poll indices (ticks, counted across episodes, as ``ScheduledTakeover``'s): demos and tests.
    ``ScheduledMark(success=[15])``: the 16th tick of the session is marked done."""

    def __init__(self, success: Iterable[int] = (), failure: Iterable[int] = ()) -> None:
        self.success, self.failure, self.tick = {int(t) for t in success}, {int(t) for t in failure}, 0

    def poll(self) -> str | None:
        tick, self.tick = self.tick, self.tick + 1
        return SUCCESS if tick in self.success else FAILURE if tick in self.failure else None

    def close(self) -> None:
        pass


class KeyboardMark:
    """Keys the person presses to end an episode (a real arm cannot tell how it went): ``success_key`` when the task
    is done (that tick's ``next.success`` is true, as LeRobot's HIL-SERL keyboard marks it), ``failure_key`` to give
    it up (``next.success`` stays false). Each press marks once (held, not again); both at once: success.

    Args:
        success_key, failure_key: a key's character ("s") or pynput name ("f5"), or None for none.
        keyboard: as ``KeyboardTakeover``'s (share the take-over's: one listener reads every key); None: LeRobot's
            ``KeyboardTeleop``, connected here and disconnected by ``close``.
    """

    def __init__(self, success_key: str | None = "s", failure_key: str | None = None, keyboard: Any = None) -> None:
        self.owned = keyboard is None
        self.keyboard = _lerobot_keyboard("success_key/failure_key") if keyboard is None else keyboard
        self.keys = {k: v for k, v in ((SUCCESS, success_key), (FAILURE, failure_key)) if v is not None}
        self._down: set[str] = set()

    def poll(self) -> str | None:
        held = _keys_held(self.keyboard)
        down = {mark for mark, key in self.keys.items() if key in held}
        pressed, self._down = down - self._down, down
        verdict = SUCCESS if SUCCESS in pressed else FAILURE if FAILURE in pressed else None
        if verdict is not None:
            log.warning("the person marks the episode: %s", verdict)
        return verdict

    def close(self) -> None:
        _release(self.keyboard, self.owned)


def _release(keyboard: Any, owned: bool) -> None:
    """Disconnect a keyboard this side connected (a caller's stays the caller's)."""
    if not owned:
        return
    try:
        keyboard.disconnect()
    except Exception:  # noqa: BLE001, S110 - best effort on the way out; the listener thread is a daemon
        pass


def _keys_held(keyboard: Any) -> set[str]:
    """The keys held now, by character ("t") or pynput name ("space"), from LeRobot's ``KeyboardTeleop.get_action()``
    (characters, or pynput ``Key`` objects whose ``str`` is ``Key.<name>``)."""
    return {str(k).removeprefix("Key.") for k in keyboard.get_action()}


def _lerobot_keyboard(option: str = "takeover=keyboard") -> Any:
    """LeRobot's ``KeyboardTeleop``, connected, or ``SafetyConfigError`` saying why keys cannot be read here (for
    ``option``, the setting that asked for keys). LeRobot 0.6.1's ``connect`` only warns when pynput cannot capture
    (headless, Wayland) and leaves it unconnected: its first ``get_action`` would then raise mid-session, so that is
    checked here, before anything moves."""
    from lerobot.teleoperators.keyboard import KeyboardTeleop, KeyboardTeleopConfig

    other = ("takeover=schedule or takeover=none" if option.startswith("takeover") else
             "success_schedule / failure_schedule, or label the episodes afterwards (algo.labels.failed_episodes)")
    hint = f"run in an X11 session, on a Windows desktop or on macOS with input monitoring granted; or use {other}"
    try:
        keyboard = KeyboardTeleop(KeyboardTeleopConfig())
        keyboard.connect()
    except Exception as e:
        raise SafetyConfigError(f"{option}: cannot read the keyboard ({type(e).__name__}: {e}); install "
                                f"pynput (pip install pynput), {hint}") from e
    if not keyboard.is_connected:
        raise SafetyConfigError(f"{option}: pynput cannot capture key events in this session (no X11 "
                                f"display, or Wayland); {hint}")
    return keyboard


# ------------------------------------------------------------------------------------------------- the policy
class PolicyDriver:
    """Runs an exported policy one tick at a time and proposes degree targets [1, 6].

    A policy that reads LeRobot frames (its inputs name ``observation.state``: the flow VLA, policies trained offline)
    acts on the env's frames; one trained in our simulator on task state acts on ``so101_sim``'s scene
    (``robot.view.env_obs``, its actions turned into joint targets by ``view.to_target``) and is refused on a real
    arm. Chunks (``horizon`` H > 1) are checked when they arrive (``SafetyFilter.parse_chunk``): a malformed chunk is
    handed on as it is, for the env's filter to reject (hold, count); the policy is asked again next tick.

    ``lookahead`` L > 0 (chunked policies on frames): the next chunk is computed in a background thread from the
    frame L ticks before the queued chunk runs out, while the loop keeps ticking, and its first L steps -- planned
    for ticks that have passed by the time it arrives -- are skipped (the asynchronous inference of LeRobot's
    ``async_inference`` and of real-time chunking, without the inpainting). The steps taken from each chunk are
    ``min(executed_steps, horizon - L)``. What the arm does does not depend on how fast the thread is: the chunk is
    a function of the frame it was given, and a tick that finds it unfinished waits for it. L = 0: each chunk is
    computed inside the tick that needs it (the tick then takes the inference's time too). For an instruction the
    policy runs with ACT's temporal ensembling (``temporal_ensemble_for``), each step from a new chunk's arrival on
    is the weighted mean of every chunk's prediction for it, as in ``policies.execution.ActionQueue``.

    Raises (at construction, before anything moves):
        SafetyConfigError: the policy's action size differs from the robot's, it reads a camera the robot lacks or
            at another size, or it needs state the robot cannot give; L leaves no step of a chunk to execute.
    """

    def __init__(self, policy: Any, safety: SafetyFilter, robot: Any, env: RobotEnv, lookahead: int = 0) -> None:
        feats = policy.processor.features
        self.policy, self.safety = policy, safety
        self.horizon, self.executed = int(policy.horizon), int(policy.executed_steps)
        self.reads_frames = keys.OBS_STATE in feats.inputs
        safety.check_policy(int(feats.action_dim), self.horizon)
        if self.reads_frames:
            for group, shape in feats.inputs.items():
                if group.startswith(keys.OBS_IMAGES):
                    have = env.obs_spec.shapes.get(group)
                    if have is None or list(have) != list(shape):
                        raise SafetyConfigError(
                            f"the policy reads {group} {list(shape)}; the robot gives "
                            f"{'no such camera' if have is None else list(have)} (robot cameras: {list(env.cameras)})")
                elif group not in (keys.OBS_STATE,):
                    raise SafetyConfigError(f"the policy reads {group!r}, which a robot frame does not hold")
            self.view = None
        else:
            self.view = getattr(robot, "view", None)
            if self.view is None:
                raise SafetyConfigError(
                    f"the policy reads {sorted(feats.inputs)} (state of a simulated task), which a real arm does not "
                    "give: deploy a policy trained on LeRobot frames (robot-rl offline), or use robot=so101_sim")
        if lookahead < 0:
            raise SafetyConfigError(f"lookahead must be >= 0 ticks, got {lookahead}")
        self.lookahead = lookahead if self.horizon > 1 and self.reads_frames else 0  # one-step policies: no queue
        if self.lookahead and self.horizon - self.lookahead < 1:
            raise SafetyConfigError(f"lookahead {lookahead} skips every step of the policy's {self.horizon}-step "
                                    "chunks: use a lookahead < the chunk horizon")
        self.chunk: torch.Tensor | None = None
        self.pos = self.end = 0  # the next step of the queued chunk, and where its executed steps end
        # temporal ensembling: per step of ``chunk``, the summed weights and the number of predictions blended
        self._weights: torch.Tensor | None = None
        self._counts: torch.Tensor | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._skip = 0  # ticks between the pending chunk's frame and its first use

    def reset(self) -> None:
        """Forget the queued chunk and any chunk being computed (a new episode, or the policy taking back
        control)."""
        self._drop_pending()
        self.chunk, self.pos, self.end = None, 0, 0
        self._weights = self._counts = None
        self.policy.reset(None)

    def close(self) -> None:
        """Stop the inference thread (waits for a chunk being computed)."""
        self._drop_pending()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _drop_pending(self) -> None:
        if self._pending is not None:  # let it finish: the policy is not reset under a running act
            with contextlib.suppress(Exception):
                self._pending.result()
            self._pending = None

    @staticmethod
    def _task(frame: dict[str, Any]) -> str | None:
        """The frame's instruction (None: it has none)."""
        task = frame.get(keys.TASK)
        return task[0] if isinstance(task, list | tuple) and task else task if isinstance(task, str) else None

    def _executed(self, frame: dict[str, Any]) -> int:
        """Steps of a chunk to execute: the policy's for the frame's instruction (``executed_steps_for``)."""
        return int(self.policy.executed_steps_for(self._task(frame)))

    def _act(self, obs: dict[str, Any]) -> Any:
        with torch.no_grad():  # grad mode is per thread
            return self.policy.act(obs, deterministic=True)

    def _obs(self, frame: dict[str, Any], copy: bool) -> dict[str, Any]:
        obs = frame if self.reads_frames else self.view.env_obs
        dev = self.policy.device
        return {k: (v.to(dev, copy=copy) if isinstance(v, torch.Tensor) else list(v) if copy and isinstance(v, list)
                    else v) for k, v in obs.items()}

    @torch.no_grad()
    def propose(self, frame: dict[str, Any]) -> tuple[Any, torch.Tensor | None]:
        """``(to_send, proposal)``: what to hand ``env.step`` (degrees [1, 6]; or the malformed output, for the
        filter to reject) and the proposal in degrees [1, 6] (None when malformed)."""
        if self.chunk is not None and self.pos < self.end:
            if self.lookahead and self._pending is None and self.end - self.pos <= self.lookahead:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="policy-inference")
                self._pending = self._pool.submit(self._act, self._obs(frame, copy=True))  # this tick's frame
                self._skip = self.end - self.pos  # ticks from this frame to the chunk's first use
            a = self.chunk[:, self.pos]
            self.pos += 1
            return a, a
        skip = 0
        if self._pending is not None:
            out, skip = self._pending.result(), self._skip
            self._pending = None
        else:
            out = self._act(self._obs(frame, copy=False))
        try:
            if self.horizon > 1:
                chunk = torch.from_numpy(self.safety.parse_chunk(out, self.horizon)).float()[None]
            else:
                chunk = torch.from_numpy(self.safety.parse(out)).float()[None, None]
        except ActionRejected:
            self.chunk = None
            return out, None
        if self.view is not None:  # the env's normalised actions -> joint targets from the scene now
            chunk = self.view.to_target(chunk[:, 0].to(self.view.device)).cpu()[:, None]
            chunk = chunk.float()
        m = self._ensemble(frame)
        if m is not None:  # from now on: this chunk's steps blended with what the earlier ones predicted for them
            chunk, skip = self._blend(chunk[:, skip:], m), 0
        else:
            self._weights = self._counts = None
        self.chunk, self.pos = chunk, skip + 1
        self.end = min(skip + self._executed(frame), chunk.shape[1]) if self.horizon > 1 else 1
        return chunk[:, skip], chunk[:, skip]

    def _ensemble(self, frame: dict[str, Any]) -> float | None:
        """ACT's temporal-ensembling coefficient for the frame's instruction (``temporal_ensemble_for``; None: the
        queue). Chunked policies only."""
        return None if self.horizon == 1 else self.policy.temporal_ensemble_for(self._task(frame))

    def _blend(self, new: torch.Tensor, m: float) -> torch.Tensor:
        """The steps from now on [1, K, 6]: the weighted mean of every chunk's prediction for each
        (``policies.execution.add_to_ensemble``), from the blend so far (its summed weights and prediction counts
        kept per step) and this chunk's steps ``new`` [1, K, 6]."""
        k = new.shape[1]
        total, weight, count = torch.zeros_like(new), torch.zeros(1, k), torch.zeros(1, k)
        if self.chunk is not None and self._weights is not None:
            j = min(k, self.chunk.shape[1] - self.pos)
            weight[0, :j], count[0, :j] = self._weights[self.pos:self.pos + j], self._counts[self.pos:self.pos + j]
            total[:, :j] = self.chunk[:, self.pos:self.pos + j] * weight[:, :j, None]
        total, weight, count = add_to_ensemble(total, weight, count, new, torch.tensor([float(m)]))
        self._weights, self._counts = weight[0], count[0]
        return total / weight[..., None]

# ------------------------------------------------------------------------------------------------- the session
@dataclass
class SessionResult:
    """What a session did: episodes ended (and written, of them flagged for late ticks), frames, ticks driven by the
    person, successes, switches, the filter's rejects and clips, the bus's retries, and the clock's statistics."""

    episodes: int = 0
    written: int = 0
    late_episodes: int = 0  # written episodes whose capture times show a stalled loop (robot_rl.data.timing)
    frames: int = 0
    human_ticks: int = 0
    successes: int = 0
    switches: int = 0
    rejects: int = 0
    clips: int = 0
    retries: int = 0
    clock: dict[str, float] = field(default_factory=dict)


def run_session(env: RobotEnv, driver: PolicyDriver | None, teleop: Any, takeover: TakeoverSource,
                recorder: Any, guard: SafetyGuard | None, episodes: int, stop_on_success: bool = True,
                seed: int | None = None, on_written: Callable[[Any], None] | None = None,
                mark: EpisodeMark | None = None) -> SessionResult:
    """Drive ``episodes`` episodes of at most ``env.max_episode_length`` ticks (see the module docstring); with a
    ``recorder`` (``robot_rl.data.recorder.EpisodeRecorder`` of one env) each episode is written when it ends, the
    watchdog paused meanwhile (the arm holds its last command); ``on_written`` is called with each
    ``WrittenEpisode`` right after it is committed. ``mark``: the person's marks (a mark ends its episode, whatever
    ``stop_on_success``; a success mark makes the tick a success).

    Raises:
        TeleopLost: the teleoperator failed while the person had control (after one holding tick).
        SafeStop: any other safety stop (``real.safety``).
    """
    if driver is None and teleop is None:
        raise SafetyConfigError("a session needs a policy, a teleoperator, or both")
    res = SessionResult()
    human_before: bool | None = None  # who drove the previous tick (None: nobody yet)
    arbiter, request = Arbiter(1, latch=False), Polled(AlwaysHuman() if driver is None else takeover)
    for ep in range(episodes):
        frame, _ = env.reset(seed=None if seed is None else seed + ep)
        if driver is not None:
            driver.reset()
        while True:
            arbiter.update(request())
            human = bool(arbiter.taken[0])
            if human_before is not None and human != human_before:
                res.switches += 1
                log.info("tick %d: %s takes control", env.steps, "the person" if human else "the policy")
                if not human and driver is not None:
                    driver.reset()  # plan again from where the arm is
            human_before = human
            to_send, proposal = driver.propose(frame) if driver is not None else (None, None)
            if human:
                try:
                    to_send = teleop.get_action()
                except Exception as e:
                    env.step(frame[keys.OBS_STATE], actor=keys.ACTOR_HUMAN)  # hold where the arm is
                    raise TeleopLost(f"the teleoperator failed during a take-over ({type(e).__name__}: {e}); the arm "
                                     "held position; control was not returned to the policy") from e
            actor = int(arbiter.actor[0])
            horizon = driver.horizon if driver is not None and not human else None
            next_frame, reward, terminated, truncated, info = env.step(to_send, actor=actor, horizon=horizon)
            applied = info[keys.ACTION_COL]
            success = info[keys.SUCCESS]
            verdict = mark.poll() if mark is not None else None
            if verdict == SUCCESS:
                success = torch.ones_like(success)
            if verdict is not None:
                log.info("tick %d: the person marks %s", env.steps, verdict)
            done = bool(terminated[0] or truncated[0] or verdict is not None or (stop_on_success and success[0]))
            res.frames += 1
            res.human_ticks += int(human)
            if recorder is not None:
                policy_action = proposal if proposal is not None and bool(torch.isfinite(proposal).all()) else applied
                # the episode's write (and on_written) is planned work, not a stall: the watchdog waits
                with guard.paused() if done and guard is not None else contextlib.nullcontext():
                    written = recorder.add(frame, applied, reward, success, torch.tensor([done]), actor=actor,
                                           policy_action=policy_action)
                    res.written += len(written)
                    res.late_episodes += sum(bool(w.timing is not None and w.timing.flagged) for w in written)
                    for ep_written in written:
                        if on_written is not None:
                            on_written(ep_written)
            frame = next_frame
            if done:
                env.end_episode()
                res.episodes += 1
                res.successes += int(success[0])
                break
    res.rejects, res.clips, res.retries = env.safety.rejects, env.safety.clips, env.reads.retries
    res.clock = env.clock.stats()
    return res


def guarded_session(robot: Any, safety: SafetyFilter, env_kwargs: dict[str, Any], episodes: int,
                    make_driver: Callable[[RobotEnv], PolicyDriver] | None = None, teleop: Any = None,
                    takeover: TakeoverSource | None = None, make_recorder: Callable[[], Any] | None = None,
                    stop_on_success: bool = True, seed: int | None = None,
                    on_written: Callable[[Any], None] | None = None, watchdog: bool = True,
                    mark: EpisodeMark | None = None) -> SessionResult:
    """``run_session`` on a connected robot with every exit path ordered safely: a ``SafetyGuard`` around the loop
    (torque off first, on any way out), the recorder made inside it (an error there still turns torque off) and
    closed -- LeRobot's ``finalize`` -- only after it, then the robot disconnected. This is what ``robot-rl deploy``
    and ``robot-rl record`` run."""
    recorder = driver = None
    try:
        with SafetyGuard(robot, safety.cfg, watchdog=watchdog) as guard:
            env = RobotEnv(robot, safety, guard, **env_kwargs)
            driver = make_driver(env) if make_driver is not None else None
            recorder = make_recorder() if make_recorder is not None else None
            return run_session(env, driver, teleop, takeover or (NeverHuman() if driver else AlwaysHuman()),
                               recorder, guard, episodes, stop_on_success, seed, on_written, mark)
    finally:
        try:
            if recorder is not None:
                recorder.close()  # torque is off by now
        finally:
            try:
                if driver is not None:
                    driver.close()
            finally:
                safe_disconnect(robot)


__all__ = ["FAILURE", "SUCCESS", "AlwaysHuman", "EpisodeMark", "KeyboardMark", "KeyboardTakeover", "NeverHuman",
           "PolicyDriver", "ScheduledMark", "ScheduledTakeover", "SessionResult", "TakeoverSource", "guarded_session",
           "run_session"]
