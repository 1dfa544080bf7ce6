"""Data-parallel PPO over torchrun processes against one process, on the main job's task (DESIGN.md §7).

PPO on so101_reach with the README's recipe (``robot-rl train task=so101_reach algo=ppo``), each run stopping at 90 %
rolling training success (``stop_success_rate=0.9``, at most 300 k env steps), arms alternated seed by seed so the
machine's drift falls on all of them:

- ``1x64``: one process, 64 envs (the main job: MuJoCo on 2 threads, the update on every core);
- ``2x32``: two processes of 32 envs each (``torchrun --nproc-per-node 2``): the same 64 envs and the same global
  minibatch, each process's simulator and update on one thread;
- ``2x64``: two processes of 64 envs each: twice the envs per iteration.

Recorded: env steps and training wall-clock (rank 0's; start-up excluded) to 90 %, per seed and as medians. Goals:
``2x32`` needs at most 1.25x the env steps of ``1x64`` (the same algorithm, only split; seeds differ, so not
bitwise), and its wall-clock to 90 % is at most 1.0x one process's on the same cores.

``--algo flashsac`` (``data_parallel_flashsac.json``): FlashSAC's recipe on so101_reach, at most 200 k env steps,
``1x16`` (one process of 16 envs, torch on 2 threads as its recipe has it) against ``2x8`` (two of 8 envs, one
thread each), with the same goals between them.

    python benchmarks/data_parallel.py                    # 3 seeds, ~6 min on 2 cores
    python benchmarks/data_parallel.py --seeds 1 --arms 1x64 2x32 --out /tmp/res
    python benchmarks/data_parallel.py --algo flashsac --seeds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, goal, save_figure, write_result

ROOT = Path(__file__).resolve().parents[1]
# per algorithm: arms (name -> processes, envs per process), the one-process arm, the split arm, the env-step budget
SETUPS = {"ppo": {"arms": {"1x64": (1, 64), "2x32": (2, 32), "2x64": (2, 64)}, "one": "1x64", "split": "2x32",
                  "budget": 300_000},
          "flashsac": {"arms": {"1x16": (1, 16), "2x8": (2, 8)}, "one": "1x16", "split": "2x8", "budget": 200_000}}
ARMS = {arm: shape for setup in SETUPS.values() for arm, shape in setup["arms"].items()}


def train_args(algo: str) -> list[str]:
    return ["train", "task=so101_reach", f"algo={algo}", "stop_success_rate=0.9",
            f"total_steps={SETUPS[algo]['budget']}", "eval.enabled=false", "logger.progress=false",
            "logger.tensorboard=false"]


def command(arm: str, seed: int, run_dir: Path, algo: str = "ppo") -> list[str]:
    procs, envs = SETUPS[algo]["arms"][arm]
    args = [*train_args(algo), f"seed={seed}", f"sim.num_envs={envs}", f"run_dir={run_dir}"]
    if procs == 1:
        return [sys.executable, "-m", "robot_rl.cli.main", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}",
            "-m", "robot_rl.cli.main", *args, "torch_threads=1", "sim.num_threads=1"]  # a core's worth each


def run(arm: str, seed: int, algo: str = "ppo") -> dict[str, object]:
    """One training run; the first curve point at >= 90 % training success (None: not within the budget)."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(command(arm, seed, run_dir, algo), cwd=ROOT, env=env, capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{arm} seed {seed} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        points = [json.loads(line) for line in (run_dir / "curve.jsonl").read_text().splitlines()]
    hit = next((p for p in points if (p.get("success_rate") or 0.0) >= 0.9), None)
    last = points[-1]
    return {"seed": seed, "env_steps_to_90": None if hit is None else hit["env_steps"],
            "wall_s_to_90": None if hit is None else round(hit["wall_s"], 2), "iterations": last["iteration"],
            "env_steps": last["env_steps"], "wall_s": round(last["wall_s"], 2),
            "env_steps_per_s": round(last["env_steps"] / last["wall_s"], 1)}


def median_or_budget(runs: list[dict[str, object]], key: str, budget: float) -> float:
    """The median over seeds, a run that never reached 90 % counted at the budget (a lower bound on its cost)."""
    return statistics.median(budget if r[key] is None else float(r[key]) for r in runs)


def plot(results: dict[str, list[dict[str, object]]], path: Path, title: str = "PPO") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, label in ((axes[0], "env_steps_to_90", "env steps to 90 % success"),
                           (axes[1], "wall_s_to_90", "training wall-clock to 90 % (s)")):
        for i, (arm, runs) in enumerate(results.items()):
            vals = [r[key] for r in runs if r[key] is not None]
            if vals:
                ax.bar(i, statistics.median(vals), color="C0" if ARMS[arm][0] == 1 else "C1", alpha=0.6)
                ax.scatter([i] * len(vals), vals, color="k", s=12, zorder=3)
        ax.set_xticks(range(len(results)), [f"{ARMS[a][0]} proc\nx {ARMS[a][1]} envs" for a in results])
        ax.set_ylabel(label)
    fig.suptitle(f"{title} so101_reach: data-parallel over torchrun processes (bars: medians, dots: seeds)")
    save_figure(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", default="ppo", choices=list(SETUPS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--arms", nargs="+", default=None, choices=list(ARMS), help="default: the algorithm's")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON in --out; no runs")
    a = p.parse_args()
    setup = SETUPS[a.algo]
    name, title = ("data_parallel", "PPO") if a.algo == "ppo" else (f"data_parallel_{a.algo}", "FlashSAC")
    if a.replot:
        plot(json.loads((a.out / f"{name}.json").read_text())["runs"], a.out / f"{name}.png", title)
        return
    arms = a.arms or list(setup["arms"])
    unknown = [arm for arm in arms if arm not in setup["arms"]]
    if unknown:
        raise SystemExit(f"arms {unknown} are not --algo {a.algo}'s: {list(setup['arms'])}")
    results: dict[str, list[dict[str, object]]] = {arm: [] for arm in arms}
    for seed in range(a.seeds):  # arms alternated within each seed: one run at a time, nothing beside it
        for arm in arms:
            r = run(arm, seed, a.algo)
            results[arm].append(r)
            print(f"{arm} seed {seed}: {r}", flush=True)
    summary = {arm: {"median_env_steps_to_90": median_or_budget(runs, "env_steps_to_90", setup["budget"]),
                     "median_wall_s_to_90": median_or_budget(runs, "wall_s_to_90", max(r["wall_s"] for r in runs)),
                     "reached_90": sum(r["env_steps_to_90"] is not None for r in runs)}
               for arm, runs in results.items()}
    goals = []
    one_arm, split_arm = setup["one"], setup["split"]
    if one_arm in summary and split_arm in summary:
        one, two = summary[one_arm], summary[split_arm]
        goals = [goal(f"env_steps_to_90_ratio_{split_arm}_vs_{one_arm}",
                      two["median_env_steps_to_90"] / one["median_env_steps_to_90"], 1.25, "<="),
                 goal(f"wall_s_to_90_ratio_{split_arm}_vs_{one_arm}",
                      two["median_wall_s_to_90"] / one["median_wall_s_to_90"], 1.0, "<=")]
    a.out.mkdir(parents=True, exist_ok=True)
    plot(results, a.out / f"{name}.png", title)
    data = {"train_command": " ".join(["robot-rl", *train_args(a.algo)]), "arms": {k: ARMS[k] for k in arms},
            "cores": os.cpu_count(), "runs": results, "summary": summary}
    path = write_result(name, data, goals, a.out)
    print(json.dumps({"summary": summary, "goals": goals}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
