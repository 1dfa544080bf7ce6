"""What every runner shares: rolling episode statistics, the run's resumable state, device moves."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from policies import keys
from robot_rl.algos.guard import NonFiniteError
from robot_rl.checkpoint import (
    Checkpoint,
    CheckpointManager,
    OutputWriteError,
    flatten_tree,
    resume_hint,
    rng_state,
    set_rng_state,
)
from robot_rl.distributed import ProcessGroup, check_world_size
from robot_rl.env import Obs, VecEnv


def to_device(obs: Obs, device: torch.device) -> Obs:
    """Move an observation dict (no-op when already there)."""
    return {k: v.to(device, non_blocking=True) for k, v in obs.items()}


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` inside the block and restored after (None: left as they are)."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class EpisodeStats:
    """The last ``window`` finished episodes (return, length, success) from ``info["episode"]``.

    Nothing is reported before ``window`` episodes have ended: the first episodes to end are the short ones
    (early successes), so a partial window overstates the success rate.

    Args:
        window: number of most recent episodes summarized.
    """

    def __init__(self, window: int = 200) -> None:
        self.window = window
        self.returns = torch.zeros(window)
        self.lengths = torch.zeros(window)
        self.successes = torch.zeros(window)
        self.count = 0  # episodes seen over the run

    def add(self, info: dict[str, Any], done: torch.Tensor) -> None:
        if keys.EPISODE not in info or not bool(done.any()):
            return
        ep, idx = info[keys.EPISODE], done.nonzero().flatten()
        for dst, key in ((self.returns, keys.EP_RETURN), (self.lengths, keys.EP_LENGTH),
                         (self.successes, keys.EP_SUCCESS)):
            vals = ep[key][idx].float().cpu()
            pos = (torch.arange(len(vals)) + self.count) % self.window
            dst[pos] = vals
        self.count += len(idx)

    def summary(self) -> dict[str, float]:
        """Mean return, length and success rate over the window (empty until the window is full)."""
        k = self.window
        if self.count < k:
            return {"episode/count": float(self.count)}
        return {"episode/return": float(self.returns[:k].mean()), "episode/length": float(self.lengths[:k].mean()),
                # the share in float64: a float32 mean reads 180 of 200 as 0.8999999761, below stop_success_rate=0.9
                "episode/success_rate": float(self.successes[:k].sum()) / k, "episode/count": float(self.count)}

    def state_dict(self) -> dict[str, Any]:
        return {"returns": self.returns, "lengths": self.lengths, "successes": self.successes, "count": self.count}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.returns, self.lengths, self.successes = sd["returns"], sd["lengths"], sd["successes"]
        self.count = int(sd["count"])


def run_state(algo: Any, env: VecEnv, obs: Obs, runner: dict[str, Any]) -> dict[str, Any]:
    """The tree a checkpoint stores to continue bitwise: learner, env (physics, task, RNG; None when the env is not
    ``resumable``), current observations, the runner's counters and the global RNGs."""
    env_state = env.state_dict() if env.resumable else None
    return {"algo": algo.state_dict(), "env": env_state, "obs": obs, "runner": runner, "rng": rng_state()}


def restore_run_state(ckpt: Checkpoint, algo: Any, env: VecEnv, device: torch.device) -> tuple[Obs, dict[str, Any]]:
    """Inverse of ``run_state``; returns the observations to continue from and the runner's counters. Refuses an env
    that is not ``resumable`` (or a checkpoint written without env state) before anything is loaded."""
    state = ckpt.state
    if not env.resumable or state.get("env") is None:
        what = f"{type(env).__name__} is not resumable" if not env.resumable else "the checkpoint holds no env state"
        raise ValueError(f"cannot resume from {ckpt.path}: {what}, so the run cannot continue where it stopped. "
                         "Start a new run (the checkpoint's exported policy still loads).")
    algo.load_state_dict(state["algo"])
    env.load_state_dict(state["env"])
    set_rng_state(state["rng"])
    return to_device(state["obs"], device), state["runner"]


