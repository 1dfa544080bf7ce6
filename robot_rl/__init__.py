"""robot_rl: the core (env contract, algorithms, runners, data, models, CLI).

Importing it first sets one process default that must be in place before torch loads: how long torch's OpenMP
threads busy-wait after a parallel region (``openmp_spin``).
"""

from __future__ import annotations

import os
import sys

# libgomp (the OpenMP runtime of torch's Linux wheels) lets idle threads spin 300,000 times after each parallel
# region before sleeping when neither variable is set (libgomp manual, GOMP_SPINCOUNT). On a small machine they spin
# on the cores MuJoCo's rollout threads step the physics on. With 30,000, on 2 cores (benchmarks/torch_threads.py,
# torch_threads.json, 2026-12-05): a loop with torch at 2 threads and a policy's forward pass between env steps ran
# 1.46-1.64x as fast (humanoid_walk, so101_lift), `robot-rl train` 1.08-1.29x, `robot-rl offline` 1.03x. 10,000
# stepped as fast but made PPO's update at 2 threads slower.
OPENMP_SPIN_DEFAULT = "30000"
_USER_SET = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def openmp_spin(environ: dict[str, str] | os._Environ, openmp_loaded: bool) -> str:
    """Apply our spin default to ``environ`` where it can still act; says what happened: "set" (we set it),
    "user" (the user chose a wait policy or spin count: left alone) or "late" (``openmp_loaded``: libgomp, which
    torch loads, already read its settings: nothing set)."""
    if any(k in environ for k in _USER_SET):
        return "user"
    if openmp_loaded:
        return "late"
    environ["GOMP_SPINCOUNT"] = OPENMP_SPIN_DEFAULT
    return "set"


def _openmp_loaded() -> bool:
    """True once libgomp has read its settings: torch is imported, or (Linux) libgomp is mapped by anything."""
    if "torch" in sys.modules:
        return True
    try:
        with open("/proc/self/maps") as f:
            return "libgomp" in f.read()
    except OSError:  # not Linux
        return False


OPENMP_SPIN = openmp_spin(os.environ, _openmp_loaded())
