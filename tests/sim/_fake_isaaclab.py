"""A STAND-IN for an Isaac Lab RL env, for testing ``sim/isaaclab.py`` quickly and without Isaac Lab installed.

Isaac Lab needs Python 3.12 and an environment of its own (it pins torch, warp, newton, transformers ...), so
this project's venv does not carry it, and a real task takes minutes to build and step on a CPU (see
tests/sim/test_isaaclab.py). This class reproduces the interface and the behaviour the adapter relies on, as
they are in Isaac Lab 3.0.0 (``isaaclab/envs/manager_based_rl_env.py``,
``direct_rl_env.py``, ``managers/termination_manager.py``, ``managers/reward_manager.py``); it is not Isaac Lab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium
import numpy as np
import torch


@dataclass
class FakeEnvCfg:
    """The fields of ``ManagerBasedRLEnvCfg`` / ``DirectRLEnvCfg`` the adapter reads."""

    is_finite_horizon: bool = False  # True: Isaac Lab's wrappers send no time-out signal
    compute_final_obs: bool = True  # True: extras["final_obs"] holds the pre-reset observation on reset steps
    episode_length_s: float = 5.0  # s; max_episode_length = ceil(episode_length_s / step_dt) = 40
    seed: int | None = None


class FakeTerminationManager:
    """Stands in for ``isaaclab.managers.TerminationManager``: named terms, ``get_term`` valid after the reset."""

    active_terms: ClassVar[list[str]] = ["time_out", "success"]

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self._term_dones = torch.zeros(num_envs, len(self.active_terms), dtype=torch.bool, device=device)

    def get_term(self, name: str) -> torch.Tensor:
        return self._term_dones[:, self.active_terms.index(name)]


class FakeIsaacLabEnv(gymnasium.Env):
    """Stands in for Isaac Lab's ``ManagerBasedRLEnv`` (not installed in this venv): a 1-D point mass to drive
    to the origin, batched in torch, with Isaac Lab's step/reset signatures and same-step auto-reset.

    x' = x + 0.1·a (the action term's scale), reward −|x|, terminated ("success" term) when |x| < 0.05,
    time-out ("time_out" term) after 40 steps. Observation groups: ``policy`` = [x]; ``critic`` = [x, t/T]
    (Isaac Lab's privileged group; absent with ``critic=False``, as in a ``DirectRLEnv`` without a state space).

    Like Isaac Lab, it rewrites ``reward_buf``, ``reset_terminated`` and ``reset_time_outs`` in place every step
    and keeps one ``extras`` dict whose ``"log"`` is refilled only when envs reset.
    """

    is_vector_env = True

    def __init__(self, num_envs: int = 64, device: str = "cpu", cfg: FakeEnvCfg | None = None, critic: bool = True,
                 action_space: gymnasium.spaces.Box | None = None) -> None:
        self.cfg = cfg or FakeEnvCfg()
        self.num_envs, self.device = num_envs, torch.device(device)
        self.step_dt = 0.125  # s per env step (sim.dt * decimation)
        policy = gymnasium.spaces.Box(-np.inf, np.inf, (1,))
        groups = {"policy": policy, **({"critic": gymnasium.spaces.Box(-np.inf, np.inf, (2,))} if critic else {})}
        self.single_observation_space = gymnasium.spaces.Dict(groups)
        self.single_action_space = action_space or gymnasium.spaces.Box(-np.inf, np.inf, (1,))  # Isaac Lab: unbounded
        self.termination_manager = FakeTerminationManager(num_envs, self.device)
        self.gen = torch.Generator().manual_seed(0)
        n, dev = num_envs, self.device
        self.x = torch.zeros(n, device=dev)
        self.episode_length_buf = torch.zeros(n, dtype=torch.long, device=dev)
        self.reward_buf = torch.zeros(n, device=dev)
        self.reset_terminated = torch.zeros(n, dtype=torch.bool, device=dev)
        self.reset_time_outs = torch.zeros(n, dtype=torch.bool, device=dev)
        self._episode_sum = torch.zeros(n, device=dev)
        self.extras: dict[str, Any] = {}
        self.actions_received: list[torch.Tensor] = []  # what reached the "simulator"
        self.closed = False

    @property
    def max_episode_length(self) -> int:
        return math.ceil(self.cfg.episode_length_s / self.step_dt)

    def seed(self, seed: int = -1) -> int:
        self.gen.manual_seed(seed)  # Isaac Lab's configure_seed seeds torch/numpy/random/warp globally
        return seed

    def _observations(self) -> dict[str, torch.Tensor]:
        obs = {"policy": self.x[:, None].clone()}
        if "critic" in self.single_observation_space.spaces:
            obs["critic"] = torch.stack([self.x, self.episode_length_buf.float() / self.max_episode_length], 1)
        return obs

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        # reward_manager.reset: mean episodic sum over the reset envs / episode_length_s; termination rates
        success_rate = self.termination_manager.get_term("success").float().mean()
        self.extras["log"] = {"Episode_Reward/distance": self._episode_sum[env_ids].mean() / self.cfg.episode_length_s,
                              "Episode_Termination/success": success_rate}
        u = torch.rand(2, len(env_ids), generator=self.gen).to(self.device)
        self.x[env_ids] = torch.where(u[0] < 0.5, -1.0, 1.0) * (0.3 + 0.7 * u[1])
        self.episode_length_buf[env_ids] = 0
        self._episode_sum[env_ids] = 0.0

    def reset(self, env_ids: torch.Tensor | slice | None = None, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        if seed is not None:
            self.seed(seed)
        ids = torch.arange(self.num_envs, device=self.device)[env_ids if env_ids is not None else slice(None)]
        self._reset_idx(ids)
        return self._observations(), self.extras

    def step(self, action: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor,
                                                   torch.Tensor, dict[str, Any]]:
        action = action.to(self.device)
        self.actions_received.append(action.clone())
        self.x = self.x + 0.1 * action[:, 0]
        self.episode_length_buf += 1
        terms = self.termination_manager._term_dones
        terms[:, 0] = self.episode_length_buf >= self.max_episode_length
        terms[:, 1] = self.x.abs() < 0.05
        self.reset_time_outs[:], self.reset_terminated[:] = terms[:, 0], terms[:, 1]
        self.reward_buf[:] = -self.x.abs()
        self._episode_sum += self.reward_buf
        reset_ids = (self.reset_terminated | self.reset_time_outs).nonzero().flatten()
        if len(reset_ids) > 0:
            if self.cfg.compute_final_obs:
                self.extras["final_obs"] = self._observations()
            self._reset_idx(reset_ids)
        return self._observations(), self.reward_buf, self.reset_terminated, self.reset_time_outs, self.extras

    def close(self) -> None:
        self.closed = True