@dataclass
class RunLimits:
    """When a run stops, how often it logs and checkpoints: the fields every runner config shares."""

    total_steps: int | None = 300_000  # stop after this many env steps (summed over envs); None: no limit
    max_minutes: float | None = None  # stop after this much wall-clock (minutes, summed over resumes)
    checkpoint_every: int = 50  # iterations between checkpoints (the last iteration is always saved)
    stop_success_rate: float | None = None  # also stop once the rolling success rate reaches this (0..1]
    success_window: int = 200  # finished episodes in the rolling return / success statistics
    seed: int = 0  # seeds python/numpy/torch and the env.reset of a fresh run

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1 or self.success_window < 1:
            raise ValueError("checkpoint_every and success_window must be >= 1")
        if self.total_steps is None and self.max_minutes is None:
            raise ValueError("set total_steps or max_minutes (or both): the run needs a stopping rule")
        if self.total_steps is not None and self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1 env steps, got {self.total_steps}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0, got {self.max_minutes}")
        if self.stop_success_rate is not None and not 0.0 < self.stop_success_rate <= 1.0:
            raise ValueError(f"stop_success_rate must be in (0, 1] or null, got {self.stop_success_rate}")


def should_stop(cfg: RunLimits, summary: dict[str, float], env_steps: int, elapsed_s: float) -> bool:
    """The runners' stopping rule: ``cfg.total_steps`` env steps, ``cfg.max_minutes`` of training wall-clock, or a
    rolling success rate (``summary``: ``EpisodeStats.summary``'s) of at least ``cfg.stop_success_rate`` (each
    optional)."""
    success = summary.get("episode/success_rate")
    return ((cfg.total_steps is not None and env_steps >= cfg.total_steps)
            or (cfg.max_minutes is not None and elapsed_s >= 60.0 * cfg.max_minutes)
            or (cfg.stop_success_rate is not None and success is not None and success >= cfg.stop_success_rate))


