"""Advantage-weighted regression through the sampler: the cheap baseline beside RECAP (DESIGN.md §5).

The advantages are RECAP's (``robot_rl.algos.advantages.prepare_advantages``: the same value model and N-step
advantages); instead of conditioning the policy on an indicator, frames are drawn with probability proportional to

    w_t = min(exp((A_t − median A) / (temperature · std A)), max_weight)     (intervention frames: max_weight)

and the loss is plain, unweighted behaviour cloning (``robot_rl.algos.bc.BC``), so every batch looks like one of
BC's, only richer in high-advantage frames. Standardising A makes ``temperature`` unit-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from robot_rl.data.labels import Labels


@dataclass
class AWRConfig:
    """``algo.awr.*``."""

    temperature: float = 1.0  # in standard deviations of the advantage
    max_weight: float = 20.0  # cap of a frame's weight (the median frame weighs 1)

    def __post_init__(self) -> None:
        if self.temperature <= 0 or self.max_weight < 1:
            raise ValueError(f"awr temperature must be > 0 and max_weight >= 1, got {self.temperature}, "
                             f"{self.max_weight}")


def awr_weights(advantage: np.ndarray, cfg: AWRConfig, intervention: np.ndarray | None = None) -> torch.Tensor:
    """Per-frame sampling weights [F] float64 (see the module docstring)."""
    adv = np.asarray(advantage, dtype=np.float64).reshape(-1)
    std = float(adv.std())
    z = (adv - np.median(adv)) / (cfg.temperature * std) if std > 0 else np.zeros_like(adv)
    w = np.minimum(np.exp(np.minimum(z, np.log(cfg.max_weight))), cfg.max_weight)
    if intervention is not None:
        w = np.where(np.asarray(intervention).reshape(-1).astype(bool), cfg.max_weight, w)
    return torch.from_numpy(w)


def weights_from_labels(labels: Labels, cfg: AWRConfig) -> torch.Tensor:
    """``awr_weights`` of labelled frames."""
    return awr_weights(labels.advantage, cfg, labels.intervention)


def awr_sampler(sampler: Any, labels: Labels, cfg: AWRConfig) -> Any:
    """The sampler AWR's behaviour cloning trains on: ``sampler`` itself, drawing frames by ``weights_from_labels``."""
    sampler.set_weights(weights_from_labels(labels, cfg))
    return sampler
