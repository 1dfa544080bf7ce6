"""The non-finite guard every learner shares: skip an optimizer step whose loss or gradients hold NaN/inf.

Skipping means ``optimizer.step()`` is not called (and nothing else that is optimizer state, such as an adaptive
learning rate, changes), so the optimizer's state stays bitwise what it was. More than ``max_consecutive``
skipped steps in a row raise ``NonFiniteError``; the runner turns that into a stop that names the last good
checkpoint (RELIABILITY.md B4).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


class NonFiniteError(RuntimeError):
    """Too many consecutive updates had a non-finite loss or gradient."""


class NonFiniteGuard:
    """Counts skipped steps. ``check(loss, grad_norm)`` -> True when the step may be taken.

    Args:
        max_consecutive: skipped steps in a row tolerated before ``NonFiniteError``.
    """

    def __init__(self, max_consecutive: int = 10) -> None:
        self.max_consecutive = max_consecutive
        self.skipped = 0  # total skipped steps over the run
        self.consecutive = 0  # skipped steps since the last good one

    def check(self, *values: torch.Tensor) -> bool:
        """True if every value is finite; otherwise count a skip (and raise past the limit)."""
        return self.record(bool(torch.stack([torch.isfinite(v).all() for v in values]).all()))  # one host sync

    def record(self, finite: bool) -> bool:
        """``check`` for a caller that has read its values already: ``finite`` passes through; False counts a skip
        (and raises past the limit)."""
        if finite:
            self.consecutive = 0
            return True
        self.skipped += 1
        self.consecutive += 1
        if self.consecutive > self.max_consecutive:
            raise NonFiniteError(
                f"{self.consecutive} consecutive updates had a NaN/inf loss or gradient (skipped {self.skipped} in "
                "total); stopping")
        return False

    def state_dict(self) -> dict[str, int]:
        return {"skipped": self.skipped, "consecutive": self.consecutive}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.skipped, self.consecutive = int(sd["skipped"]), int(sd["consecutive"])


def guarded_step(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor], loss: torch.Tensor,
                 max_grad_norm: float, guard: NonFiniteGuard) -> torch.Tensor | None:
    """Backward, clip to ``max_grad_norm`` and step, unless the loss or the gradient norm is non-finite: then the
    gradients are cleared, the optimizer is not stepped (its state stays bitwise as it was) and None is returned.
    Returns the pre-clip gradient norm of a step taken. (PPO and FlashSAC interleave their own work between these
    calls and keep them inline.)"""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(list(params), max_grad_norm)
    if not guard.check(loss, grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return None
    optimizer.step()
    return grad_norm
