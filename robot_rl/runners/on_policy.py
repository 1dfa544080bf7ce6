"""The on-policy loop: collect T steps of N envs -> GAE -> PPO update -> log -> checkpoint."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from policies import keys
from robot_rl.algos.base import OnPolicyAlgorithm
from robot_rl.buffers.rollout import RolloutBuffer
from robot_rl.checkpoint import Checkpoint, CheckpointManager
from robot_rl.env import VecEnv, episode_mask
from robot_rl.logging import RunLogger
from robot_rl.runners.common import (
    EpisodeStats,
    RunLimits,
    RunnerLoop,
    to_device,
    torch_threads,
)


@dataclass
class OnPolicyRunnerConfig(RunLimits):
    """How long to train and how often to log and checkpoint (``RunLimits``), and the rollout length."""

    num_steps: int = 24  # T, env steps per env per rollout
    # torch intra-op threads while the learner updates (None: as they are). The simulator is idle then, so the update
    # can have every core that collection leaves to MuJoCo's threads (``robot-rl train`` gives it all of them).
    update_threads: int | None = None

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError("num_steps must be >= 1")
        if self.update_threads is not None and self.update_threads < 1:
            raise ValueError(f"update_threads must be >= 1 or None, got {self.update_threads}")
        super().__post_init__()


class OnPolicyRunner(RunnerLoop):
    """Owns the loop; the algorithm never sees the env, the env never sees the algorithm.

    Args:
        env: the batched env (any device; tensors are moved to ``algo.device``).
        algo: the learner.
        cfg: the loop's settings.
        logger: progress bar / scalar sinks / learning curve.
        checkpoints: where checkpoints go.
        meta: JSON written into every checkpoint (task, obs/action spec, config) for resume checks.
    """

    def __init__(self, env: VecEnv, algo: OnPolicyAlgorithm, cfg: OnPolicyRunnerConfig, logger: RunLogger,
                 checkpoints: CheckpointManager, meta: dict[str, Any]) -> None:
        self.env, self.algo, self.cfg, self.logger = env, algo, cfg, logger
        self.checkpoints, self.meta = checkpoints, meta
        self.device = algo.device
        groups = algo.obs_groups
        self.buffer = RolloutBuffer(cfg.num_steps, env.num_envs, {g: env.obs_spec.shapes[g] for g in groups},
                                    env.action_dim, self.device, {g: env.obs_spec.dtype(g) for g in groups},
                                    extras=algo.rollout_fields)
        self.stats = EpisodeStats(cfg.success_window)
        self.iteration, self.env_steps, self.elapsed_s = 0, 0, 0.0
        self.sim_s = 0.0  # wall-clock inside env.step, summed over the run (the simulator's share of elapsed_s)
        self.obs: dict[str, torch.Tensor] | None = None

    def restore(self, ckpt: Checkpoint) -> None:
        """Continue from a checkpoint: learner, env, observations, RNGs and counters as they were."""
        runner = self.restore_state(ckpt)
        self.iteration, self.env_steps, self.elapsed_s = runner["iteration"], runner["env_steps"], runner["elapsed_s"]
        self.sim_s = float(runner.get("sim_s", 0.0))  # absent from checkpoints written before it was kept
        self.stats.load_state_dict(runner["stats"])

    def run_iteration(self) -> dict[str, float]:
        start = time.perf_counter()
        env, algo, buf, obs = self.env, self.algo, self.buffer, self.obs
        algo.train_mode()
        log_sums: dict[str, float] = {}
        sim_start = self.sim_s
        with torch.no_grad():
            for _ in range(self.cfg.num_steps):
                action, extras = algo.act(obs)
                next_obs, reward, terminated, truncated, info = self.step_env(action)
                next_obs = to_device(next_obs, self.device)
                terminated, truncated = terminated.to(self.device), truncated.to(self.device)
                reward = algo.bootstrap_time_outs(reward.to(self.device), truncated,
                                                  to_device(info[keys.FINAL_OBS], self.device))
                done = episode_mask(terminated, truncated)
                buf.add(obs, action, reward, done, extras, info.get(keys.FAULTED))
                self.stats.add(info, done)
                for k, v in info.get(keys.LOG, {}).items():
                    log_sums[k] = log_sums.get(k, 0.0) + v if k.startswith("reward/") else v
                obs = next_obs
            algo.finish_rollout(buf, obs)
        collect_s = time.perf_counter() - start
        with torch_threads(self.cfg.update_threads):
            losses = algo.update(buf)
        buf.clear()
        self.obs = obs
        steps = self.cfg.num_steps * env.num_envs * self.world_size  # every rank's envs (data-parallel)
        self.iteration += 1
        self.env_steps += steps
        dt = time.perf_counter() - start
        self.elapsed_s += dt
        self.pool_ranks()
        summary = self.episode_summary()
        scalars = {k: (v / self.cfg.num_steps if k.startswith("reward/") else v) for k, v in log_sums.items()}
        scalars.update(losses)
        scalars.update(summary)
        scalars.update({"perf/fps": steps / dt, "perf/collect_fraction": collect_s / dt,
                        "perf/sim_fraction": (self.sim_s - sim_start) / dt, "perf/iteration": self.iteration})
        self.logger.scalars(self.env_steps, scalars)
        ret, succ = summary.get("episode/return"), summary.get("episode/success_rate")
        self.logger.progress(steps, ret, succ)
        self.logger.curve_point({"iteration": self.iteration, "env_steps": self.env_steps, "wall_s": self.elapsed_s,
                                 "sim_s": self.sim_s, "success_rate": succ, "mean_return": ret})
        return scalars

    def save(self) -> None:
        """Checkpoint now (score: the rolling mean return, for keeping the best)."""
        runner = {"iteration": self.iteration, "env_steps": self.env_steps, "elapsed_s": self.elapsed_s,
                  "sim_s": self.sim_s, "stats": self.stats.state_dict()}
        state = self.checkpoint_state(runner)
        if state is None:  # a data-parallel rank other than 0: its part went to rank 0
            return
        self.checkpoints.save(self.iteration, state, {**self.meta, "env_steps": self.env_steps},
                              policy=self.algo.policy, score=self.episode_summary().get("episode/return"))
