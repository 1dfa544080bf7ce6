"""Torch's intra-op threads and OpenMP's spin next to the CPU simulator.

The CLI's default is one torch thread (``torch_threads``); MuJoCo's rollout steps the envs on its own threads
(``sim.num_threads``, 2). On a 2-core machine a second torch thread can only help where torch's own work is large
enough to split (the update of a learner) and can hurt where it is not: after a parallel region torch's OpenMP
threads spin-wait for the next one, on the cores the physics needs. libgomp spins 300,000 times when nothing is set;
importing robot_rl (or sim) before torch sets ``GOMP_SPINCOUNT`` to ``robot_rl.OPENMP_SPIN_DEFAULT`` instead.

Two parts, every run in its own process, one at a time, alternating the order (``--rounds`` each):
- **The CLI.** For each job, ``robot-rl train`` (or ``offline``) runs to a fixed number of env steps (gradient steps)
  under each setting, no evaluation; the run's own curve gives its training wall-clock and the seconds inside
  ``env.step`` (``sim_s``). Settings: ``1`` (torch_threads=1 update_threads=1), ``2`` (both 2), for PPO ``1+2``
  (torch_threads=1 update_threads=2: the simulator is idle while an on-policy learner updates, so the update can take
  both cores; off-policy updates interleave with env steps and keep torch_threads), and ``2`` / ``1+2`` again with
  libgomp's own spin (``GOMP_SPINCOUNT=300000``) to show what robot_rl's default changes.
- **A library user's loop** (gymnasium, SB3, their own code): sim imported before torch, torch at 2 threads, a policy's
  forward pass between env steps; env steps per second with robot_rl's spin default against libgomp's own.

    python benchmarks/torch_threads.py              # ~20 min on 2 cores
    python benchmarks/torch_threads.py --rounds 1 --jobs ppo_so101_reach_64envs --loops so101_lift_N64 --out /tmp/res

Writes torch_threads.json + torch_threads.png to ``--out`` (benchmarks/results/ by default): the rate per job and
setting, the share of it inside ``env.step``, each setting's speed over ``1``, robot_rl's spin over libgomp's, and
the library loops' env steps per second. Wall-clock ratios are only honest with nothing else heavy on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib

from benchmarks.common import RESULTS, robot_rl_command, save_figure, write_result
from robot_rl import OPENMP_SPIN_DEFAULT
from robot_rl.logging import read_curve

matplotlib.use("Agg")
import matplotlib.pyplot as plt

NAME = "torch_threads"
LIBGOMP_SPIN = "300000"  # libgomp's own spin count when neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set
# setting -> (torch_threads, update_threads, GOMP_SPINCOUNT; None: robot_rl's default, robot_rl.OPENMP_SPIN_DEFAULT)
SETTINGS = {"1": (1, 1, None), "2": (2, 2, None), "1+2": (1, 2, None),
            "2, libgomp spin": (2, 2, LIBGOMP_SPIN), "1+2, libgomp spin": (1, 2, LIBGOMP_SPIN)}
ON_POLICY_ONLY = ("1+2", "1+2, libgomp spin")  # update_threads only acts on on-policy runs
# name -> the overrides (env steps sized so each run trains ~10-40 s here; FlashSAC: 2,000 random steps, then one
# update per vector step of 16 envs). offline_*: `robot-rl offline` (the flow VLA, torch_threads=2 by default) on a
# small so101_lift dataset collected first; its rate is gradient steps per second.
JOBS = {
    "ppo_so101_reach_64envs": ["train", "task=so101_reach", "algo=ppo", "total_steps=98304"],
    "ppo_humanoid_walk_64envs": ["train", "task=humanoid_walk", "algo=ppo", "sim.num_envs=64", "total_steps=49152"],
    "flashsac_so101_lift": ["train", "task=so101_lift", "algo=flashsac", "total_steps=30000"],
    "flashsac_humanoid_walk": ["train", "task=humanoid_walk", "algo=flashsac", "total_steps=20000"],
    "offline_bc_so101_lift": ["offline", "algo=bc", "steps=200", "dataset.progress=false"],
}
COMMON = {"train": ["eval.enabled=false", "logger.progress=false", "logger.tensorboard=false",
                    "checkpoint_every=100000"],
          "offline": ["logger.progress=false", "logger.tensorboard=false", "checkpoint_every=100000"]}
OFFLINE_SETTINGS = ("1", "2", "2, libgomp spin")
# A library user's loop (gymnasium, SB3, their own): a policy's forward pass at torch's 2 threads between env steps,
# sim imported before torch (so robot_rl's spin default acts) or libgomp's own spin: env steps per second.
LOOPS = {"humanoid_walk_N256": ("humanoid_walk", 256), "humanoid_walk_N64": ("humanoid_walk", 64),
         "so101_lift_N64": ("so101_lift", 64)}
LOOP_SETTINGS = {"robot_rl spin": None, "libgomp spin": LIBGOMP_SPIN}


def settings_of(job: str) -> list[str]:
    if JOBS[job][0] == "offline":
        return list(OFFLINE_SETTINGS)
    return [k for k in SETTINGS if "algo=ppo" in JOBS[job] or k not in ON_POLICY_ONLY]


def child_env(spin: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    if spin is not None:
        env["GOMP_SPINCOUNT"] = spin
    return env


def run_job(overrides: list[str], setting: str, dataset: Path | None) -> dict[str, float]:
    """One ``robot-rl train`` or ``offline`` in its own process; its curve's last point."""
    threads, update_threads, spin = SETTINGS[setting]
    command, *rest = overrides
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        extra = [f"torch_threads={threads}"]
        if command == "train":
            extra.append(f"update_threads={update_threads}")
        else:
            extra.append(f"dataset.root={dataset}")
        cmd = [*robot_rl_command(), command, *rest, *COMMON[command], *extra, f"run_dir={run_dir}"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env(spin))
        process_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        last = read_curve(run_dir)[-1]
    wall = float(last["wall_s"])
    if command == "offline":
        return {"updates": float(last["updates"]), "train_wall_s": round(wall, 2),
                "updates_per_s": round(float(last["updates"]) / wall, 2), "process_wall_s": round(process_s, 1)}
    steps, sim_s = float(last["env_steps"]), float(last.get("sim_s", float("nan")))
    return {"env_steps": steps, "train_wall_s": round(wall, 2), "sim_s": round(sim_s, 2),
            "env_steps_per_s": round(steps / wall, 1), "sim_share": round(sim_s / wall, 3),
            "process_wall_s": round(process_s, 1)}


