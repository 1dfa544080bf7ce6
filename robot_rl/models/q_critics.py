"""Action-value critics for off-policy learners. They belong to the algorithm (never exported with the policy)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from policies import keys
from policies.modules.flash import FlashNet


@dataclass
class CategoricalQConfig:
    """An ensemble of distributional Q networks on FlashSAC's normalised residual network."""

    obs_dim: int  # Dc, size of the observation group the critic reads
    action_dim: int  # A
    hidden_dim: int = 128  # d, width of the residual stream (blocks are 4·d wide inside)
    num_blocks: int = 1  # inverted-residual blocks
    expansion: int = 4  # width multiplier inside a block
    num_bins: int = 101  # K, atoms of the return distribution
    v_min: float = -5.0  # lowest atom (scaled-return units)
    v_max: float = 5.0  # highest atom (scaled-return units)
    num_qs: int = 2  # ensemble size (2: the lower one sets the target)
    obs_key: str = keys.CRITIC  # observation group read (privileged state: asymmetric actor/critic)

    def __post_init__(self) -> None:
        if self.num_bins < 2 or not self.v_min < self.v_max or self.num_qs < 1:
            raise ValueError(f"need num_bins >= 2, v_min < v_max, num_qs >= 1; got {self.num_bins}, "
                             f"{self.v_min}, {self.v_max}, {self.num_qs}")


class CategoricalQ(nn.Module):
    """Z_i(o, a) = softmax(f_i(BN([o, a]))) over a fixed support z; Q_i(o, a) = Σ_j p_ij z_j, for i < num_qs."""

    def __init__(self, cfg: CategoricalQConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.nets = nn.ModuleList([FlashNet(cfg.obs_dim + cfg.action_dim, cfg.num_bins, cfg.hidden_dim,
                                            cfg.num_blocks, cfg.expansion) for _ in range(cfg.num_qs)])
        self.register_buffer("support", torch.linspace(cfg.v_min, cfg.v_max, cfg.num_bins))

    def forward(self, obs: dict[str, torch.Tensor] | torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Logits [num_qs, B, K] for observations [B, Dc] (or a dict of groups) and actions [B, A]."""
        x = torch.cat([obs[self.cfg.obs_key] if isinstance(obs, dict) else obs, action], dim=-1)
        return torch.stack([net(x) for net in self.nets])

    def expectation(self, logits: torch.Tensor) -> torch.Tensor:
        """Q = Σ_j softmax(logits)_j · z_j: [..., K] -> [...]."""
        return (torch.softmax(logits.float(), dim=-1) * self.support).sum(-1)
