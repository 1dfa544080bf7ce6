"""The off-policy loop: act -> step -> store -> update (UTD) -> log -> checkpoint, the replay buffer included."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from policies import keys
from robot_rl.algos.base import OffPolicyAlgorithm
from robot_rl.buffers.interventions import Interventions, Sources
from robot_rl.buffers.replay import ReplayBuffer, Source
from robot_rl.checkpoint import Checkpoint, CheckpointManager
from robot_rl.env import VecEnv, episode_mask
from robot_rl.hil.agent import InterventionAgent
from robot_rl.logging import RunLogger
from robot_rl.runners.common import EpisodeStats, RunLimits, RunnerLoop, to_device


@dataclass
class OffPolicyRunnerConfig(RunLimits):
    """How long to train and how often to log and checkpoint (``RunLimits``), and the iteration length."""

    steps_per_iteration: int = 16  # vector env steps between log points (the unit of checkpoint_every)
    save_replay: bool = True  # the replay buffer goes into checkpoints (exact resume needs it)

    def __post_init__(self) -> None:
        if self.steps_per_iteration < 1:
            raise ValueError("steps_per_iteration must be >= 1")
        super().__post_init__()


class OffPolicyRunner(RunnerLoop):
    """Owns the loop and the replay buffer; the algorithm samples from it and never sees the env.

    Args:
        env: the batched env (any device; tensors are moved to ``algo.device``).
        algo: the learner.
        cfg: the loop's settings.
        logger: progress bar / scalar sinks / learning curve.
        checkpoints: where checkpoints go (None: none are written).
        meta: JSON written into every checkpoint (task, obs/action spec, config) for resume checks.
        demo: an optional second buffer (demos) mixed into every batch (RLPD).
        hil: an optional intervention agent: a person (a scripted expert in simulation) takes over where its trigger
            asks; their transitions go into the replay like any (tagged ``keys.ACTOR``) and also make up RLPD's
            offline half, with the demos where there are some (HIL-SERL).
    """

    def __init__(self, env: VecEnv, algo: OffPolicyAlgorithm, cfg: OffPolicyRunnerConfig, logger: RunLogger,
                 checkpoints: CheckpointManager | None, meta: dict[str, Any], demo: ReplayBuffer | None = None,
                 hil: InterventionAgent | None = None) -> None:
        self.env, self.algo, self.cfg, self.logger = env, algo, cfg, logger
        self.checkpoints, self.meta = checkpoints, meta
        self.device, self.demo, self.hil = algo.device, demo, hil
        if hil is not None and hil.num_envs != env.num_envs:
            raise ValueError(f"the intervention agent watches {hil.num_envs} envs, the env has {env.num_envs}")
        groups = algo.obs_groups
        self.replay = ReplayBuffer(algo.replay_capacity, env.num_envs, {g: env.obs_spec.shapes[g] for g in groups},
                                   env.action_dim, self.device, {g: env.obs_spec.dtype(g) for g in groups})
        # what the learner mixes into every batch: the demos, the interventions, or both
        self.offline: Source | None = demo
        if hil is not None:
            self.offline = Interventions(self.replay) if demo is None else Sources(demo, Interventions(self.replay))
        self.stats = EpisodeStats(cfg.success_window)
        self.iteration, self.env_steps, self.elapsed_s, self.update_debt = 0, 0, 0.0, 0.0
        self.sim_s = 0.0  # wall-clock inside env.step, summed over the run (the simulator's share of elapsed_s)
        self.obs: dict[str, torch.Tensor] | None = None

    def restore(self, ckpt: Checkpoint) -> None:
        """Continue from a checkpoint: learner, env, observations, replay, RNGs and counters as they were."""
        runner = self.restore_state(ckpt)
        self.iteration, self.env_steps, self.elapsed_s = runner["iteration"], runner["env_steps"], runner["elapsed_s"]
        self.update_debt = float(runner["update_debt"])
        self.sim_s = float(runner.get("sim_s", 0.0))  # absent from checkpoints written before it was kept
        self.stats.load_state_dict(runner["stats"])
        if "replay" in runner:
            self.replay.load_state_dict(runner["replay"])
        if self.hil is not None:  # the counts continue; the person's plan starts afresh (it is not checkpointed)
            if "hil" in runner:
                self.hil.load_state_dict(runner["hil"])
            else:
                self.hil.restart()

    def run_iteration(self) -> dict[str, float]:
        """``steps_per_iteration`` vector steps, each followed by its share of gradient updates; then log."""
        start = time.perf_counter()
        env, algo, obs, utd = self.env, self.algo, self.obs, self.algo.updates_per_step
        log_sums: dict[str, float] = {}
        losses: dict[str, list[float | torch.Tensor]] = {}
        update_s, sim_start = 0.0, self.sim_s
        hil_steps = 0
        for _ in range(self.cfg.steps_per_iteration):
            warmup = self.replay.num_transitions < algo.learning_starts
            action = algo.random_action(env.num_envs) if warmup else algo.act(obs)
            actor = None
            if self.hil is not None:  # the person watches and may take over, also while the policy warms up
                action, actor = self.hil(obs, action)
                hil_steps += int((actor != keys.ACTOR_POLICY).sum())
            next_obs, reward, terminated, truncated, info = self.step_env(action, actor)
            next_obs = to_device(next_obs, self.device)
            reward, terminated, truncated = (x.to(self.device) for x in (reward, terminated, truncated))
            # the action the env applied (clipped, a rejected row zeroed; a person's, once one acts): what led to o'
            applied = info.get(keys.APPLIED_ACTION)
            self.replay.add(obs, action if applied is None else applied.to(self.device), reward, terminated,
                            truncated, next_obs, to_device(info[keys.FINAL_OBS], self.device),
                            info.get(keys.FAULTED), info.get(keys.ACTOR))
            algo.observe(reward, terminated, truncated)
            done = episode_mask(terminated, truncated)
            # with a person taking over, the rolling statistics (and the stop rule) count the policy's own episodes
            self.stats.add(info, done if self.hil is None else self.hil.alone(done))
            if self.hil is not None:
                self.hil.end(done, info[keys.EPISODE][keys.EP_SUCCESS] if keys.EPISODE in info else None)
            for k, v in info.get(keys.LOG, {}).items():
                log_sums[k] = log_sums.get(k, 0.0) + v if k.startswith("reward/") else v
            obs = next_obs
            if not warmup:
                t0 = time.perf_counter()
                algo.train_mode()
                self.update_debt += utd
                while self.update_debt >= 1.0:
                    self.update_debt -= 1.0
                    for k, v in algo.update(self.replay, self.offline).items():
                        losses.setdefault(k, []).append(v)
                update_s += time.perf_counter() - t0
        self.obs = obs
        steps = self.cfg.steps_per_iteration * env.num_envs * self.world_size  # every rank's envs (data-parallel)
        self.iteration += 1
        self.env_steps += steps
        dt = time.perf_counter() - start
        self.elapsed_s += dt
        self.pool_ranks()
        scalars = {k: (v / self.cfg.steps_per_iteration if k.startswith("reward/") else v) for k, v in log_sums.items()}
        scalars.update(mean_stats(losses))
        summary = self.episode_summary()
        scalars.update(summary)
        point: dict[str, Any] = {}
        if self.hil is not None:
            point["intervention_rate"] = hil_steps / steps  # this iteration's share of env steps the person drove
            scalars.update({**self.hil.report(), "hil/intervention_rate_iteration": point["intervention_rate"],
                            "replay/interventions": self.replay.num_interventions})
        scalars.update({"perf/fps": steps / dt, "perf/update_fraction": update_s / dt,
                        "perf/sim_fraction": (self.sim_s - sim_start) / dt, "perf/iteration": self.iteration,
                        "replay/transitions": self.replay.num_transitions})
        self.logger.scalars(self.env_steps, scalars)
        ret, succ = summary.get("episode/return"), summary.get("episode/success_rate")
        self.logger.progress(steps, ret, succ)
        self.logger.curve_point({"iteration": self.iteration, "env_steps": self.env_steps, "wall_s": self.elapsed_s,
                                 "sim_s": self.sim_s, "success_rate": succ, "mean_return": ret, **point})
        return scalars

    def save(self) -> None:
        """Checkpoint now (score: the rolling mean return, for keeping the best)."""
        runner = {"iteration": self.iteration, "env_steps": self.env_steps, "elapsed_s": self.elapsed_s,
                  "sim_s": self.sim_s, "update_debt": self.update_debt, "stats": self.stats.state_dict()}
        if self.cfg.save_replay:
            runner["replay"] = self.replay.state_dict()
        if self.hil is not None:
            runner["hil"] = self.hil.state_dict()
        state = self.checkpoint_state(runner)
        if state is None:  # a data-parallel rank other than 0: its part went to rank 0
            return
        self.checkpoints.save(self.iteration, state, {**self.meta, "env_steps": self.env_steps},
                              policy=self.algo.policy, score=self.episode_summary().get("episode/return"))


def mean_stats(stats: dict[str, list[float | torch.Tensor]]) -> dict[str, float]:
    """Per-key means of update statistics; the device tensors among them cross to the host in one transfer."""
    out = {k: sum(v) / len(v) for k, v in stats.items() if not any(isinstance(x, torch.Tensor) for x in v)}
    keys_t = [k for k in stats if k not in out]
    if keys_t:
        means = torch.stack([torch.stack([torch.as_tensor(x).to(torch.float64) for x in stats[k]]).mean()
                             for k in keys_t])
        out.update(zip(keys_t, means.tolist(), strict=True))
    return out
