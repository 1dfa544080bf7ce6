"""Gaussian MLP actor: what PPO ships to the robot (config + weights + observation normalizer).

Saved as a folder ``config.json`` + ``model.safetensors`` (weights and normalizer statistics together), loadable
with ``GaussianPolicy.load(path)`` or ``policies.load_policy(path)`` without importing any algorithm code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from policies import keys
from policies.mlp import mlp
from policies.normalizer import EmpiricalNormalizer
from policies.persistence import CONFIG_FILE, WEIGHTS_FILE, load_policy_as, save_policy  # noqa: F401


@dataclass
class GaussianPolicyConfig:
    """Architecture of a Gaussian MLP actor."""

    obs_dim: int  # D, size of the observation group the actor reads
    action_dim: int  # A, actions in [-1, 1]
    hidden_dims: list[int] = field(default_factory=lambda: [256, 128, 64])  # units per hidden layer
    activation: str = "elu"  # one of policies.mlp.ACTIVATIONS
    init_std: float = 1.0  # initial action std (action units, [-1, 1] scale)
    normalize_obs: bool = True  # empirical running mean/var normalization of the input
    obs_key: str = keys.POLICY  # observation group read when act() gets a dict
    init: str = "default"  # weight init, policies.mlp.INITS ("orthogonal": √2 hidden, output_gain last layer)
    output_gain: float = 0.01  # orthogonal gain of the mean head (small: actions start near 0)

    def __post_init__(self) -> None:
        if self.obs_dim < 1 or self.action_dim < 1:
            raise ValueError(f"obs_dim and action_dim must be >= 1, got {self.obs_dim}, {self.action_dim}")
        if not self.init_std > 0:
            raise ValueError(f"init_std must be > 0, got {self.init_std}")


class GaussianPolicy(nn.Module):
    """π(a|o) = N(μ_θ(norm(o)), diag(exp(log_std)²)) with a state-independent learned log-std.

    Args:
        cfg: the architecture.
    """

    type_name = "gaussian"

    def __init__(self, cfg: GaussianPolicyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.normalizer = EmpiricalNormalizer(cfg.obs_dim) if cfg.normalize_obs else nn.Identity()
        self.mean_net = mlp(cfg.obs_dim, cfg.hidden_dims, cfg.action_dim, cfg.activation, cfg.init, cfg.output_gain)
        self.log_std = nn.Parameter(torch.full((cfg.action_dim,), math.log(cfg.init_std)))

    def _input(self, obs: dict[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
        return obs[self.cfg.obs_key] if isinstance(obs, dict) else obs

    def update_normalizer(self, obs: dict[str, torch.Tensor] | torch.Tensor) -> None:
        """Merge a batch into the running statistics (a no-op in eval mode or without normalization)."""
        if isinstance(self.normalizer, EmpiricalNormalizer):
            self.normalizer.update(self._input(obs))

    def forward(self, obs: dict[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """Mean action μ [B, A] for observations [B, D] (or a dict holding them under ``cfg.obs_key``)."""
        return self.mean_net(self.normalizer(self._input(obs)))

    def distribution(self, obs: dict[str, torch.Tensor] | torch.Tensor) -> torch.distributions.Normal:
        """The per-dimension Normal over actions [B, A]; sum ``log_prob`` over the last dim for the joint."""
        mean = self(obs)
        return torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean))

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor] | torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Actions [B, A] clipped to [-1, 1]: the mean, or a sample when ``deterministic`` is false."""
        action = self(obs) if deterministic else self.distribution(obs).sample()
        return action.clamp(-1.0, 1.0)

    # ------------------------------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` into the folder ``path`` (created if missing)."""
        save_policy(self, self.type_name, self.cfg, path)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> GaussianPolicy:
        """A policy saved by ``save``, in eval mode (normalizer frozen)."""
        return load_policy_as(cls, GaussianPolicyConfig, path, device)
