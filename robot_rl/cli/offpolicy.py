"""``robot-rl train ... algo=flashsac``: builds FlashSAC and its off-policy runner from the Hydra config."""

from __future__ import annotations

from typing import Any

import torch

from policies import keys
from policies.tanh_gaussian import TanhGaussianPolicy, TanhGaussianPolicyConfig
from robot_rl.algos.flashsac import FlashSAC, FlashSACConfig
from robot_rl.checkpoint import CheckpointManager
from robot_rl.cli.config import typed
from robot_rl.env import VecEnv
from robot_rl.logging import RunLogger
from robot_rl.models.q_critics import CategoricalQ, CategoricalQConfig
from robot_rl.runners.off_policy import OffPolicyRunner, OffPolicyRunnerConfig


def build_flashsac(algo_raw: dict[str, Any], env: VecEnv, device: torch.device) -> tuple[FlashSAC, dict[str, Any]]:
    """FlashSAC with a tanh-Gaussian actor on ``policy`` and the critics on ``critic`` (else ``policy``).

    Returns the learner and the runner's own keys of ``configs/algo/flashsac.yaml`` (steps_per_iteration,
    save_replay).
    """
    algo_raw = dict(algo_raw)
    shapes = env.obs_spec.shapes
    critic_key = keys.CRITIC if keys.CRITIC in shapes else keys.POLICY
    for k in (keys.POLICY, critic_key):
        if len(shapes[k]) != 1:
            raise ValueError(f"algo=flashsac needs a flat '{k}' observation, the env gives shape {shapes[k]}")
    runner_keys = {k: algo_raw.pop(k) for k in ("steps_per_iteration", "save_replay") if k in algo_raw}
    actor_cfg = typed(TanhGaussianPolicyConfig, {**algo_raw.pop("actor"), "obs_dim": shapes[keys.POLICY][0],
                                                 "action_dim": env.action_dim}, "algo.actor")
    cfg = typed(FlashSACConfig, {k: v for k, v in algo_raw.items() if k != "critic"}, "algo")
    critic_cfg = typed(CategoricalQConfig, {**algo_raw["critic"], "obs_dim": shapes[critic_key][0],
                                            "action_dim": env.action_dim, "obs_key": critic_key,
                                            "num_bins": cfg.num_bins, "v_min": cfg.v_min, "v_max": cfg.v_max},
                       "algo.critic")
    algo = FlashSAC(TanhGaussianPolicy(actor_cfg), CategoricalQ(critic_cfg), cfg, env.num_envs, device)
    return algo, runner_keys


def make_off_policy_runner(env: VecEnv, algo: FlashSAC, runner_keys: dict[str, Any], settings: Any,
                           checkpoint_every: int, logger: RunLogger, checkpoints: CheckpointManager,
                           meta: dict[str, Any]) -> OffPolicyRunner:
    """The runner for ``robot-rl train``; ``settings`` is the CLI's TrainSettings."""
    cfg = OffPolicyRunnerConfig(total_steps=settings.total_steps, max_minutes=settings.max_minutes,
                                checkpoint_every=checkpoint_every, stop_success_rate=settings.stop_success_rate,
                                success_window=settings.success_window,
                                seed=settings.seed, **runner_keys)
    return OffPolicyRunner(env, algo, cfg, logger, checkpoints, meta)
