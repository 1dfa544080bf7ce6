"""``robot-rl collect``: record episodes into a LeRobotDataset v3, from the scripted expert or an exported policy.

    robot-rl collect task=so101_pick episodes=100 dataset.root=data/pick [quality=0.8] [sim.num_envs=16]
    robot-rl collect task=so101_pick episodes=50 dataset.root=data/pick dataset.append=true policy=runs/<run>

The env is seen through ``sim.lerobot_view.LeRobotView``: frames in LeRobot's convention (``observation.state`` in
degrees, ``observation.images.<cam>`` uint8, ``task``), actions as joint targets in degrees. ``task.cameras`` and
``task.image_width/height`` say what is recorded: the view renders those cameras (the inner task renders none), only
for the envs still recording. The expert acts on the inner env's observation (``expert.act(view.env_obs)``) and the
view is stepped with what that action commands, ``view.to_target(action)``. A policy acts through an ``ActionQueue``:
on the frames when it reads LeRobot frames (its inputs name ``observation.state``; its actions are then degree
targets), else on the inner env's observation (its actions are the env's, converted with ``view.to_target``). The
recorded ``action`` is what the view really commanded (``info["action"]``, clipped to the per-step cap and the joint
limits, RELIABILITY.md A2), except under ``disturbance`` (DART, ``ExpertActor``), where it is the expert's undisturbed
command, and during a ``grasp_recovery`` botch, where it is the expert's correction; ``policy_action`` is the policy's
own proposal (the expert: equal to the action). With ``env_state=true`` each frame also holds what a state-based
learner needs (``robot_rl.data.demo_buffer``): LeRobot's ``observation.environment_state`` = the inner env's
``policy`` observation at that frame, ``env_critic_state`` = its ``critic`` observation (where the task has one) and
``env_action`` = the action the inner env applied (its own space, in [-1, 1]); the default layout is LeRobot's frame
alone. Each env records its share of the episodes, its first ones, so short (often successful) episodes are not
over-represented.
Episodes are written by ``robot_rl.data.recorder.EpisodeRecorder``: each whole when it ends, committed, so a crash,
Ctrl-C or SIGTERM loses at most the episodes still running, and a full disk stops with exit status 4.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from policies import keys
from robot_rl.data.recorder import RecorderConfig

DISTURBANCE_DURING = ("episode", "approach")


def check_disturbance(std: float, steps: int, during: str) -> None:
    """Raises ValueError unless std >= 0, steps >= 1 and ``during`` is one of ``DISTURBANCE_DURING`` (the DART
    settings of ``CollectCommand`` and ``ExpertActor``)."""
    if std < 0 or steps < 1:
        raise ValueError(f"disturbance must be >= 0 and disturbance_steps >= 1, got {std} and {steps}")
    if during not in DISTURBANCE_DURING:
        raise ValueError(f"disturbance_during must be one of {DISTURBANCE_DURING}, got {during!r}")


@dataclass
class CollectCommand:
    """configs/collect.yaml: ``robot-rl collect`` (``task`` and ``sim`` are the groups chosen by name)."""

    episodes: int = 10  # whole episodes to record (envs still running at the end are dropped)
    policy: str | None = None  # a run, checkpoint or exported-policy folder; None: the task's scripted expert
    quality: float = 1.0  # the scripted expert's quality in [0, 1] (1: no deliberate flaws; sim.experts)
    seed: int = 0  # env.reset seed and the expert's
    device: str = "cpu"  # the policy's device: cpu | cuda | cuda:<i> | auto
    torch_threads: int = 1  # torch intra-op threads (the simulator has its own, sim.num_threads)
    progress: bool = True  # tqdm bar on stderr
    env_state: bool = False  # also record the env's own observation and action (observation.environment_state ...)
    # DART: noise of this std (normalised action units) on the scripted expert's arm joints as sent, each draw held
    # disturbance_steps control steps; the recorded action stays the expert's undisturbed command (ExpertActor)
    disturbance: float = 0.0
    disturbance_steps: int = 1
    # "episode": disturbed throughout; "approach": only while the expert approaches (ScriptedExpert.approaching:
    # above the cube for lift / push / pick, the whole of reach), so grasps and pushes are shown undisturbed
    disturbance_during: str = "episode"
    # lift / pick: the probability that an episode's first grasp is botched (beside the cube, askew) and corrected,
    # the correction recorded as the action (sim.experts: the grasp's counterpart of a DART approach)
    grasp_recovery: float = 0.0
    dataset: RecorderConfig = field(default_factory=RecorderConfig)
    task: Any = None
    sim: Any = None

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if not 0.0 <= self.quality <= 1.0:
            raise ValueError(f"quality must lie in [0, 1], got {self.quality}")
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {self.torch_threads}")
        check_disturbance(self.disturbance, self.disturbance_steps, self.disturbance_during)
        if self.disturbance > 0 and self.policy is not None:
            raise ValueError("disturbance applies to the scripted expert's demonstrations; it cannot be combined "
                             "with policy=")
        if not 0.0 <= self.grasp_recovery <= 1.0:
            raise ValueError(f"grasp_recovery must lie in [0, 1], got {self.grasp_recovery}")
        if self.grasp_recovery > 0 and self.policy is not None:
            raise ValueError("grasp_recovery applies to the scripted expert's demonstrations; it cannot be combined "
                             "with policy=")


@dataclass
class Collected:
    """What ``collect`` recorded: counts, wall-clock seconds split by phase, and the dataset."""

    episodes: int
    successes: int
    frames: int
    seconds: float
    step_s: float  # inside view.step (physics, rendering)
    act_s: float  # the expert's or policy's actions
    write_s: float  # inside the recorder (buffering, encoding, LeRobot's save, commit)
    root: Path
    total_episodes: int  # in the dataset now (appended runs count the earlier ones)
    recorder_timings: dict[str, float]


# ------------------------------------------------------------------------------------------------- actors
# frames -> (targets to send [N, 6] degrees, the policy's proposal or None for the expert, who acts)
Actor = Callable[[dict[str, Any]], tuple[torch.Tensor, torch.Tensor | None, int]]


class ExpertActor:
    """The scripted expert through the view: it reads the inner env's observation; the joint targets its action
    commands are sent. It plays the human: ``actor`` is human, so ``intervention`` is set (``actor != policy``), and
    ``policy_action`` equals the action.

    ``disturbance`` > 0 collects the DART way (Laskey et al., "DART: Noise Injection for Robust Imitation Learning",
    CoRL 2017): Gaussian noise of that std (normalised action units; 1 = the per-step cap) is added to the arm
    joints' action before it is sent, each draw held for ``disturbance_steps`` control steps, while ``label`` keeps
    what the undisturbed expert commanded, which ``record`` writes as the ``action``. The demonstrations then visit
    the states a learner's own errors lead to and show the way back from them. The gripper is never disturbed.
    ``during="approach"`` disturbs only the steps where the expert approaches (``expert.approaching``): the way to
    the object is shown from off its path, the grasp or push as the expert does it (noise there fails them).
    An expert that botches grasps on purpose (``grasp_recovery``) gives its correction as ``label_action``; that is
    then the label, with or without a disturbance.
    """

    def __init__(self, view: Any, expert: Any, disturbance: float = 0.0, disturbance_steps: int = 1,
                 seed: int = 0, during: str = "episode") -> None:
        check_disturbance(disturbance, disturbance_steps, during)
        self.view, self.expert = view, expert
        self.disturbance, self.disturbance_steps = float(disturbance), int(disturbance_steps)
        self.during = during
        self.label: torch.Tensor | None = None  # degrees [N, 6]: the undisturbed command of the last call
        self._gen = torch.Generator().manual_seed(seed)
        self._noise = torch.zeros(view.num_envs, 6)
        self._age = torch.full((view.num_envs,), self.disturbance_steps)  # steps each env's draw has been held

    def __call__(self, frames: dict[str, Any]) -> tuple[torch.Tensor, None, int]:
        action = self.expert.act(self.view.env_obs)
        correction = getattr(self.expert, "label_action", None)  # grasp_recovery: what to record where it differs
        if self.disturbance == 0.0:
            if correction is not None:
                self.label = self.view.to_target(correction)
            return self.view.to_target(action), None, keys.ACTOR_HUMAN  # the view applies the last to_target's rows
        self.label = self.view.to_target(action if correction is None else correction)
        fresh = self._age >= self.disturbance_steps
        draws = torch.randn(int(fresh.sum()), 5, generator=self._gen) * self.disturbance
        self._noise[fresh, :5], self._age[fresh] = draws, 0
        self._age += 1
        noise = self._noise
        if self.during == "approach":
            noise = noise * torch.as_tensor(self.expert.approaching, dtype=noise.dtype)[:, None]
        noisy = (action + noise.to(action.device)).clamp(-1.0, 1.0)
        return self.view.to_target(noisy), None, keys.ACTOR_HUMAN  # the view applies the last to_target's rows

    def reset(self, env_ids: torch.Tensor | None) -> None:
        self.expert.reset(env_ids)
        ids = slice(None) if env_ids is None else env_ids.cpu()
        self._noise[ids], self._age[ids] = 0.0, self.disturbance_steps


class PolicyActor:
    """An exported policy through an ``ActionQueue``, on the frames or on the inner env's observation (see the
    module docstring); its proposal is what is sent."""

    def __init__(self, view: Any, policy: Any) -> None:
        from policies import ActionQueue

        self.view = view
        self.reads_frames = keys.OBS_STATE in policy.processor.features.inputs
        self.queue = ActionQueue(policy, view.num_envs, view.action_dim if self.reads_frames else view.env.action_dim)

    def __call__(self, frames: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, int]:
        if self.reads_frames:
            target = self.queue(frames)
        else:
            target = self.view.to_target(self.queue(self.view.env_obs))
        return target, target, keys.ACTOR_POLICY

    def reset(self, env_ids: torch.Tensor | None) -> None:
        self.queue.reset(env_ids)


def _load_policy(path: str, task: str, device: torch.device) -> Any:
    """An exported policy folder as is; a run or checkpoint folder through its checkpoint (which must be the
    task's)."""
    from policies import load_policy
    from policies.persistence import CONFIG_FILE
    from robot_rl.checkpoint import POLICY_DIR, load_meta

    p = Path(path)
    if (p / CONFIG_FILE).is_file():
        return load_policy(p, device)
    folder, meta = load_meta(p)
    if meta.get("task") not in (None, task):
        raise ValueError(f"policy={path}: its checkpoint was trained on task {meta['task']!r}, not {task!r}")
    return load_policy(folder / POLICY_DIR, device)


# ------------------------------------------------------------------------------------------------ the loop
@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends collection like Ctrl-C: the episode being written is rolled back, the rest is kept."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _recording(written: torch.Tensor, quota: torch.Tensor) -> torch.Tensor | None:
    """The envs still recording, as the view's ``render_ids`` (None: all of them)."""
    keep = written < quota
    return None if bool(keep.all()) else keep.nonzero().flatten()


def env_state_columns(env: Any) -> dict[str, str]:
    """The env-state columns ``env_state=true`` records for ``env``: column -> the observation group it holds
    (``keys.ENV_STATE_COL`` the ``policy`` group, ``keys.ENV_CRITIC_STATE_COL`` the ``critic`` group where the env
    has one). Both must be flat."""
    groups = {keys.ENV_STATE_COL: keys.POLICY}
    if keys.CRITIC in env.obs_spec.shapes:
        groups[keys.ENV_CRITIC_STATE_COL] = keys.CRITIC
    for g in groups.values():
        if len(env.obs_spec.shapes[g]) != 1:
            raise ValueError(f"env_state=true records flat observations; the env's {g!r} group has shape "
                             f"{env.obs_spec.shapes[g]}")
    return groups


def feature_names(spec: Any, group: str) -> tuple[str, ...] | None:
    """"<part>.<i>" for each value of a flat observation group, from its named parts (None where they do not cover
    it): the names of the env-state columns (``robot_rl.rewards.progress`` leaves out parts by them)."""
    parts = sorted(spec.parts.get(group, {}).items(), key=lambda kv: kv[1][0])
    names = [f"{name}.{i}" for name, (start, stop) in parts for i in range(stop - start)]
    return tuple(names) if len(names) == spec.shapes[group][0] else None


def record(view: Any, actor: Any, recorder: Any, episodes: int, seed: int, bar: Any = None,
           env_state: dict[str, str] | None = None) -> dict[str, float]:
    """Step ``view`` with ``actor``'s targets until ``recorder`` has written ``episodes`` episodes, env i recording
    its first ``episodes // N`` (+1 for the first ``episodes % N`` envs). Returns the successful episodes, frames
    written, env steps taken, and seconds spent choosing actions, stepping the view (physics and rendering) and
    writing.

    ``env_state``: column -> inner-env observation group (``env_state_columns``) to record with each frame, plus
    ``keys.ENV_ACTION_COL`` (the inner env's applied action); None: LeRobot's frame only."""
    n = view.num_envs
    quota = torch.tensor([episodes // n + (i < episodes % n) for i in range(n)])
    written = torch.zeros(n, dtype=torch.long)
    successes = frames_written = steps = 0
    step_s = act_s = write_s = 0.0
    view.render_ids = _recording(written, quota)
    frames, _ = view.reset(seed=seed)
    actor.reset(None)
    while int(written.sum()) < episodes:
        t0 = time.perf_counter()
        target, proposal, who = actor(frames)
        t1 = time.perf_counter()
        keep = written < quota  # envs past their share stop recording (and rendering) at their episode's end
        view.render_ids = _recording(written, quota)
        env_obs = view.env_obs  # the inner env's observation at the time of ``frames`` (step returns new tensors)
        next_frames, reward, terminated, truncated, info = view.step(target, actor=who)
        t2 = time.perf_counter()
        done = terminated | truncated
        extras = {} if env_state is None else {"extras": {  # the default call is as before env_state existed
            **{col: env_obs[g] for col, g in env_state.items()}, keys.ENV_ACTION_COL: info[keys.APPLIED_ACTION]}}
        label = getattr(actor, "label", None)  # DART (ExpertActor.disturbance): the undisturbed command
        for ep in recorder.add(frames, info[keys.ACTION_COL] if label is None else label, reward, info[keys.SUCCESS], done, actor=who,
                               policy_action=proposal, record=keep, **extras):
            written[ep.env] += 1
            successes += int(ep.success)
            frames_written += ep.length
            if bar is not None:
                bar.update(1)
                bar.set_postfix(success=f"{successes / int(written.sum()):.2f}")
        t3 = time.perf_counter()
        if bool(done.any()):
            actor.reset(done.nonzero().flatten())
        frames, steps = next_frames, steps + 1
        act_s, step_s, write_s = act_s + t1 - t0, step_s + t2 - t1, write_s + t3 - t2
    return {"successes": successes, "frames": frames_written, "steps": steps, "step_s": step_s, "act_s": act_s,
            "write_s": write_s}


def collect(cfg: Any) -> Collected:
    """``robot-rl collect``: build the env, its view and the recorder from a composed ``collect`` config, record,
    and print a summary line."""
    from omegaconf import OmegaConf
    from tqdm import tqdm

    from robot_rl.cli.build import seed_everything
    from robot_rl.cli.config import resolve_device, typed
    from robot_rl.data.recorder import DatasetSpec, EpisodeRecorder
    from sim.experts import EXPERTS, make_expert
    from sim.lerobot_view import LeRobotView
    from sim.registry import config_from_dict, make_env, sim_config_from_dict
    from sim.so101 import LEROBOT_STATE_NAMES

    raw = OmegaConf.to_container(cfg, resolve=True)
    task_raw, sim_raw = dict(raw.pop("task")), raw.pop("sim")
    c = typed(CollectCommand, raw, "")
    device = resolve_device(c.device)
    torch.set_num_threads(c.torch_threads)
    seed_everything(c.seed)
    task_name = task_raw.pop("name")
    if task_name not in EXPERTS:  # before the task's config, which has no cameras outside the SO-101 tasks
        raise ValueError(f"robot-rl collect records the SO-101 tasks in LeRobot's frames, each with its scripted "
                         f"expert: task={task_name!r} is not one of {sorted(EXPERTS)}")
    task_cfg, sim_cfg = config_from_dict(task_name, task_raw), sim_config_from_dict(sim_raw)
    cameras = tuple(task_cfg.cameras)  # recorded through the view, which renders them itself
    size = (int(task_cfg.image_height), int(task_cfg.image_width))
    policy = _load_policy(c.policy, task_name, device) if c.policy else None  # a bad path fails before the env
    start = time.perf_counter()
    with make_env(task_name, sim_cfg, dataclasses.replace(task_cfg, cameras=[])) as env:
        view = LeRobotView(env, cameras=cameras, image_size=size)
        fps = round(1.0 / env.control_dt)
        if abs(fps * env.control_dt - 1.0) > 1e-6:
            raise ValueError(f"task={task_name}: its control period {env.control_dt} s is not 1/integer, which a "
                             "LeRobot dataset's fps needs")
        env_state = env_state_columns(env) if c.env_state else None
        vectors = {} if env_state is None else {
            **{col: env.obs_spec.shapes[g][0] for col, g in env_state.items()}, keys.ENV_ACTION_COL: env.action_dim}
        names = {} if env_state is None else {col: feature_names(env.obs_spec, g) for col, g in env_state.items()}
        spec = DatasetSpec(fps, tuple(LEROBOT_STATE_NAMES), {cam: size for cam in cameras}, vectors=vectors,
                           vector_names={k: v for k, v in names.items() if v is not None})
        if policy is None:
            expert = make_expert(env, quality=c.quality, seed=c.seed, grasp_recovery=c.grasp_recovery)
            actor = ExpertActor(view, expert, c.disturbance, c.disturbance_steps, c.seed, c.disturbance_during)
        else:
            actor = PolicyActor(view, policy)
        recorder = EpisodeRecorder(c.dataset, spec, env.num_envs, env.max_episode_length)
        bar = tqdm(total=c.episodes, unit="ep", desc="collect", disable=not c.progress, file=sys.stderr)
        try:
            with _sigterm_interrupts():
                out = record(view, actor, recorder, c.episodes, c.seed, bar, env_state)
        except KeyboardInterrupt:
            recorder.close()
            bar.close()
            print(f"robot-rl collect: interrupted; the dataset {recorder.root} holds {recorder.num_episodes} "
                  "complete episodes", file=sys.stderr)
            raise SystemExit(130) from None
        finally:
            bar.close()
            recorder.close()
    seconds = time.perf_counter() - start
    result = Collected(recorder.episodes_written, out["successes"], out["frames"], seconds, out["step_s"],
                       out["act_s"], out["write_s"], recorder.root, recorder.num_episodes, dict(recorder.timings))
    print(f"collect: {result.episodes} episodes, success rate {result.successes / result.episodes:.2f}, "
          f"{result.frames} frames in {seconds:.1f} s ({seconds / result.episodes:.2f} s per episode); dataset "
          f"{result.root} ({result.total_episodes} episodes)", file=sys.stderr)
    return result
