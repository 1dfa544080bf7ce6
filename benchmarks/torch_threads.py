"""Torch's intra-op threads next to the CPU simulator: ``robot-rl train ... torch_threads=1`` against ``=2``, and
one thread for collection with every core for PPO's update (``update_threads``, the CLI's default).

The CLI's default is one torch thread (``torch_threads``); MuJoCo's rollout steps the envs on its own threads
(``sim.num_threads``, 2). On a 2-core machine a second torch thread can only help where torch's own work is large
enough to split (the update of an off-policy learner) and can hurt where it is not: after a parallel region torch's
OpenMP threads spin-wait for the next one, on the cores the physics needs. This benchmark measures both sides on the
real CLI: for each job, ``robot-rl train`` runs to a fixed number of env steps under each setting, in separate
processes one at a time (alternating, ``--rounds`` each), no evaluation, and the run's own learning curve gives its
training wall-clock and the seconds spent in ``env.step`` (``sim_s``). Settings: ``1`` (torch_threads=1
update_threads=1), ``2`` (both 2), and for PPO ``1+2`` (torch_threads=1 update_threads=2: the simulator is idle while
an on-policy learner updates, so the update can take both cores; off-policy updates interleave with env steps and keep
torch_threads).

    python benchmarks/torch_threads.py              # ~10 min on 2 cores
    python benchmarks/torch_threads.py --rounds 1 --out /tmp/res

Writes torch_threads.json + torch_threads.png to ``--out`` (benchmarks/results/ by default): env steps per second of
training wall-clock per job and setting, the share of it inside ``env.step``, and each setting's speed over ``1``.
Wall-clock ratios are only honest with nothing else heavy on the machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib

from benchmarks.common import RESULTS, robot_rl_command, save_figure, write_result
from robot_rl.logging import read_curve

matplotlib.use("Agg")
import matplotlib.pyplot as plt

NAME = "torch_threads"
# setting -> (torch_threads, update_threads)
SETTINGS = {"1": (1, 1), "2": (2, 2), "1+2": (1, 2)}
ON_POLICY_ONLY = ("1+2",)  # update_threads only acts on on-policy runs
# name -> the train overrides (env steps sized so each run trains ~10-40 s here; FlashSAC: 2,000 random steps,
# then one update per vector step of 16 envs)
JOBS = {
    "ppo_so101_reach_64envs": ["task=so101_reach", "algo=ppo", "total_steps=98304"],
    "ppo_humanoid_walk_64envs": ["task=humanoid_walk", "algo=ppo", "sim.num_envs=64", "total_steps=49152"],
    "flashsac_so101_lift": ["task=so101_lift", "algo=flashsac", "total_steps=30000"],
}
COMMON = ["eval.enabled=false", "logger.progress=false", "logger.tensorboard=false", "checkpoint_every=100000"]


def settings_of(job: str) -> list[str]:
    return [k for k in SETTINGS if "algo=ppo" in JOBS[job] or k not in ON_POLICY_ONLY]


def run_job(overrides: list[str], setting: str) -> dict[str, float]:
    """One ``robot-rl train`` in its own process; its curve's last point (env steps, wall_s, sim_s)."""
    threads, update_threads = SETTINGS[setting]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [*robot_rl_command(), "train", *overrides, *COMMON, f"torch_threads={threads}",
               f"update_threads={update_threads}", f"run_dir={run_dir}"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        process_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        last = read_curve(run_dir)[-1]
    steps, wall, sim_s = float(last["env_steps"]), float(last["wall_s"]), float(last.get("sim_s", float("nan")))
    return {"env_steps": steps, "train_wall_s": round(wall, 2), "sim_s": round(sim_s, 2),
            "env_steps_per_s": round(steps / wall, 1), "sim_share": round(sim_s / wall, 3),
            "process_wall_s": round(process_s, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="runs per job and thread count (alternating)")
    p.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated subset of {list(JOBS)}")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    jobs = [j for j in a.jobs.split(",") if j]
    unknown = sorted(set(jobs) - set(JOBS))
    if unknown:
        raise SystemExit(f"unknown job(s) {unknown}; choose from {list(JOBS)}")
    runs: dict[str, dict[str, list[dict[str, float]]]] = {j: {k: [] for k in settings_of(j)} for j in jobs}
    for job in jobs:
        order = settings_of(job)
        for r in range(a.rounds):
            for k in order if r % 2 == 0 else order[::-1]:  # alternate which goes first
                res = run_job(JOBS[job], k)
                runs[job][k].append(res)
                print(f"{job} setting {k} round {r}: {res}", flush=True)
    summary = {}
    for job, by_k in runs.items():
        rate = {k: median(x["env_steps_per_s"] for x in xs) for k, xs in by_k.items()}
        summary[job] = {"median_env_steps_per_s": rate,
                        "median_sim_share": {k: median(x["sim_share"] for x in xs) for k, xs in by_k.items()},
                        "median_sim_s": {k: median(x["sim_s"] for x in xs) for k, xs in by_k.items()},
                        "speed_over_setting_1": {k: round(v / rate["1"], 3) for k, v in rate.items() if k != "1"}}
    data = {"jobs": {j: ["robot-rl", "train", *JOBS[j], *COMMON] for j in jobs},
            "settings": {k: {"torch_threads": t, "update_threads": u} for k, (t, u) in SETTINGS.items()},
            "unit": "env steps per second of training wall-clock (the run's curve: wall_s excludes start-up)",
            "runs": runs, "summary": summary}
    path = write_result(NAME, data, [], a.out)

    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / len(SETTINGS)
    for k, name in enumerate(SETTINGS):
        xs = [i for i, j in enumerate(jobs) if name in summary[j]["median_env_steps_per_s"]]
        vals = [summary[jobs[i]]["median_env_steps_per_s"][name] for i in xs]
        t, u = SETTINGS[name]
        ax.bar([i + (k - (len(SETTINGS) - 1) / 2) * width for i in xs], vals, width,
               label=f"torch_threads={t}, update_threads={u}")
    ax.set_xticks(range(len(jobs)), [j.replace("_", "\n", 1) for j in jobs], fontsize=8)
    ax.set_ylabel("env steps / s of training")
    ax.set_yscale("log")
    ax.set_title("robot-rl train on 2 cores: torch threads next to MuJoCo's 2 rollout threads", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, a.out / f"{NAME}.png", dpi=110)
    print("wrote", path)
    for j in jobs:
        print(f"  {j}: {summary[j]}")


if __name__ == "__main__":
    main()
