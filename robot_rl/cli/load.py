"""How much of the machine other work holds when a training starts, and what that does to torch's threads.

torch's CPU kernels split each op over its threads and wait for the last one: where another process holds a core,
the thread scheduled behind it stalls every op. Measured here (2 cores, one of them held by a busy loop;
2026-12-07): FlashSAC so101_lift trained 6,144 env steps in 17.5-33.1 s at ``torch_threads=2`` against 4.2-5.0 s at
1; PPO so101_reach 101,376 in 26.0-46.2 s at ``update_threads=2`` against 13.9 s at 1. On a quiet machine two
threads are the faster (1.11x and 1.12x: ``benchmarks/results/flashsac_threads.json``, ``torch_threads.json``), and
the thread count is part of what makes a seeded run repeat bit for bit, so the CLI keeps the user's setting and says
when another choice would run faster.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _busy_jiffies() -> tuple[int, int]:
    """(jiffies every CPU spent busy, jiffies this process spent) so far, from /proc."""
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(cpu[i]) for i in (0, 1, 2, 5, 6, 7))  # user, nice, system, irq, softirq, steal (not idle, iowait)
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return busy, int(fields[11]) + int(fields[12])  # utime, stime (all of this process's threads)


def other_load(sample_s: float = 0.2) -> float | None:
    """Cores' worth of CPU time that other processes used over the next ``sample_s`` seconds (this process's own
    threads left out); None where /proc cannot tell (not Linux)."""
    try:
        busy0, own0 = _busy_jiffies()
        time.sleep(sample_s)
        busy1, own1 = _busy_jiffies()
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, ((busy1 - busy0) - (own1 - own0)) / (os.sysconf("SC_CLK_TCK") * sample_s))


def thread_warning(threads: int, cores: int, busy: float | None) -> str | None:
    """A warning when ``threads`` torch threads will share ``cores`` with ``busy`` cores' worth of other work such
    that one of them must wait (``busy`` >= 0.5 and more threads than the cores left), else None."""
    if busy is None or busy < 0.5 or threads <= 1 or threads <= cores - round(busy):
        return None
    return (f"warning: other processes hold {busy:.1f} of this machine's {cores} cores; torch's {threads} threads "
            "stall on the one scheduled behind them (measured: FlashSAC 4-7x and PPO 2-3x slower beside one busy "
            "core of two). torch_threads=1 update_threads=1 run at full speed beside it")
