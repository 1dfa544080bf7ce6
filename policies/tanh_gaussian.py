"""Tanh-Gaussian actor on FlashSAC's normalised network: what FlashSAC ships to the robot.

Saved as a folder ``config.json`` + ``model.safetensors`` (weights and the input BatchNorm's running statistics
together), loadable with ``TanhGaussianPolicy.load(path)`` or ``policies.load_policy(path)`` without any
algorithm code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from policies import keys
from policies.base import Policy
from policies.gaussian import default_processor
from policies.modules.flash import FlashNet
from policies.processor import Processor


@dataclass
class TanhGaussianPolicyConfig:
    """Architecture of a tanh-Gaussian actor."""

    obs_dim: int  # D, size of the observation group the actor reads
    action_dim: int  # A, actions in [-1, 1]
    hidden_dim: int = 128  # d, width of the residual stream (blocks are 4·d wide inside)
    num_blocks: int = 1  # inverted-residual blocks
    expansion: int = 4  # width multiplier inside a block
    log_std_min: float = -5.0  # lower bound of the pre-tanh log-std (nats)
    log_std_max: float = 0.0  # upper bound of the pre-tanh log-std (nats)
    obs_key: str = keys.POLICY  # observation group read when act() gets a dict

    def __post_init__(self) -> None:
        if self.obs_dim < 1 or self.action_dim < 1:
            raise ValueError(f"obs_dim and action_dim must be >= 1, got {self.obs_dim}, {self.action_dim}")
        if not self.log_std_min < self.log_std_max:
            raise ValueError(f"need log_std_min < log_std_max, got {self.log_std_min}, {self.log_std_max}")


def tanh_log_det_jacobian(u: torch.Tensor) -> torch.Tensor:
    """log(1 − tanh(u)²) = 2 · (log 2 − u − softplus(−2u)), stable for large |u|."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


class TanhGaussianPolicy(Policy):
    """π(a|o): a = tanh(u), u ~ N(μ(o), σ(o)²), log σ squashed into [log_std_min, log_std_max].

    The network's first layer is a BatchNorm over the raw observation (it replaces an empirical normaliser):
    in training mode it uses batch statistics, in eval mode (collection, deployment) its running ones.

    Args:
        cfg: the architecture.
        processor: features (default: ``cfg.obs_key`` of size ``cfg.obs_dim``; no normaliser, BatchNorm does it).
    """

    type_name = "tanh_gaussian"
    config_class = TanhGaussianPolicyConfig

    def __init__(self, cfg: TanhGaussianPolicyConfig, processor: Processor | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.processor = processor or default_processor(cfg.obs_key, cfg.obs_dim, cfg.action_dim, normalize=False)
        self.net = FlashNet(cfg.obs_dim, 2 * cfg.action_dim, cfg.hidden_dim, cfg.num_blocks, cfg.expansion)

    def _input(self, obs: dict[str, torch.Tensor] | torch.Tensor) -> torch.Tensor:
        return obs[self.cfg.obs_key] if isinstance(obs, dict) else obs

    def forward(self, obs: dict[str, torch.Tensor] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(μ [B, A], log σ [B, A]) of the pre-tanh Gaussian for observations [B, D] (or a dict of groups)."""
        mean, raw = self.net(self._input(obs)).chunk(2, dim=-1)
        lo, hi = self.cfg.log_std_min, self.cfg.log_std_max
        return mean, lo + 0.5 * (hi - lo) * (1.0 + torch.tanh(raw))  # log σ ∈ [lo, hi]

    def sample(self, obs: dict[str, torch.Tensor] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised sample: (a [B, A] in (−1, 1), log π(a|o) [B]) with the tanh change of variables,
        log π(a|o) = Σ_i [log N(u_i; μ_i, σ_i²) − log(1 − tanh(u_i)²)]."""
        mean, log_std = self(obs)
        std = log_std.exp()
        noise = torch.randn_like(mean)
        u = mean + std * noise
        log_prob = (-0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi) - tanh_log_det_jacobian(u))
        return torch.tanh(u), log_prob.sum(-1)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor] | torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Actions [B, A] in [-1, 1]: tanh(μ), or a sample when ``deterministic`` is false."""
        if deterministic:
            return torch.tanh(self(obs)[0])
        return self.sample(obs)[0]
