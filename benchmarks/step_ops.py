"""Torch ops dispatched per env step, by task and by source file: the per-step work outside the physics, counted.

``benchmarks/sim_throughput.py`` times the share of an env step spent in the physics; on the CPU the rest is many
small torch ops (~5-10 us of dispatch each on [64]-sized tensors), so their number is what to cut. Counted here
with a ``TorchDispatchMode`` around ``env.step`` (every aten op that reaches a kernel, attributed to the innermost
frame of this repository that issued it): independent of the machine's load, so any two commits compare exactly.

    python benchmarks/step_ops.py                       # N = 64, 100 steps of uniform random actions per task
    python benchmarks/step_ops.py --num-envs 256 --steps 50

Writes ``benchmarks/results/step_ops.json`` + ``step_ops.png``.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common import save_figure, write_result

NAME = "step_ops"
ROOT = Path(__file__).resolve().parents[1]
TASKS = ("so101_reach", "so101_lift", "so101_push", "so101_pick", "humanoid_walk")


class OpCounter(TorchDispatchMode):
    """Counts dispatched aten ops by the repository file (relative path) whose code issued them."""

    def __init__(self) -> None:
        super().__init__()
        self.by_file: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        here = "(outside the repository)"
        for frame in reversed(traceback.extract_stack()):
            path = Path(frame.filename)
            if path.is_relative_to(ROOT) and ".venv" not in path.parts and path.name != Path(__file__).name:
                here = str(path.relative_to(ROOT))
                break
        self.by_file[here] += 1
        return func(*args, **(kwargs or {}))


def count(task: str, num_envs: int, steps: int, warmup: int = 20) -> dict[str, Any]:
    """Mean dispatched ops per ``env.step`` of ``task`` under uniform random actions (seeded), and per file."""
    from sim.config import SimConfig
    from sim.registry import make_env

    env = make_env(task, SimConfig(num_envs=num_envs, num_threads=1, seed=0))
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    actions = [torch.rand(num_envs, env.action_dim, generator=g) * 2 - 1 for _ in range(warmup + steps)]
    ended = 0
    for a in actions[:warmup]:
        env.step(a)
    counter = OpCounter()
    with counter:
        for a in actions[warmup:]:
            _, _, terminated, truncated, _ = env.step(a)
            ended += int((terminated | truncated).sum())
    env.close()
    total = sum(counter.by_file.values())
    return {"ops_per_step": round(total / steps, 1), "resets_per_step": round(ended / steps, 2),
            "by_file": {k: round(v / steps, 1) for k, v in counter.by_file.most_common()}}


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = sorted({f for r in results.values() for f in r["by_file"]})
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(results)
    for f in files:
        vals = [r["by_file"].get(f, 0.0) for r in results.values()]
        ax.bar(list(results), vals, bottom=bottom, label=f)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("dispatched torch ops per env step")
    ax.set_title("Work outside the physics per env step, by source file", fontsize=9)
    ax.legend(fontsize=6, loc="upper left")
    save_figure(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--steps", type=int, default=100, help="counted steps per task (after 20 uncounted)")
    p.add_argument("--tasks", nargs="+", default=list(TASKS))
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    torch.set_num_threads(1)
    results = {}
    for task in a.tasks:
        results[task] = count(task, a.num_envs, a.steps)
        print(f"{task:14s} {results[task]['ops_per_step']:6.1f} ops per step "
              f"({results[task]['resets_per_step']} resets per step)", flush=True)
    data = {"num_envs": a.num_envs, "steps": a.steps, "actions": "uniform in [-1, 1], seeded", "tasks": results}
    path = write_result(NAME, data, [], a.out)
    plot(results, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
