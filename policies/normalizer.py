"""Empirical observation normalization with running statistics that travel with the policy's weights."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class EmpiricalNormalizer(nn.Module):
    """y = clip((x − μ) / sqrt(σ² + ε), ±clip), with μ, σ² running estimates over every sample seen.

    Statistics are buffers (saved with the weights). They change only through ``update``, and only while the
    module is in training mode: ``eval()`` freezes them. Batches merge with Chan et al.'s parallel formula:

        δ = μ_b − μ,  n' = n + n_b,  μ' = μ + δ · n_b / n',
        M2' = σ²·n + σ_b²·n_b + δ² · n · n_b / n',  σ'² = M2' / n'

    Args:
        shape: feature shape (without the batch dimension).
        eps: added to the variance before the square root.
        clip: bound on the normalized value (in standard deviations).
    """

    def __init__(self, shape: tuple[int, ...] | int, eps: float = 1e-8, clip: float = 10.0) -> None:
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.eps, self.clip = float(eps), float(clip)
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        # Data-parallel training sets this to a sum over processes (robot_rl.distributed): ``update`` then only
        # accumulates the batch's count, sum and sum of squares, and ``sync`` (every process at once) merges every
        # process's since the last sync, so the statistics stay the same everywhere. Not saved; None: this process.
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._pending: torch.Tensor | None = None  # float64 [1 + 2·D]: rows, sums, sums of squares since the sync

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, *shape] -> [B, *shape] normalized (identity statistics until the first update)."""
        return ((x - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y * torch.sqrt(self.var + self.eps) + self.mean

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge a batch [B, *shape] into the statistics (data-parallel: at the next ``sync``); rows holding NaN/inf
        are ignored. No-op in eval mode."""
        if not self.training:
            return
        x = x.reshape(-1, *self.mean.shape)
        finite = torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)
        if not bool(finite.all()):  # boolean indexing costs more than the statistics: only when a row is bad
            x = x[finite]
        if self.reduce is not None:  # data-parallel: kept for ``sync``
            x64 = x.double().reshape(x.shape[0], self.mean.numel())
            sums = torch.cat([x64.new_tensor([x64.shape[0]]), x64.sum(0), (x64 * x64).sum(0)])
            self._pending = sums if self._pending is None else self._pending + sums
            return
        n_b = x.shape[0]
        if n_b == 0:
            return
        self._merge(n_b, x.mean(dim=0), x.var(dim=0, unbiased=False))

    @torch.no_grad()
    def sync(self) -> None:
        """Data-parallel (``reduce`` set): merge every process's batches since the last sync, as one batch (one
        collective; every process must call it at the same point). A no-op otherwise, and in eval mode."""
        if self.reduce is None or not self.training:
            return
        d = self.mean.numel()
        pending = self._pending if self._pending is not None else self.mean.new_zeros(1 + 2 * d, dtype=torch.float64)
        self._pending = None
        sums = self.reduce(pending.clone())
        n_b = int(sums[0].item())
        if n_b == 0:
            return
        mean_b = sums[1:1 + d] / n_b
        var_b = (sums[1 + d:] / n_b - mean_b**2).clamp(min=0.0)
        self._merge(n_b, mean_b.view_as(self.mean).to(self.mean.dtype), var_b.view_as(self.var).to(self.var.dtype))

    def _merge(self, n_b: int, mean_b: torch.Tensor, var_b: torch.Tensor) -> None:
        """Chan's merge of a batch of ``n_b`` > 0 rows with mean ``mean_b`` and variance ``var_b``."""
        n = self.count.item()
        total = n + n_b
        delta = mean_b - self.mean
        self.mean += delta * (n_b / total)
        self.var.copy_((self.var * n + var_b * n_b + delta**2 * (n * n_b / total)) / total)
        self.count += n_b
