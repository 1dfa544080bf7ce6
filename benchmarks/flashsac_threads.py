"""FlashSAC on so101_lift with one torch thread against two: wall-clock to 90 % seeded eval success, side by side.

FlashSAC's updates interleave with env steps, so unlike PPO it cannot give torch every core only while the simulator
is idle (``update_threads``): its torch threads share the 2 cores with MuJoCo's all the time. Under robot_rl's OpenMP
spin (``robot_rl.OPENMP_SPIN_DEFAULT``) two threads stepped it 1.10x as fast (``torch_threads.json``); this measures
whether that survives into learning: the same recipe (``robot-rl train task=so101_lift algo=flashsac``, built as
``benchmarks/offpolicy.py`` builds it), one run at a time, the two settings alternating per seed. Every 30 s of
training the clock stops and the deterministic policy is evaluated on offpolicy.py's 50 seeded episodes; a run stops
at the first evaluation at >= 90 % (offpolicy.py's ``_ours`` loop).

    python benchmarks/flashsac_threads.py                    # seeds 0-3, 15-minute budget per run (~40 min here)
    python benchmarks/flashsac_threads.py --replot           # redraw the PNG from the JSON
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import robot_rl  # noqa: I001  (before torch, as in robot-rl train: OpenMP's spin, robot_rl.OPENMP_SPIN)
import matplotlib
import torch

from benchmarks.common import RESULTS, goal, save_figure, write_result

matplotlib.use("Agg")
import matplotlib.pyplot as plt

NAME = "flashsac_threads"
TASK, TARGET, EVAL_EVERY_S = "so101_lift", 0.9, 30.0
TOL = 1e-6  # runs recorded before 74d68f4 hold float32 shares: 45 of 50 episodes read 0.8999999761581421


def reached(success: float) -> bool:
    return success >= TARGET - TOL


def result(curve: list[tuple[float, int, float]]) -> dict[str, Any]:
    """A run's record from its eval curve: the first evaluation at >= 90 % (None if none) and env steps/s over
    the whole run."""
    hit = next((p for p in curve if reached(p[2])), None)
    end = curve[-1]
    return {"curve": curve, "time_to_90_s": hit[0] if hit else None, "env_steps_to_90": hit[1] if hit else None,
            "env_steps_per_s": round(end[1] / max(end[0], 1e-9), 1)}


def run(seed: int, threads: int, budget_s: float) -> dict[str, Any]:
    """One FlashSAC training at ``threads`` torch threads (offpolicy.py's loop), recorded from its eval curve."""
    from benchmarks.offpolicy import _ours

    torch.set_num_threads(threads)
    curve = _ours(TASK, "flashsac", seed, budget_s, EVAL_EVERY_S, stop_at=TARGET - TOL)
    return result([(t, steps, succ) for t, steps, succ, _ in curve])


def summarize(runs: dict[str, dict[str, Any]], budget_s: float) -> dict[str, Any]:
    """Per setting: medians of time to 90 % (a run that never got there counts as the budget) and env steps/s."""
    out: dict[str, Any] = {}
    for threads in (1, 2):
        mine = [r for k, r in runs.items() if k.endswith(f"threads{threads}")]
        out[str(threads)] = {
            "runs": len(mine), "reached_90": sum(r["time_to_90_s"] is not None for r in mine),
            "median_time_to_90_s": statistics.median(r["time_to_90_s"] or budget_s for r in mine),
            "median_env_steps_per_s": statistics.median(r["env_steps_per_s"] for r in mine)}
    one, two = out["1"], out["2"]
    out["time_to_90_speedup_2_over_1"] = round(one["median_time_to_90_s"] / two["median_time_to_90_s"], 3)
    out["env_steps_per_s_2_over_1"] = round(two["median_env_steps_per_s"] / one["median_env_steps_per_s"], 3)
    return out


def plot(data: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {1: "tab:blue", 2: "tab:orange"}
    for key, r in data["runs"].items():
        threads = int(key.rsplit("threads", 1)[1])
        t, _, s = zip(*r["curve"], strict=True)
        ax.plot(t, s, color=colors[threads], alpha=0.8, marker=".",
                label=f"{threads} torch thread{'s' * (threads > 1)}" if key.startswith("seed0") else None)
    ax.axhline(TARGET, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("training wall-clock (s, evaluations excluded)")
    ax.set_ylabel("eval success (50 seeded episodes)")
    s = data["summary"]
    seeds = sorted({k.split("_")[0] for k in data["runs"]})
    ax.set_title(f"FlashSAC {TASK}, {', '.join(seeds)}\n2 torch threads reach 90 % "
                 f"{s['time_to_90_speedup_2_over_1']:.2f}x as fast (env steps/s {s['env_steps_per_s_2_over_1']:.2f}x)",
                 fontsize=9)
    ax.legend()
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--budget-s", type=float, default=900.0, help="training seconds per run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON in --out")
    parser.add_argument("--from-runs", type=Path, default=None,
                        help="record runs already made by this loop ({'seed<S>_threads<T>': run()'s dict}) instead")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads((args.out / f"{NAME}.json").read_text()), args.out / f"{NAME}.png")
        return
    runs: dict[str, dict[str, Any]] = {}
    if args.from_runs is not None:  # their records are recomputed from their curves
        runs = {k: result([tuple(p) for p in r["curve"]]) for k, r in json.loads(args.from_runs.read_text()).items()}
        args.seeds = sorted({int(k.split("_")[0].removeprefix("seed")) for k in runs})
    for seed in args.seeds if args.from_runs is None else []:  # the two settings alternate, one run at a time
        for threads in (1, 2):
            runs[f"seed{seed}_threads{threads}"] = run(seed, threads, args.budget_s)
    data = {"task": TASK, "target": TARGET, "budget_s": args.budget_s, "eval_every_s": EVAL_EVERY_S,
            "eval": "benchmarks/offpolicy.py's: 50 seeded episodes, deterministic policy, the clock stopped",
            "openmp_spin": robot_rl.OPENMP_SPIN, "runs": runs, "summary": summarize(runs, args.budget_s)}
    s = data["summary"]
    goals = [goal("flashsac_2_threads_time_to_90_speedup", s["time_to_90_speedup_2_over_1"], 1.0, ">="),
             goal("flashsac_2_threads_reached_90", s["2"]["reached_90"], len(args.seeds), ">=")]
    path = write_result(NAME, data, goals, args.out)
    plot(json.loads(path.read_text()), args.out / f"{NAME}.png")
    print(json.dumps(s, indent=1))


if __name__ == "__main__":
    main()
