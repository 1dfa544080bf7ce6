"""State-value critics. They belong to the algorithm (never exported with the policy)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from policies import keys
from policies.mlp import mlp
from policies.normalizer import EmpiricalNormalizer


@dataclass
class CriticConfig:
    """Architecture of an MLP state-value critic."""

    obs_dim: int  # Dc, size of the observation group the critic reads
    hidden_dims: list[int] = field(default_factory=lambda: [256, 128, 64])  # units per hidden layer
    activation: str = "elu"  # one of policies.mlp.ACTIVATIONS
    normalize_obs: bool = True  # empirical running mean/var normalization of the input
    obs_key: str = keys.CRITIC  # observation group read (privileged state: asymmetric actor/critic)
    init: str = "orthogonal"  # weight init, policies.mlp.INITS: √2 on hidden layers, output_gain on the value head
    output_gain: float = 1.0  # orthogonal gain of the value head

    def __post_init__(self) -> None:
        if self.obs_dim < 1:
            raise ValueError(f"critic obs_dim must be >= 1, got {self.obs_dim}")


class MLPCritic(nn.Module):
    """V(o) = MLP(norm(o[obs_key])) -> [B]."""

    def __init__(self, cfg: CriticConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.normalizer = EmpiricalNormalizer(cfg.obs_dim) if cfg.normalize_obs else nn.Identity()
        self.net = mlp(cfg.obs_dim, cfg.hidden_dims, 1, cfg.activation, cfg.init, cfg.output_gain)

    def _input(self, obs: dict[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
        return obs[self.cfg.obs_key] if isinstance(obs, dict) else obs

    def update_normalizer(self, obs: dict[str, torch.Tensor] | torch.Tensor) -> None:
        if isinstance(self.normalizer, EmpiricalNormalizer):
            self.normalizer.update(self._input(obs))

    def forward(self, obs: dict[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """Values [B] for observations [B, Dc] (or a dict holding them under ``cfg.obs_key``)."""
        return self.net(self.normalizer(self._input(obs))).squeeze(-1)
