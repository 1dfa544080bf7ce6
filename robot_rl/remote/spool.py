"""An actor's outgoing messages on disk, in sequence order, until the learner has them in a checkpoint.

RELIABILITY.md E1: while the learner is away the actor keeps its transitions in a bounded queue (default 10,000
messages or 1 GB) and counts what it had to drop (the oldest go first: the freshest data is worth most to a learner
that comes back). A message leaves the spool only when the learner says it is *committed* (inside a checkpoint), so
a learner killed and resumed from its last checkpoint gets everything after it again; sequence numbers let it
ignore what it already holds. An actor restarted on the same folder resends what its predecessor left.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

SUFFIX = ".msg"


class Spool:
    """Bounded FIFO of (seq, bytes) in ``folder``, one file per message.

    Args:
        folder: where the files live (created).
        max_items: messages kept at most.
        max_bytes: bytes kept at most.
    """

    def __init__(self, folder: str | Path, max_items: int = 10_000, max_bytes: int = 2**30) -> None:
        if max_items < 1 or max_bytes < 1:
            raise ValueError(f"remote spool limits must be >= 1, got {max_items} messages, {max_bytes} bytes")
        self.folder, self.max_items, self.max_bytes = Path(folder), max_items, max_bytes
        self.folder.mkdir(parents=True, exist_ok=True)
        self.index: OrderedDict[int, int] = OrderedDict()  # seq -> size, ascending
        self.bytes = 0
        self.dropped = 0  # messages dropped over the limits (this process's count)
        for p in self.folder.glob("*.tmp"):  # a write killed half-way: its message was never handed over
            p.unlink()
        for p in sorted(self.folder.glob(f"*{SUFFIX}")):
            try:
                seq = int(p.stem)
            except ValueError:
                continue
            size = p.stat().st_size
            self.index[seq] = size
            self.bytes += size

    def __len__(self) -> int:
        return len(self.index)

    @property
    def last_seq(self) -> int:
        """The newest message's sequence number (-1 when empty)."""
        return next(reversed(self.index)) if self.index else -1

    def _path(self, seq: int) -> Path:
        return self.folder / f"{seq:016d}{SUFFIX}"

    def put(self, seq: int, data: bytes) -> None:
        """Append a message (``seq`` above every held one); drop the oldest while over a limit."""
        if self.index and seq <= self.last_seq:
            raise ValueError(f"spool sequence numbers must increase: {seq} after {self.last_seq}")
        tmp = self.folder / f"{seq:016d}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self._path(seq))
        self.index[seq] = len(data)
        self.bytes += len(data)
        while len(self.index) > self.max_items or (self.bytes > self.max_bytes and len(self.index) > 1):
            old, _ = next(iter(self.index.items()))
            self._remove(old)
            self.dropped += 1

    def _remove(self, seq: int) -> None:
        self.bytes -= self.index.pop(seq)
        self._path(seq).unlink(missing_ok=True)

    def after(self, seq: int, count: int = 1, max_bytes: int | None = None) -> list[tuple[int, bytes]]:
        """Up to ``count`` of the oldest held messages with sequence numbers above ``seq``, in order, within
        ``max_bytes`` in all (the first whatever its size): chosen in one pass over the index, then read."""
        picked, size = [], 0
        for s, n in self.index.items():
            if s <= seq:
                continue
            if len(picked) == count or (picked and max_bytes is not None and size + n > max_bytes):
                break
            picked.append(s)
            size += n
        return [(s, self._path(s).read_bytes()) for s in picked]

    def first_after(self, seq: int) -> tuple[int, bytes] | None:
        """The oldest held message with a sequence number above ``seq`` (None: none)."""
        got = self.after(seq)
        return got[0] if got else None

    def holds_after(self, seq: int) -> bool:
        """Whether a message above ``seq`` waits (from the index alone: nothing is read)."""
        return self.last_seq > seq

    def release(self, upto: int) -> None:
        """Forget every message with a sequence number <= ``upto``."""
        while self.index and next(iter(self.index)) <= upto:
            self._remove(next(iter(self.index)))

    def pending(self) -> Iterator[int]:
        return iter(list(self.index))
