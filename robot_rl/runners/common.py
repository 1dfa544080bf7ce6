"""What every runner shares: rolling episode statistics, the run's resumable state, device moves."""

from __future__ import annotations

from typing import Any

import torch

from robot_rl import keys
from robot_rl.checkpoint import Checkpoint, rng_state, set_rng_state
from robot_rl.env import Obs, VecEnv


def to_device(obs: Obs, device: torch.device) -> Obs:
    """Move an observation dict (no-op when already there)."""
    return {k: v.to(device, non_blocking=True) for k, v in obs.items()}


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
                "episode/success_rate": float(self.successes[:k].mean()), "episode/count": float(self.count)}

    def state_dict(self) -> dict[str, Any]:
        return {"returns": self.returns, "lengths": self.lengths, "successes": self.successes, "count": self.count}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.returns, self.lengths, self.successes = sd["returns"], sd["lengths"], sd["successes"]
        self.count = int(sd["count"])


def run_state(algo: Any, env: VecEnv, obs: Obs, runner: dict[str, Any]) -> dict[str, Any]:
    """The tree a checkpoint stores to continue bitwise: learner, env (physics, task, RNG), current
    observations, the runner's counters and the global RNGs."""
    return {"algo": algo.state_dict(), "env": env.state_dict(), "obs": obs, "runner": runner, "rng": rng_state()}


def restore_run_state(ckpt: Checkpoint, algo: Any, env: VecEnv, device: torch.device) -> tuple[Obs, dict[str, Any]]:
    """Inverse of ``run_state``; returns the observations to continue from and the runner's counters."""
    state = ckpt.state
    algo.load_state_dict(state["algo"])
    env.load_state_dict(state["env"])
    set_rng_state(state["rng"])
    return to_device(state["obs"], device), state["runner"]


def should_stop(cfg: Any, stats: EpisodeStats, env_steps: int, elapsed_s: float) -> bool:
    """The runners' stopping rule: ``cfg.total_steps`` env steps, ``cfg.max_minutes`` of training wall-clock, or a
    rolling success rate of at least ``cfg.stop_success_rate`` (each optional)."""
    success = stats.summary().get("episode/success_rate")
    return ((cfg.total_steps is not None and env_steps >= cfg.total_steps)
            or (cfg.max_minutes is not None and elapsed_s >= 60.0 * cfg.max_minutes)
            or (cfg.stop_success_rate is not None and success is not None and success >= cfg.stop_success_rate))
