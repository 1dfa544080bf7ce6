"""Behaviour cloning: fit a policy to logged actions, batches from a sampler.

Two kinds of policy, one learner:

- a policy that defines its own imitation loss, ``policy.loss(batch) -> (loss, metrics)`` (the flow-matching VLA:
  the flow-matching loss over action chunks), is trained on it as it is;
- a Gaussian policy (``distribution(obs)``) is trained by maximum likelihood of the logged actions,

      L(θ) = −E_(o, a)~D [ log N(a; μ_θ(o), σ_θ²) ]   (summed over action dimensions),

  on batches ``{"obs": {group: [B, ...]}, "action": [B, A]}``.

AdamW with an optional linear warm-up and cosine decay of the learning rate (over ``total_updates``), gradient
clipping, a guard that skips non-finite updates, and optionally an exponential moving average of the weights
(``ema_decay``; Diffusion Policy keeps one), which is then what the run exports.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from policies import keys
from robot_rl.algos.base import OfflineAlgorithm
from robot_rl.algos.guard import NonFiniteGuard, guarded_step
from robot_rl.algos.optim import adamw
from robot_rl.algos.precision import bf16_autocast, check_bf16


@dataclass
class BCConfig:
    learning_rate: float = 1e-3  # peak AdamW step size
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    max_grad_norm: float = 1.0  # global L2 norm gradients are clipped to
    warmup_updates: int = 0  # linear warm-up of the learning rate from 0 over these many updates
    lr_schedule: str = "constant"  # "constant" or "cosine" (to lr_min_ratio * learning_rate at total_updates)
    lr_min_ratio: float = 0.1  # final learning rate of the cosine schedule, as a fraction of the peak
    total_updates: int | None = None  # length of the cosine schedule (the offline CLI sets it from steps=)
    max_consecutive_nonfinite: int = 10  # skipped (NaN/inf) updates in a row before the run stops
    # 0: off. Else the exported policy is an EMA of the trained weights, updated after every gradient step with decay
    # min(ema_decay, (1 + t) / (10 + t)) at update t (early weights fade fast); buffers (normalisers) are copied.
    ema_decay: float = 0.0
    # bf16 autocast of each update's forward pass (weights, gradients and AdamW stay float32; evaluation and export
    # are float32). Where the hardware has native bf16 -- CUDA GPUs from Ampere on, CPUs with AVX512-BF16 or AMX
    # such as this machine kind's AMD EPYC -- the flow VLA's update (vla_bc's model, batch 64, 2 threads, quiet) took
    # 97-115 ms vs 129-159 ms, and scored as float32 does at equal steps (vla_bc.json, bf16_trial_2026_12_03).
    # Elsewhere bf16 is emulated and slower, so the learner refuses it. Off by default, so a recipe gives the same
    # numbers on every machine; benchmarks/vla_bc.py turns it on where the CPU has it.
    bf16: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"bc ema_decay must lie in [0, 1), got {self.ema_decay}")
        if self.learning_rate <= 0 or self.max_grad_norm <= 0:
            raise ValueError("bc learning_rate and max_grad_norm must be > 0")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"bc lr_schedule must be 'constant' or 'cosine', got {self.lr_schedule!r}")
        if self.lr_schedule == "cosine" and not self.total_updates:
            raise ValueError("bc lr_schedule='cosine' needs total_updates (the number of gradient steps)")
        if self.warmup_updates < 0 or self.weight_decay < 0 or not 0.0 <= self.lr_min_ratio <= 1.0:
            raise ValueError("bc warmup_updates and weight_decay must be >= 0, lr_min_ratio in [0, 1]")


def lr_factor(cfg: BCConfig, update: int) -> float:
    """The learning-rate multiplier at update ``update`` (0-based): linear warm-up, then constant or cosine."""
    if cfg.warmup_updates and update < cfg.warmup_updates:
        return (update + 1) / cfg.warmup_updates
    if cfg.lr_schedule == "constant":
        return 1.0
    assert cfg.total_updates is not None
    span = max(cfg.total_updates - cfg.warmup_updates, 1)
    progress = min(max(update - cfg.warmup_updates, 0) / span, 1.0)
    return cfg.lr_min_ratio + (1.0 - cfg.lr_min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def gaussian_nll(policy: nn.Module, batch: dict[str, Any], device: torch.device) -> tuple[torch.Tensor, dict]:
    """−log N(a; μ(o), σ²) summed over action dimensions, averaged over the batch."""
    obs = {k: v.to(device) for k, v in batch[keys.OBS].items()}
    loss = -policy.distribution(obs).log_prob(batch[keys.ACTION].to(device)).sum(-1).mean()
    return loss, {"loss/nll": loss.item()}


class BC(OfflineAlgorithm):
    """Behaviour cloning of ``policy`` on sampler batches (see the module docstring for the two batch forms).

    Args:
        policy: the policy trained (its normalisation statistics should be set from the data before training).
        cfg: hyperparameters.
        device: where the policy lives.
    """

    name = "bc"

    def __init__(self, policy: nn.Module, cfg: BCConfig, device: torch.device | str = "cpu") -> None:
        self.cfg, self.device = cfg, torch.device(device)
        check_bf16(cfg.bf16, self.device, "algo.bf16")
        self.policy = policy.to(self.device)
        self._own_loss = callable(getattr(policy, "loss", None))
        if not self._own_loss and not callable(getattr(policy, "distribution", None)):
            raise TypeError(f"bc cannot train {type(policy).__name__}: it has neither loss(batch) nor "
                            "distribution(obs)")
        self.optimizer = adamw(self.policy.parameters(), cfg.learning_rate, cfg.weight_decay, self.device)
        self.guard = NonFiniteGuard(cfg.max_consecutive_nonfinite)
        self.updates = 0
        self.ema: nn.Module | None = None
        if cfg.ema_decay > 0:
            self.ema = copy.deepcopy(self.policy).eval().requires_grad_(False)

    @property
    def export_policy(self) -> nn.Module:
        """What the run exports and evaluates: the EMA of the weights when ``cfg.ema_decay`` > 0, else the policy."""
        return self.ema if self.ema is not None else self.policy

    @torch.no_grad()
    def _update_ema(self) -> None:
        assert self.ema is not None
        t = self.updates - 1  # this update's 0-based index (``updates`` already counts it)
        decay = min(self.cfg.ema_decay, (1.0 + t) / (10.0 + t))
        torch._foreach_lerp_(list(self.ema.parameters()), list(self.policy.parameters()), 1.0 - decay)
        for e, b in zip(self.ema.buffers(), self.policy.buffers(), strict=True):
            e.copy_(b)

    @property
    def obs_groups(self) -> list[str]:
        feats = getattr(getattr(self.policy, "processor", None), "features", None)
        return list(feats.inputs) if feats is not None else [self.policy.cfg.obs_key]

    def train_mode(self) -> None:
        self.policy.train()

    def eval_mode(self) -> None:
        self.policy.eval()

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        lr = self.cfg.learning_rate * lr_factor(self.cfg, self.updates)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with bf16_autocast(self.cfg.bf16, self.device):
            if self._own_loss:
                loss, metrics = self.policy.loss(batch)
            else:
                loss, metrics = gaussian_nll(self.policy, batch, self.device)
        self.updates += 1
        grad_norm = guarded_step(self.optimizer, self.policy.parameters(), loss, self.cfg.max_grad_norm, self.guard)
        if grad_norm is None:
            return {"nonfinite_skips": float(self.guard.skipped)}
        if self.ema is not None:
            self._update_ema()
        out = {k if k.startswith("loss") else f"train/{k}": float(v) for k, v in metrics.items()}
        if not any(k.startswith("loss") for k in out):
            out["loss"] = loss.item()
        return {**out, "grad_norm": grad_norm.item(), "lr": lr}

    def state_dict(self) -> dict[str, Any]:
        sd = {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
              "guard": self.guard.state_dict(), "updates": self.updates, "cfg": asdict(self.cfg)}
        if self.ema is not None:
            sd["ema"] = self.ema.state_dict()
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.policy.load_state_dict(sd["policy"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.guard.load_state_dict(sd["guard"])
        self.updates = int(sd.get("updates", 0))
        if self.ema is not None:
            if "ema" not in sd:
                raise ValueError("bc: this checkpoint was trained without algo.ema_decay; resume it without one")
            self.ema.load_state_dict(sd["ema"])