def rate_of(res: dict[str, float]) -> float:
    return res["updates_per_s"] if "updates_per_s" in res else res["env_steps_per_s"]


def loop_child(task: str, n: int, seconds: float) -> None:
    """Run in a child process, where this module imported robot_rl before torch (as ``import sim`` first does in a
    user's script); torch at 2 threads, a random MLP policy (3 x 256, the PPO recipe's size) acts between env steps.
    Prints env steps per second and the spin in effect."""
    import torch

    import robot_rl
    from sim.config import SimConfig
    from sim.registry import make_env

    torch.set_num_threads(2)
    torch.manual_seed(0)
    env = make_env(task, SimConfig(num_envs=n, num_threads=2, seed=0))
    obs, _ = env.reset(seed=0)
    dim = obs["policy"].shape[1]
    net = torch.nn.Sequential(torch.nn.Linear(dim, 256), torch.nn.ELU(), torch.nn.Linear(256, 256), torch.nn.ELU(),
                              torch.nn.Linear(256, 256), torch.nn.ELU(), torch.nn.Linear(256, env.action_dim))

    def step() -> None:
        nonlocal obs
        with torch.no_grad():
            obs = env.step(torch.tanh(net(obs["policy"])))[0]

    for _ in range(50):
        step()
    k, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        k += 1
    print(json.dumps({"env_steps_per_s": n * k / (time.perf_counter() - start), "openmp_spin": robot_rl.OPENMP_SPIN,
                      "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT")}))


