"""Dense rewards as potential-based shaping (DESIGN.md §5): r'_t = r_t + λ (γ Φ(o_{t+1}) − Φ(o_t)).

Shaping by a potential difference leaves the optimal policy unchanged (Ng, Harada & Russell, ICML 1999) while the
potential -- a learned progress model, a value model, a hand-written distance -- tells the learner at every step
whether it got closer. The task's own (sparse) reward stays in r_t.

Episode ends follow the contract's split (``robot_rl.env``): at a termination Φ(o_{t+1}) = 0 (an absorbing state
has no future to be closer to); at a time-out Φ is read on the true last observation (``info[FINAL_OBS]``), since
the episode was cut, not finished. Over an episode of T steps the shaping terms then sum (γ = 1) to
λ (Φ(o_T)·[not terminated] − Φ(o_0)): nothing a policy can farm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from policies import keys
from robot_rl.env import Obs, VecEnv, episode_mask

Potential = Callable[..., torch.Tensor]  # observations (every group, [N, ...]) [, instructions N] -> Φ float [N]


def shaping_term(phi: torch.Tensor, next_phi: torch.Tensor, terminated: torch.Tensor, gamma: float) -> torch.Tensor:
    """γ Φ(o_{t+1}) (0 where terminated) − Φ(o_t), [N]."""
    return gamma * torch.where(terminated, torch.zeros_like(next_phi), next_phi) - phi


class ShapedEnv(VecEnv):
    """A VecEnv whose reward carries ``scale`` × the shaping term of ``potential`` (module docstring); everything
    else is the inner env's. ``info[EPISODE]`` keeps the task's own return (success and return are reported as the
    task defines them); ``info[LOG]["reward/shaping"]`` is the step's mean term.

    Args:
        env: the inner env.
        potential: Φ, evaluated without gradients on every observation the learner sees.
        gamma: the learner's discount (shaping preserves optimal policies for this γ).
        scale: λ, the weight of the shaping term (reward units per unit of Φ).
        reads_instructions: call ``potential(obs, instructions)`` with each env's episode instruction (N strings):
            a progress model trained on several. An episode's last observation is scored with its own instruction,
            not with the one of the episode an auto-reset starts in its place.
    """

    def __init__(self, env: VecEnv, potential: Potential, gamma: float, scale: float = 1.0,
                 reads_instructions: bool = False) -> None:
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"shaping gamma must be in (0, 1], got {gamma}")
        self.env, self.potential, self.gamma, self.scale = env, potential, float(gamma), float(scale)
        self.reads_instructions = reads_instructions
        self.num_envs, self.device, self.obs_spec = env.num_envs, env.device, env.obs_spec
        self.action_dim, self.max_episode_length, self.control_dt = env.action_dim, env.max_episode_length, env.control_dt
        self.autoreset, self.resumable = env.autoreset, env.resumable
        self.phi = torch.zeros(env.num_envs, device=env.device)  # Φ(o_t) of each env's current observation

    @property
    def instructions(self) -> list[str]:  # type: ignore[override]
        return self.env.instructions

    def _phi(self, obs: Obs, instructions: list[str] | None = None) -> torch.Tensor:
        with torch.no_grad():
            if self.reads_instructions:
                phi = self.potential(obs, list(self.env.instructions) if instructions is None else instructions)
            else:
                phi = self.potential(obs)
            phi = phi.to(self.device, torch.float32).reshape(-1)
        if phi.shape != (self.num_envs,):
            raise ValueError(f"the potential must give one value per env [{self.num_envs}], got {list(phi.shape)}")
        return phi

    def reset(self, seed: int | None = None, env_ids: torch.Tensor | None = None) -> tuple[Obs, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, env_ids=env_ids)
        phi = self._phi(obs)
        if env_ids is None:
            self.phi = phi
        else:
            self.phi[env_ids] = phi[env_ids]
        return obs, info

    def step(self, action: torch.Tensor, actor: int | torch.Tensor | None = None
             ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        before = list(self.env.instructions) if self.reads_instructions else None  # the finishing episodes'
        obs, reward, terminated, truncated, info = self.env.step(action, actor)
        last = info.get(keys.FINAL_OBS, obs)  # the observation each action led to
        next_phi = self._phi(last, before)
        term = shaping_term(self.phi, next_phi, terminated.to(self.device), self.gamma) * self.scale
        done = episode_mask(terminated, truncated).to(self.device)
        if self.autoreset and bool(done.any()):  # reset rows now hold a new episode's first observation
            next_phi = torch.where(done, self._phi(obs), next_phi)
        self.phi = next_phi
        info.setdefault(keys.LOG, {})["reward/shaping"] = float(term.mean())
        return obs, reward + term.to(reward.device), terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        return {"env": self.env.state_dict(), "phi": self.phi.clone()} if self.resumable else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env.load_state_dict(state["env"])
        self.phi.copy_(state["phi"])

    def render(self, camera: str | None = None) -> torch.Tensor:
        return self.env.render(camera)

    def close(self) -> None:
        self.env.close()
