"""RLPD's offline half when people intervene online (HIL-SERL: interventions go into both buffers): the transitions of
the online replay that a person chose, drawn apart from the rest, and joined with a demo dataset's where there is one.
Both are sampling sources as ``sample_mixed`` reads them (``size``: 0 when empty; ``sample``).

    offline = Sources(demo_buffer, Interventions(runner.replay))     # or Interventions(runner.replay) alone
    batch = sample_mixed(runner.replay, offline, 256, 0.5, n_step, gamma)
"""

from __future__ import annotations

import torch

from robot_rl.buffers.replay import Batch, ReplayBuffer, concat_batches


class Interventions:
    """The transitions of ``replay`` whose action a person (or a recovery policy) chose, as they stand now."""

    def __init__(self, replay: ReplayBuffer) -> None:
        self.replay = replay

    @property
    def size(self) -> int:
        """Transitions to draw from (0: none yet)."""
        return self.replay.num_interventions

    def sample(self, batch_size: int, n_step: int = 1, gamma: float = 0.99) -> Batch:
        return self.replay.sample(batch_size, n_step, gamma, interventions=True)


class Sources:
    """Several sources as one: each draw picks a source in proportion to its transitions (so every stored
    transition is equally likely), then a transition in it.

    Args:
        sources: replay buffers (``num_transitions``) or ``Interventions`` (``size``).
    """

    def __init__(self, *sources: ReplayBuffer | Interventions) -> None:
        if not sources:
            raise ValueError("Sources needs at least one source")
        self.sources = sources

    def _sizes(self) -> list[int]:
        return [s.num_transitions if isinstance(s, ReplayBuffer) else s.size for s in self.sources]

    @property
    def size(self) -> int:
        return sum(self._sizes())

    def sample(self, batch_size: int, n_step: int = 1, gamma: float = 0.99) -> Batch:
        sizes = torch.tensor(self._sizes(), dtype=torch.float64)
        if float(sizes.sum()) == 0:
            raise RuntimeError("no source holds a transition to sample")
        counts = torch.bincount(torch.multinomial(sizes, batch_size, replacement=True), minlength=len(sizes))
        batch: Batch | None = None
        for source, k in zip(self.sources, counts.tolist(), strict=True):
            if k:
                part = source.sample(k, n_step, gamma)
                batch = part if batch is None else concat_batches(batch, part)
        assert batch is not None
        return batch