def run_loop(name: str, setting: str, seconds: float) -> float:
    task, n = LOOPS[name]
    cmd = [sys.executable, __file__, "--loop-child", f"{task}:{n}", "--seconds", str(seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env(LOOP_SETTINGS[setting]))
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = ("set", OPENMP_SPIN_DEFAULT) if LOOP_SETTINGS[setting] is None else ("user", LIBGOMP_SPIN)
    if (out["openmp_spin"], out["GOMP_SPINCOUNT"]) != expected:  # the comparison is void if the spin was not as meant
        raise SystemExit(f"library loop {name} {setting}: OpenMP spin {out['openmp_spin']}, GOMP_SPINCOUNT="
                         f"{out['GOMP_SPINCOUNT']}; expected {expected}")
    return round(out["env_steps_per_s"], 1)


def collect_dataset(root: Path) -> None:
    cmd = [*robot_rl_command(), "collect", "task=so101_lift", "episodes=40", f"dataset.root={root}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def plot(data: dict, path: Path) -> None:
    """Left: each CLI job's speed under each setting over one torch thread throughout (1.0); right: the library
    loops' env steps per second under robot_rl's spin and libgomp's."""
    summary, loop_summary = data["summary"], data["library_loop"]["summary"]
    jobs, loops = list(summary), list(loop_summary)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [len(jobs) + 0.5, len(loops) + 0.5]})
    ax = axes[0]
    names = [k for k in SETTINGS if k != "1"]
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        xs = [i for i, j in enumerate(jobs) if name in summary[j]["speed_over_setting_1"]]
        vals = [summary[jobs[i]]["speed_over_setting_1"][name] for i in xs]
        t, u, spin = SETTINGS[name]
        ax.bar([i + (k - (len(names) - 1) / 2) * width for i in xs], vals, width,
               label=f"torch {t}, update {u}" + (", libgomp spin" if spin else ", robot_rl spin"),
               hatch="//" if spin else None)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(jobs)), [j.replace("_", "\n", 1) for j in jobs], fontsize=7)
    ax.set_ylabel("speed over torch 1, update 1")
    ax.set_ylim(0.6, None)
    ax.set_title("robot-rl on 2 cores: torch threads next to MuJoCo's 2 rollout threads", fontsize=9)
    ax.legend(fontsize=6)
    ax.grid(axis="y", alpha=0.3)
    ax = axes[1]
    for k, name in enumerate(LOOP_SETTINGS):
        vals = [loop_summary[x]["median_env_steps_per_s"][name] for x in loops]
        ax.bar([i + (k - 0.5) * 0.4 for i in range(len(loops))], vals, 0.4, label=name,
               hatch="//" if LOOP_SETTINGS[name] else None)
    ax.set_xticks(range(len(loops)), [x.replace("_N", "\nN") for x in loops], fontsize=7)
    ax.set_ylabel("env steps / s")
    ax.set_title("a user's loop, torch at 2 threads", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="runs per job and setting (alternating)")
    p.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated subset of {list(JOBS)}")
    p.add_argument("--loops", default=",".join(LOOPS), help=f"comma-separated subset of {list(LOOPS)}")
    p.add_argument("--seconds", type=float, default=12.0, help="timed seconds per library-loop run")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--loop-child", help=argparse.SUPPRESS)
    p.add_argument("--replot", action="store_true", help="redraw the PNG from --out's torch_threads.json")
    a = p.parse_args()
    if a.replot:
        plot(json.loads((a.out / f"{NAME}.json").read_text()), a.out / f"{NAME}.png")
        return
    if a.loop_child:
        task, n = a.loop_child.split(":")
        loop_child(task, int(n), a.seconds)
        return
    jobs = [j for j in a.jobs.split(",") if j]
    loops = [x for x in a.loops.split(",") if x]
    unknown = sorted(set(jobs) - set(JOBS)) + sorted(set(loops) - set(LOOPS))
    if unknown:
        raise SystemExit(f"unknown job(s) {unknown}; choose from {list(JOBS)} and {list(LOOPS)}")
    runs: dict[str, dict[str, list[dict[str, float]]]] = {j: {k: [] for k in settings_of(j)} for j in jobs}
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "lift"
        if any(JOBS[j][0] == "offline" for j in jobs):
            collect_dataset(dataset)
        for job in jobs:
            order = settings_of(job)
            for r in range(a.rounds):
                for k in order if r % 2 == 0 else order[::-1]:  # alternate which goes first
                    res = run_job(JOBS[job], k, dataset)
                    runs[job][k].append(res)
                    print(f"{job} setting {k} round {r}: {res}", flush=True)
    loop_runs: dict[str, dict[str, list[float]]] = {x: {k: [] for k in LOOP_SETTINGS} for x in loops}
    for name in loops:
        for r in range(a.rounds):
            for k in list(LOOP_SETTINGS) if r % 2 == 0 else list(LOOP_SETTINGS)[::-1]:
                loop_runs[name][k].append(run_loop(name, k, a.seconds))
                print(f"library loop {name} {k} round {r}: {loop_runs[name][k][-1]} env steps/s", flush=True)
    summary = {}
    for job, by_k in runs.items():
        rate = {k: median(rate_of(x) for x in xs) for k, xs in by_k.items()}
        ref = "1"
        summary[job] = {"median_rate": rate, "speed_over_setting_1": {k: round(v / rate[ref], 3)
                                                                     for k, v in rate.items() if k != ref}}
        if JOBS[job][0] == "train":
            summary[job]["median_sim_share"] = {k: median(x["sim_share"] for x in xs) for k, xs in by_k.items()}
            summary[job]["median_sim_s"] = {k: median(x["sim_s"] for x in xs) for k, xs in by_k.items()}
        spun = {k: k.replace(", libgomp spin", "") for k in by_k if k.endswith("libgomp spin")}
        summary[job]["robot_rl_spin_over_libgomp_spin"] = {base: round(rate[base] / rate[k], 3)
                                                          for k, base in spun.items()}
    loop_summary = {}
    for name, by_k in loop_runs.items():
        med = {k: median(v) for k, v in by_k.items()}
        loop_summary[name] = {"median_env_steps_per_s": med,
                              "robot_rl_spin_over_libgomp_spin": round(med["robot_rl spin"] / med["libgomp spin"], 3)}
    data = {"jobs": {j: ["robot-rl", *JOBS[j], *COMMON[JOBS[j][0]]] for j in jobs},
            "settings": {k: {"torch_threads": t, "update_threads": u,
                             "GOMP_SPINCOUNT": spin or f"robot_rl's default ({OPENMP_SPIN_DEFAULT})"}
                         for k, (t, u, spin) in SETTINGS.items()},
            "unit": "train: env steps per second of training wall-clock (the run's curve: wall_s excludes start-up); "
                    "offline: gradient steps per second; library_loop: env steps per second",
            "runs": runs, "summary": summary,
            "library_loop": {"what": "a user's loop: sim imported before torch, torch at 2 threads, a random 3 x 256 "
                                     "MLP policy's forward pass between env steps (mujoco backend, 2 rollout threads)"
                                     f"; {a.seconds:g} s timed per run, each in its own process",
                             "settings": {k: v or f"robot_rl's default ({OPENMP_SPIN_DEFAULT})"
                                          for k, v in LOOP_SETTINGS.items()},
                             "runs": loop_runs, "summary": loop_summary}}
    path = write_result(NAME, data, [], a.out)

    plot(data, a.out / f"{NAME}.png")
    print("wrote", path)
    for j in jobs:
        print(f"  {j}: {summary[j]}")
    for x in loops:
        print(f"  library loop {x}: {loop_summary[x]}")


if __name__ == "__main__":
    main()
