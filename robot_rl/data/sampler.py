"""Shuffled minibatches over a fixed set of logged transitions, with a position that checkpoints resume exactly."""

from __future__ import annotations

import hashlib
from typing import Any

import torch


class TensorSampler:
    """Epochs of shuffled minibatches over tensors that share their first dimension (M samples).

    The permutation of each epoch comes from the sampler's own generator, and ``state_dict`` holds it, the
    epoch's permutation and the position inside it, so a resumed run draws exactly the batches an uninterrupted one
    would have.

    Args:
        data: name -> tensor [M, ...] (a nested dict of tensors for observation groups is allowed one level deep).
        batch_size: B, samples per batch (the last partial batch of an epoch is dropped).
        seed: the generator's seed.
    """

    def __init__(self, data: dict[str, Any], batch_size: int, seed: int = 0) -> None:
        sizes = {len(v) for v in _leaves(data)}
        if len(sizes) != 1:
            raise ValueError(f"every tensor must have the same number of samples, got sizes {sorted(sizes)}")
        self.data, self.num_samples, self.batch_size = data, sizes.pop(), batch_size
        if not 1 <= batch_size <= self.num_samples:
            raise ValueError(f"batch_size must be in [1, {self.num_samples}], got {batch_size}")
        self.gen = torch.Generator().manual_seed(seed)
        self.perm = torch.randperm(self.num_samples, generator=self.gen)
        self.pos, self.epoch = 0, 0

    def fingerprint(self) -> str:
        """sha256 of the data (names, shapes, bytes): what a resumed offline run must be trained on."""
        h = hashlib.sha256()
        for name, t in sorted(_named_leaves(self.data)):
            h.update(f"{name}:{list(t.shape)}:{t.dtype}".encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def sample(self) -> dict[str, Any]:
        """The next minibatch {name: [B, ...]}."""
        if self.pos + self.batch_size > self.num_samples:
            self.perm = torch.randperm(self.num_samples, generator=self.gen)
            self.pos, self.epoch = 0, self.epoch + 1
        idx = self.perm[self.pos:self.pos + self.batch_size]
        self.pos += self.batch_size
        return {k: ({g: t[idx] for g, t in v.items()} if isinstance(v, dict) else v[idx]) for k, v in self.data.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state(), "perm": self.perm.clone(), "pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.gen.set_state(sd["gen"])
        self.perm, self.pos, self.epoch = sd["perm"].clone(), int(sd["pos"]), int(sd["epoch"])


def _leaves(data: dict[str, Any]) -> list[torch.Tensor]:
    return [t for _, t in _named_leaves(data)]


def _named_leaves(data: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    out = []
    for k, v in data.items():
        out.extend((f"{k}.{g}", t) for g, t in v.items()) if isinstance(v, dict) else out.append((k, v))
    return out
