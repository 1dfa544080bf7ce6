"""Start two processes under torchrun (gloo on the CPU) from a test, the way a user launches data-parallel runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def torchrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node 2 <args>`` in the repository root; its output captured."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)  # a test run under torchrun itself: the children start their own group
    return subprocess.run([*TORCHRUN, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
