"""Behaviour cloning of a Gaussian policy: maximum likelihood of logged actions, batches from a sampler.

    L(θ) = −E_(o, a)~D [ log N(a; μ_θ(o), σ_θ²) ]   (summed over action dimensions)

The first offline learner on the offline runner; the flow-matching VLA's BC and RECAP follow the same interface.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from policies import keys
from policies.gaussian import GaussianPolicy
from robot_rl.algos.base import OfflineAlgorithm
from robot_rl.algos.guard import NonFiniteGuard


@dataclass
class BCConfig:
    learning_rate: float = 1e-3  # Adam step size
    max_grad_norm: float = 1.0  # global L2 norm gradients are clipped to
    max_consecutive_nonfinite: int = 10  # skipped (NaN/inf) updates in a row before the run stops

    def __post_init__(self) -> None:
        if self.learning_rate <= 0 or self.max_grad_norm <= 0:
            raise ValueError("bc learning_rate and max_grad_norm must be > 0")


class BC(OfflineAlgorithm):
    """Fits a Gaussian policy to (observation, action) batches ``{"obs": {group: [B, ...]}, "action": [B, A]}``.

    Args:
        policy: the policy trained (its normaliser statistics should be set from the data before training).
        cfg: hyperparameters.
        device: where the policy lives.
    """

    name = "bc"

    def __init__(self, policy: GaussianPolicy, cfg: BCConfig, device: torch.device | str = "cpu") -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.policy = policy.to(self.device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.learning_rate)
        self.guard = NonFiniteGuard(cfg.max_consecutive_nonfinite)

    @property
    def obs_groups(self) -> list[str]:
        return [self.policy.cfg.obs_key]

    def train_mode(self) -> None:
        self.policy.train()

    def eval_mode(self) -> None:
        self.policy.eval()

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        obs = {k: v.to(self.device) for k, v in batch[keys.OBS].items()}
        action = batch[keys.ACTION].to(self.device)
        loss = -self.policy.distribution(obs).log_prob(action).sum(-1).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
        if not self.guard.check(loss, grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            return {"nonfinite_skips": float(self.guard.skipped)}
        self.optimizer.step()
        return {"loss/nll": loss.item(), "grad_norm": grad_norm.item()}

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "guard": self.guard.state_dict(), "cfg": asdict(self.cfg)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.policy.load_state_dict(sd["policy"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.guard.load_state_dict(sd["guard"])
