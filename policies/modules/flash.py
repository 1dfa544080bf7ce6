"""FlashSAC's normalised residual network (DESIGN.md §5): bounded weights and features so bootstrapping stays stable.

    x  = W_in · BN(o)                                      (BatchNorm on the raw input: it is the normaliser)
    x ← x + ReLU(BN(W2 · ReLU(BN(W1 · x))))                 per block, W1: d → 4d, W2: 4d → d ("inverted")
    y  = W_out · RMSNorm(x) + b_out

After every optimizer step ``project_to_unit_norm`` puts the parameters back on their spheres: each row of every
linear weight to unit L2 norm, every BatchNorm's (scale, shift) and every RMSNorm's scale to norm √d. Only the
output bias is free. The BatchNorm running statistics travel with the weights, so an exported network
normalises its inputs by itself.
"""

from __future__ import annotations

import math

import torch
from torch import nn

BN_MOMENTUM = 0.01  # running-statistics update rate of every BatchNorm (slow: the replay data drifts slowly)


class FlashBlock(nn.Module):
    """x + ReLU(BN(W2 · ReLU(BN(W1 · x)))) with W1: d → e·d, W2: e·d → d, no biases (BN shifts instead)."""

    def __init__(self, dim: int, expansion: int = 4) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, expansion * dim, bias=False)
        self.bn1 = nn.BatchNorm1d(expansion * dim, momentum=BN_MOMENTUM)
        self.w2 = nn.Linear(expansion * dim, dim, bias=False)
        self.bn2 = nn.BatchNorm1d(dim, momentum=BN_MOMENTUM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.w1(x)))
        return x + torch.relu(self.bn2(self.w2(h)))


class FlashNet(nn.Module):
    """BN(input) → linear embed → ``num_blocks`` inverted-residual blocks → RMSNorm → linear head with bias.

    Args:
        in_dim: input features.
        out_dim: outputs.
        hidden_dim: d, the residual stream's width.
        num_blocks: residual blocks.
        expansion: width multiplier inside a block (4 in FlashSAC).
    """

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int = 128, num_blocks: int = 1,
                 expansion: int = 4) -> None:
        super().__init__()
        if min(in_dim, out_dim, hidden_dim, expansion) < 1 or num_blocks < 0:
            raise ValueError(f"bad FlashNet sizes: in {in_dim}, out {out_dim}, hidden {hidden_dim}, "
                             f"blocks {num_blocks}, expansion {expansion}")
        self.in_norm = nn.BatchNorm1d(in_dim, momentum=BN_MOMENTUM)
        self.embed = nn.Linear(in_dim, hidden_dim, bias=False)
        self.blocks = nn.Sequential(*[FlashBlock(hidden_dim, expansion) for _ in range(num_blocks)])
        self.out_norm = nn.RMSNorm(hidden_dim, eps=1e-6)
        self.head = nn.Linear(hidden_dim, out_dim)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.orthogonal_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        project_to_unit_norm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, in_dim] -> [B, out_dim]."""
        return self.head(self.out_norm(self.blocks(self.embed(self.in_norm(x)))))


@torch.no_grad()
def project_to_unit_norm(module: nn.Module, eps: float = 1e-8) -> None:
    """Project the parameters of every linear and norm layer inside ``module`` back onto their spheres.

    * ``nn.Linear`` weight [out, in]: each row w_i ← w_i / ‖w_i‖₂ (biases untouched).
    * ``nn.BatchNorm1d`` (γ, β) [d] each: (γ, β) ← (γ, β) · √d / ‖(γ, β)‖₂, jointly (γ = 1, β = 0 is on it).
    * ``nn.RMSNorm`` γ [d]: γ ← γ · √d / ‖γ‖₂.

    Call after every optimizer step (and after initialisation).
    """
    for m in module.modules():
        if isinstance(m, nn.Linear):
            w = m.weight
            w.div_(w.norm(dim=1, keepdim=True).clamp_min(eps))
        elif isinstance(m, nn.BatchNorm1d) and m.affine:
            d = m.weight.numel()
            scale = math.sqrt(d) / torch.sqrt(m.weight.square().sum() + m.bias.square().sum()).clamp_min(eps)
            m.weight.mul_(scale)
            m.bias.mul_(scale)
        elif isinstance(m, nn.RMSNorm) and m.weight is not None:
            d = m.weight.numel()
            m.weight.mul_(math.sqrt(d) / m.weight.norm().clamp_min(eps))