class RunnerLoop:
    """The loop every runner shares: start, iterate until the stopping rule, checkpoint every ``checkpoint_every``
    iterations and at the end (checkpoint time is not training time). Subclasses own one iteration and the save;
    a runner without an env (offline) overrides ``start`` and ``_done``."""

    env: VecEnv | None
    cfg: Any  # RunLimits for the env runners; any config with checkpoint_every
    stats: EpisodeStats
    checkpoints: CheckpointManager | None
    device: torch.device
    obs: Obs | None
    iteration: int
    env_steps: int
    elapsed_s: float
    sim_s: float  # wall-clock inside env.step over the run (the simulator's share of elapsed_s)

    def step_env(self, action: torch.Tensor, actor: torch.Tensor | None = None
                 ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """``env.step`` on the env's device, its time added to ``sim_s``; ``actor`` (int [N] of ``keys.ACTOR_*``;
        None: the policy) says who chose each action. An env that does not reset itself (``autoreset`` off, like a
        real arm) has its ended envs reset here, so the runner continues from first observations of new episodes
        either way (``info[FINAL_OBS]`` keeps the last ones)."""
        start = time.perf_counter()
        action = action.to(self.env.device)
        step = self.env.step(action) if actor is None else self.env.step(action, actor=actor)
        obs, reward, terminated, truncated, info = step
        if not self.env.autoreset:
            ended = (terminated | truncated).nonzero().flatten()
            if len(ended):
                obs, _ = self.env.reset(env_ids=ended)
        self.sim_s += time.perf_counter() - start
        return obs, reward, terminated, truncated, info

    def start(self) -> None:
        """Reset the env with the run's seed unless the run already has observations (restored, or started);
        ``learn`` calls it, and so may a caller that drives ``run_iteration`` itself."""
        if self.obs is None:
            obs, _ = self.env.reset(seed=self.cfg.seed)
            self.obs = to_device(obs, self.device)

    def run_iteration(self) -> dict[str, float]:
        raise NotImplementedError

    def save(self) -> Any:
        raise NotImplementedError

    def _done(self) -> bool:
        return should_stop(self.cfg, self.episode_summary(), self.env_steps, self.elapsed_s)

    # ------------------------------------------------------------------------------------- data-parallel
    group: ProcessGroup | None = None  # the run's data-parallel ranks (robot_rl.distributed); None: one process
    _pooled: dict[str, float] | None = None

    @property
    def world_size(self) -> int:
        return 1 if self.group is None else self.group.world_size

    def checkpoint_state(self, runner: dict[str, Any]) -> dict[str, Any] | None:
        """The tree a checkpoint stores (``run_state``). Data-parallel: first a check that every rank's learner
        (networks, normalisers, optimizer moments) is bitwise the same (``RanksDivergedError`` if not), then rank 0
        gets every other rank's envs, observations, RNGs and counters under ``other_ranks``, so a resume continues
        each of them; the other ranks get None (rank 0 writes)."""
        state = run_state(self.algo, self.env, self.obs, runner)
        if self.group is None:
            return state
        local = self.algo.rank_state_keys  # this rank's own part of the learner (per-env noise and statistics)
        tensors, _ = flatten_tree({k: v for k, v in state["algo"].items() if k not in local})
        self.group.check_same(tensors.values(), "learners (networks, normalisers, optimizer state)")
        own = {k: state[k] for k in ("env", "obs", "runner", "rng")}
        own["algo"] = {k: state["algo"][k] for k in local}
        parts = self.group.gather_trees(None if self.group.main else own)
        if not self.group.main:
            return None
        return {**state, "other_ranks": parts[1:]}

    def restore_state(self, ckpt: Checkpoint) -> dict[str, Any]:
        """Inverse of ``checkpoint_state`` on this rank: learner, env, observations and RNGs restored; returns this
        rank's runner counters. Refuses a checkpoint written by another number of processes, before loading."""
        others = ckpt.state.get("other_ranks") or []
        check_world_size(len(others) + 1, self.world_size, ckpt.path)
        if self.group is not None and not self.group.main:
            part = others[self.group.rank - 1]
            algo = {**ckpt.state["algo"], **part.get("algo", {})}  # rank 0's learner with this rank's own part
            ckpt = Checkpoint(ckpt.path, {**ckpt.state, **part, "algo": algo}, ckpt.meta)
        self.obs, runner = restore_run_state(ckpt, self.algo, self.env, self.device)
        return runner

    def episode_summary(self) -> dict[str, float]:
        """The rolling episode statistics the run logs and stops on: this process's, or, data-parallel, every rank's
        windows pooled (``pool_ranks``), the same numbers on every rank."""
        if self.group is None:
            return self.stats.summary()
        return self._pooled if self._pooled is not None else {"episode/count": float(self.stats.count)}

    def pool_ranks(self) -> None:
        """Data-parallel, once per iteration on every rank (one all-reduce): the episode windows pooled into
        ``episode_summary`` (reported once every rank's window is full: each then holds its last ``window``
        episodes, so the pool is the last ``window × ranks`` episodes; ``robot-rl train`` gives each rank
        ``success_window / ranks``), and rank 0's clock as the run's, so the stopping rule decides the same on every
        rank."""
        if self.group is None:
            return
        s, k = self.stats, self.stats.window
        full = float(s.count >= k)
        v = torch.tensor([full, float(s.count), float(s.returns.sum()) * full, float(s.lengths.sum()) * full,
                          float(s.successes.sum()) * full, self.elapsed_s if self.group.main else 0.0],
                         dtype=torch.float64, device=self.group.device)
        full_ranks, count, ret, length, success, elapsed = self.group.sum_(v).tolist()
        self.elapsed_s = elapsed
        n = k * self.world_size
        self._pooled = {"episode/count": count}
        if full_ranks == self.world_size:
            self._pooled.update({"episode/return": ret / n, "episode/length": length / n,
                                 "episode/success_rate": success / n})

    def learn(self) -> dict[str, float]:
        """Train until the stopping rule; returns the last logged scalars."""
        self.start()
        self.pool_ranks()  # a resumed data-parallel run: every rank's restored windows, before the first stop check
        scalars: dict[str, float] = {}
        while not self._done():
            try:
                scalars = self.run_iteration()
            except NonFiniteError as e:
                last = self.checkpoints.latest() if self.checkpoints is not None else None
                raise NonFiniteError(f"{e}; the last good checkpoint is {last}") from e
            except OutputWriteError as e:  # the learning curve could not be written: say where to resume from
                last = self.checkpoints.latest() if self.checkpoints is not None else None
                raise OutputWriteError(e.path, e.cause, e.last_good or resume_hint(last)) from e.cause
            saves = self.checkpoints is not None or self.group is not None  # every rank takes part in a save
            if saves and (self._done() or self.iteration % self.cfg.checkpoint_every == 0):
                start = time.perf_counter()
                self.save()
                self.elapsed_s += time.perf_counter() - start
                self.pool_ranks()  # rank 0's clock again, now with its checkpoint time
        return scalars
