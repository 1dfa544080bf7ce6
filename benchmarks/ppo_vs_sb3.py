"""Wall-clock to 90% success on so101_reach and so101_lift: our PPO vs Stable-Baselines3 PPO, side by side in one run.

Both learn on the same batched env (so101_reach 64 envs, so101_lift 256 as in the README's lift recipe; 2 physics
threads; SB3 through ``sim.gym.sb3_vec_env``) with the same recipe (rsl_rl's: 24 steps per env, 5 epochs x 4
minibatches, lr 1e-3, γ 0.99, λ 0.95, clip 0.2, entropy 0.01, value coef 1, grad-norm 1, ELU [256, 128, 64] actor
and critic with orthogonal init, observation normalization: VecNormalize for SB3, which has no adaptive-KL lr, no
separate critic observations and, by default, no value clipping). One torch thread each while collecting; ours'
runner gives torch every core during its update (``update_threads``, robot-rl train's default), and
``--methods sb3_update_threads`` gives SB3 the same split through a callback, to tell the split from the rest.
Success is the rolling rate over the last 200 finished episodes for both, read once per rollout after its update (as
ours' runner logs it; SB3's first crossing at any env step is kept beside it); the clock starts when learning starts
and stops when that rate first reaches 90% (or at the task's budget). Each run also records ``sim_s``, its time
inside the env's step. After the runs, one rollout and update of ours is profiled for the time its dense kernels
(matrix products, ELU and its gradient) take per env step, a floor under ours' time outside env.step (``kernel_floor``
in the summary; ours' reach and lift recipes run the update's hidden layers in bf16 where the CPU has native bf16,
``algo.bf16=auto``, SB3 in float32).

    python benchmarks/ppo_vs_sb3.py                       # seeds 0-2; reach up to 8 min, lift up to 12 min each
    python benchmarks/ppo_vs_sb3.py --quick               # seed 0, reach only, up to 2 min each
    python benchmarks/ppo_vs_sb3.py --tasks so101_reach --seeds 0 1 2

Parts can run as separate processes (one per core) and be merged:

    python benchmarks/ppo_vs_sb3.py --tasks so101_lift --seeds 0 --methods ours --out /tmp/a
    python benchmarks/ppo_vs_sb3.py --tasks so101_lift --seeds 0 --methods sb3 --out /tmp/b
    python benchmarks/ppo_vs_sb3.py --tasks --merge-from /tmp/a/ppo_vs_sb3.json /tmp/b/ppo_vs_sb3.json \
        benchmarks/results/ppo_vs_sb3.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import robot_rl  # noqa: I001  (before torch, as in robot-rl train: OpenMP's spin, robot_rl.OPENMP_SPIN)
import matplotlib
import torch

from benchmarks.common import RESULTS, goal, provenance, write_result
from robot_rl.runners.common import available_cores

matplotlib.use("Agg")
import matplotlib.pyplot as plt

THREADS, TARGET, WINDOW = 2, 0.9, 200
# Per library per seed (a cap: runs stop at 90%). Lift's 12 min is the budget its recorded runs had (720 s); before
# the recipe gave the gripper an opening, a seed on lift's open-gripper plateau could stay there far past it (seed 1
# once sat there for 7.9 M env steps, 20 min).
BUDGET_MIN = {"so101_reach": 8.0, "so101_lift": 12.0}
NUM_ENVS = {"so101_reach": 64, "so101_lift": 256}  # lift: the README's recipe (90 % at 0.65-1.55 M env steps, 5 of 5 seeds)
# sb3_gym: SB3 through gymnasium.make envs (run_sb3). sb3_update_threads: SB3 on our batched env with ours' thread split
# (every core for torch while it trains, one while it collects; a callback), to tell that split from the rest.
METHODS = ("ours", "sb3", "sb3_gym", "sb3_update_threads")


def run_ours(task: str, seed: int, budget_min: float, keep: Path | None = None) -> dict:
    """Through the CLI's own train(): the recipe of configs/algo/ppo.yaml (with the task's own, where
    configs/algo_task has one), nothing tuned here. ``keep``: runs go to ``keep/<task>_s<seed>``, and a finished run
    already there with the same composed config (``robot-rl train`` with these overrides) is read, not retrained:
    CPU runs are deterministic, so it is the run this would make (an interrupted benchmark loses nothing)."""
    from omegaconf import OmegaConf

    from robot_rl.cli.build import compose
    from robot_rl.cli.main import train
    from robot_rl.logging import read_curve

    run_dir = keep / f"{task}_s{seed}" if keep else Path(tempfile.mkdtemp(prefix="ppo_vs_sb3_ours_"))
    cfg = compose("train", [f"task={task}", "algo=ppo", f"seed={seed}", f"sim.num_envs={NUM_ENVS[task]}",
                             f"sim.num_threads={THREADS}", "total_steps=null", f"max_minutes={budget_min}",
                             f"stop_success_rate={TARGET}", f"success_window={WINDOW}", "eval.enabled=false",
                             "logger.progress=false", "logger.tensorboard=false", "checkpoint_every=100000",
                             f"run_dir={run_dir}"])
    reused = keep is not None and _finished_run(run_dir, OmegaConf.to_container(cfg), budget_min)
    if reused:
        print(f"{task} ours seed {seed}: reading the finished run {run_dir}", flush=True)
    try:
        if not reused:
            shutil.rmtree(run_dir, ignore_errors=True)
            train(cfg)
        pts = read_curve(run_dir)
    finally:
        if keep is None:  # a throwaway run folder (checkpoints, curve): ~1.5 MB per reach run
            shutil.rmtree(run_dir, ignore_errors=True)
    curve = [(p["wall_s"], p["env_steps"], p["success_rate"], p["sim_s"]) for p in pts
             if p["success_rate"] is not None]
    return {**_summary(curve, budget_min), **({"reused_run": str(run_dir)} if reused else {})}


def _finished_run(run_dir: Path, composed: dict, budget_min: float) -> bool:
    """Whether ``run_dir`` holds a run of ``composed`` (its config.yaml equal but for run_dir) that stopped at the
    target success rate or at the budget."""
    import yaml

    from robot_rl.logging import read_curve

    if not (run_dir / "config.yaml").is_file() or not (run_dir / "curve.jsonl").is_file():
        return False
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    if {**saved, "run_dir": None} != {**composed, "run_dir": None}:
        return False
    pts = read_curve(run_dir)
    return bool(pts) and ((pts[-1]["success_rate"] or 0.0) >= TARGET or pts[-1]["wall_s"] >= 60 * budget_min)


def recipe_task_overrides(task: str) -> dict[str, Any]:
    """The task settings ours trains ``task`` on where they differ from the task's defaults (a recipe in
    configs/algo_task/ppo_<task>.yaml may set some, e.g. so101_lift's reward weights): SB3's env gets them too, so
    both libraries learn the same reward."""
    from omegaconf import OmegaConf

    from robot_rl.cli.build import compose
    from sim.registry import task_config

    raw = OmegaConf.to_container(compose("train", [f"task={task}", "algo=ppo"]).task, resolve=True)
    raw.pop("name")
    default = task_config(task)
    return {k: v for k, v in raw.items() if getattr(default, k) != v}


def run_sb3(task: str, seed: int, budget_min: float, gym_path: bool = False, update_threads: int | None = None) -> dict:
    """SB3 PPO on our batched env through ``sim.gym.sb3_vec_env`` (its fastest setting here), or, with ``gym_path``,
    the way an SB3 user runs a gymnasium env: ``make_vec_env`` over N ``gymnasium.make`` envs in a DummyVecEnv
    (SubprocVecEnv would put N processes on 2 cores). ``update_threads``: torch's threads while SB3 trains (set when
    a rollout ends, back to one when the next starts), as ``robot-rl train``'s runner does for ours."""
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecNormalize

    from sim.config import SimConfig
    from sim.gym import GYM_IDS, sb3_vec_env
    from sim.registry import make_env, task_config

    n = NUM_ENVS[task]
    clock = _Clock()
    overrides = recipe_task_overrides(task)
    if gym_path:
        env_id = next(k for k, v in GYM_IDS.items() if v == task)
        inner = make_vec_env(env_id, n_envs=n, seed=seed, env_kwargs=overrides)
        inner.step_wait = clock.timed(inner.step_wait)  # the N gymnasium envs' steps, as SB3 calls them
    else:
        env = make_env(task, SimConfig(num_envs=n, num_threads=THREADS, seed=seed), task_config(task, overrides))
        env.step = clock.timed(env.step)  # the batched env alone, as our runner times it (sim_s)
        inner = sb3_vec_env(env)
    venv = VecNormalize(inner, norm_obs=True, norm_reward=False, gamma=0.99)
    venv.seed(seed)
    arch = [256, 128, 64]
    model = SB3PPO("MlpPolicy", venv, n_steps=24, batch_size=24 * n // 4, n_epochs=5, learning_rate=1e-3,
                   gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.01, vf_coef=1.0, max_grad_norm=1.0,
                   policy_kwargs={"net_arch": {"pi": arch, "vf": arch}, "activation_fn": torch.nn.ELU},  # ortho init
                   seed=seed, device="cpu", verbose=0)
    model.set_logger(Logger(None, []))  # SB3's default leaves an empty /tmp/SB3-<date> folder per run
    curve: list[tuple[float, int, float]] = []

    # Read as ours' runner reads its rate: once per rollout, after that rollout's update (SB3's on_rollout_start
    # follows the previous train()), so neither library stops inside a rollout or skips the update that closes it.
    # The first env step at which SB3's rate reached the target is kept beside it (``any_step``).
    any_step: list[tuple[float, int]] = []

    class Track(BaseCallback):
        def _on_training_start(self) -> None:
            self.t0, self.succ, self.stop = time.perf_counter(), deque(maxlen=WINDOW), False

        def _on_rollout_start(self) -> None:
            if update_threads is not None:
                torch.set_num_threads(1)
            if len(self.succ) == WINDOW:
                rate = sum(self.succ) / WINDOW
                curve.append((time.perf_counter() - self.t0, self.num_timesteps, rate, clock.total))
                self.stop = rate >= TARGET

        def _on_rollout_end(self) -> None:
            if update_threads is not None:
                torch.set_num_threads(update_threads)

        def _on_step(self) -> bool:
            if self.stop:
                return False
            for info, done in zip(self.locals["infos"], self.locals["dones"], strict=True):
                if done:
                    self.succ.append(float(info.get("is_success", False)))
            wall = time.perf_counter() - self.t0
            if not any_step and len(self.succ) == WINDOW and sum(self.succ) / WINDOW >= TARGET:
                any_step.append((round(wall, 2), self.num_timesteps))
            return wall < 60 * budget_min

    try:
        model.learn(total_timesteps=10**9, callback=Track())
    finally:
        torch.set_num_threads(1)
    venv.close()
    return {**_summary(curve, budget_min), "any_step_wall_s_and_env_steps_to_target": any_step[0] if any_step else None}


# The dense kernels of PPO's update and of collection's forward passes: matrix products and the ELU with its
# gradient (in place, "aten::elu_", in policies.mlp since a5668dc; this list missed it until 2026-12-06, so floors
# recorded before then leave out ~10 % of the kernels' time). SB3 runs the same layers, minibatch size and epochs in
# float32; ours' recipes for so101_reach and so101_lift run the update's hidden layers in bf16 where the CPU has it
# (algo.bf16=auto), so their floor is ours' own, below what the same kernels cost SB3 in float32.
KERNELS = ("aten::mm", "aten::addmm", "aten::elu", "aten::elu_", "aten::elu_backward")


def kernel_floor(task: str, seed: int = 0) -> dict[str, float]:
    """Seconds per env step that ours spends inside ``KERNELS`` (torch profiler self time, one rollout's ``act``
    calls and its update, after one warm-up iteration): a floor under ours' time outside env.step (and, where ours
    computes in float32, under any PPO implementation of this recipe on this machine, SB3's included)."""
    from torch.profiler import ProfilerActivity, profile

    from robot_rl.cli.build import build_training, compose

    run_dir = tempfile.mkdtemp(prefix="ppo_floor_")
    cfg = compose("train", [f"task={task}", "algo=ppo", f"seed={seed}", f"sim.num_envs={NUM_ENVS[task]}",
                             f"sim.num_threads={THREADS}", "total_steps=100000000", "eval.enabled=false",
                             "logger.progress=false", "logger.tensorboard=false", "checkpoint_every=100000000",
                             f"run_dir={run_dir}"])
    run = build_training(cfg)
    try:
        runner = run.runner
        runner.start()
        runner.run_iteration()  # warm-up: first-call allocations
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            runner.run_iteration()
        steps = runner.cfg.num_steps * runner.env.num_envs
        self_s = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages() if e.key in KERNELS}
    finally:
        run.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return {"kernel_s_per_env_step": sum(self_s.values()) / steps,
            "by_kernel_s_per_env_step": {k: v / steps for k, v in sorted(self_s.items())}}


class _Clock:
    """Wall-clock summed over the calls of the functions it wraps (the simulator's share of a run)."""

    def __init__(self) -> None:
        self.total = 0.0

    def timed(self, fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - t0
        return call


def _summary(curve: list[tuple[float, int, float, float]], budget_min: float) -> dict:
    """``curve``: (wall_s, env_steps, success_rate, sim_s) points; sim_s: the part of wall_s spent in env steps."""
    hit = next((c for c in curve if c[2] >= TARGET), None)
    return {"reached": hit is not None, "wall_s_to_target": None if hit is None else round(hit[0], 2),
            "env_steps_to_target": None if hit is None else hit[1], "budget_s": 60 * budget_min,
            "sim_s_to_target": None if hit is None else round(hit[3], 2),
            "final_success_rate": curve[-1][2] if curve else None,
            "curve": [(round(w, 2), s, round(r, 4)) for w, s, r, _ in _thin(curve, 200)]}


def _outside_s_per_step(run: dict) -> float | None:
    """Seconds outside env.step per env step up to the target (the learner's and the loop's own cost)."""
    if not run["reached"] or run.get("sim_s_to_target") is None:
        return None
    return (run["wall_s_to_target"] - run["sim_s_to_target"]) / run["env_steps_to_target"]


def _thin(curve: list, n: int) -> list:
    """About ``n`` points of a curve, its last one (where a run stopped) always among them."""
    pts = curve[:: max(1, len(curve) // n)]
    return pts + curve[-1:] if curve and pts[-1] != curve[-1] else pts


def _merge(path: Path, runs: dict[str, dict[str, dict[int, dict]]], budgets: dict[str, float]) -> dict[str, Any]:
    """Add the runs (task, method, seed) of an earlier result file that this run did not do. The parts of the lift
    comparison take an hour each; they run as separate processes and meet here. A task's runs must share a budget
    and an env count."""
    old = json.loads(Path(path).read_text())
    for task, methods in old["runs"].items():
        envs = old["num_envs"][task] if isinstance(old["num_envs"], dict) else old["num_envs"]
        if envs != NUM_ENVS.get(task):
            raise ValueError(f"--merge-from: {task} ran with {envs} envs in {path}, this script uses {NUM_ENVS[task]}")
        for name, seeds in methods.items():
            for seed, r in seeds.items():
                if task in budgets and r["budget_s"] != 60 * budgets[task]:
                    raise ValueError(f"--merge-from: {task} ran with a {r['budget_s']} s budget in {path}, "
                                     f"{60 * budgets[task]} s here")
                budgets.setdefault(task, r["budget_s"] / 60)
                runs.setdefault(task, {m: {} for m in METHODS})[name].setdefault(int(seed), r)
    return provenance(path, old)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seed 0, so101_reach only, 2-minute budget")
    parser.add_argument("--tasks", nargs="*", default=None, choices=sorted(BUDGET_MIN))
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--budget-min", type=float, default=None, help="override every task's wall-clock budget")
    parser.add_argument("--merge-from", type=Path, nargs="*", default=[],
                        help="earlier ppo_vs_sb3.json files to add runs from (parts run in other processes)")
    parser.add_argument("--keep-runs", type=Path, default=None,
                        help="ours' run folders go here (<task>_s<seed>); finished ones of the same config are read")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    tasks = (["so101_reach"] if args.quick else list(BUDGET_MIN)) if args.tasks is None else args.tasks
    budgets = {t: args.budget_min or (2.0 if args.quick else BUDGET_MIN[t]) for t in tasks}
    torch.set_num_threads(1)

    runs: dict[str, dict[str, dict[int, dict]]] = {t: {m: {} for m in METHODS} for t in tasks}
    for task in tasks:
        for seed in seeds:
            for name in args.methods:
                fn = partial(run_ours, keep=args.keep_runs) if name == "ours" else partial(
                    run_sb3, gym_path=name == "sb3_gym",
                    update_threads=available_cores() if name == "sb3_update_threads" else None)
                r = runs[task][name][seed] = fn(task, seed, budgets[task])
                r["openmp_spin"] = f"{robot_rl.OPENMP_SPIN} (GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')})"
                print(f"{task} {name} seed {seed}: reached={r['reached']} wall_s={r['wall_s_to_target']} "
                      f"env_steps={r['env_steps_to_target']} final_success={r['final_success_rate']}", flush=True)
    merged_from = [_merge(path, runs, budgets) for path in args.merge_from]
    tasks = [t for t in BUDGET_MIN if t in runs]
    floors = {t: kernel_floor(t) for t in tasks if runs[t]["ours"] and runs[t]["sb3"]}  # merged runs' tasks too

    def median(task: str, name: str, key: str) -> float | None:
        """A run that never reached the target counts as the budget in time; in env steps, no number (None)."""
        vals = [r.get(key) if r.get(key) is not None else (r["budget_s"] if key == "wall_s_to_target" else None)
                for r in runs[task][name].values()]
        return None if None in vals else statistics.median(vals)

    def outside_s_per_step(task: str, name: str) -> float | None:
        """Median over the seeds that reached the target (None when none did or sim_s was not kept)."""
        vals = [v for v in map(_outside_s_per_step, runs[task][name].values()) if v is not None]
        return statistics.median(vals) if vals else None

    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 4), squeeze=False)
    summary, goals = {}, []
    for ax, task in zip(axes[0], tasks, strict=True):
        for name, color in (("ours", "tab:blue"), ("sb3", "tab:orange"), ("sb3_gym", "tab:red"),
                            ("sb3_update_threads", "tab:green")):
            for seed, r in sorted(runs[task][name].items()):
                xs, ys = [c[0] / 60 for c in r["curve"]], [c[2] for c in r["curve"]]
                ax.plot(xs, ys, color=color, alpha=0.8, label=name if seed == min(runs[task][name]) else None)
        ax.axhline(TARGET, color="gray", ls="--", lw=1)
        n_seeds = len(runs[task]["ours"])
        ax.set(xlabel="wall-clock (min)", ylabel=f"success rate (last {WINDOW} episodes)",
               title=f"PPO on {task}, {NUM_ENVS[task]} envs: ours vs SB3 ({n_seeds} seed(s))")
        ax.legend()
        ax.grid(alpha=0.3)
        if not (runs[task]["ours"] and runs[task]["sb3"]):  # a part of the comparison: its runs only, to merge
            print(f"{task}: no runs of {'ours' if not runs[task]['ours'] else 'sb3'} here: runs written, not scored "
                  "(merge the parts with --merge-from)")
            continue
        ran = [n for n in METHODS if runs[task][n]]
        t = {n: median(task, n, "wall_s_to_target") for n in ran}
        reached = {n: sum(r["reached"] for r in runs[task][n].values()) for n in ran}
        summary[task] = {"budget_s": 60 * budgets[task], "num_envs": NUM_ENVS[task],
                         "seeds": {n: sorted(runs[task][n]) for n in ran},
                         "median_wall_s_to_target": t,
                         "median_env_steps_to_target": {n: median(task, n, "env_steps_to_target") for n in ran},
                         "median_sim_s_to_target": {n: median(task, n, "sim_s_to_target") for n in ran},
                         "seeds_reached": reached,
                         "median_final_success_rate": {n: statistics.median(r["final_success_rate"] or 0.0
                                                                            for r in runs[task][n].values())
                                                       for n in ran},
                         "median_final_env_steps": {n: statistics.median(r["curve"][-1][1] if r["curve"] else 0
                                                                         for r in runs[task][n].values())
                                                    for n in ran}}
        # Issue 13's goals (the old <= 0.25x wall-clock goal is retired: the shared simulator alone is 0.62 of SB3's
        # run). Against SB3 on the same batched env (behind SB3's VecEnv API): wall-clock to 90 % <= 1.0x, and
        # ours' seconds outside env.step per env step <= 0.5x SB3's (the learner's own cost). Against SB3 on
        # gymnasium.make envs the wall-clock ratio is reported, unscored. No ratio when neither side reached the
        # target: both are then the budget.
        if "sb3" in ran and (reached["ours"] or reached["sb3"]):
            goals.append(goal(f"ppo_wallclock_ratio_vs_sb3_{task}", t["ours"] / t["sb3"], 1.0, "<="))
        if "sb3_gym" in ran and (reached["ours"] or reached["sb3_gym"]):
            summary[task]["wallclock_ratio_vs_sb3_gymnasium_envs"] = round(t["ours"] / t["sb3_gym"], 4)
        if "sb3_update_threads" in ran and (reached["ours"] or reached["sb3_update_threads"]):
            summary[task]["wallclock_ratio_vs_sb3_update_threads"] = round(t["ours"] / t["sb3_update_threads"], 4)
        outside = {n: outside_s_per_step(task, n) for n in ran}
        summary[task]["median_outside_env_step_s_per_env_step"] = outside
        if outside.get("ours") is not None and outside.get("sb3") is not None:
            goals.append(goal(f"ppo_outside_env_step_time_ratio_vs_sb3_{task}", outside["ours"] / outside["sb3"],
                              0.5, "<="))
            if task in floors:  # what the 0.5x goal asks of the shared kernels alone (> 0.5: not reachable)
                floor = floors[task]["kernel_s_per_env_step"]
                summary[task]["kernel_floor"] = {**floors[task],
                                                 "floor_over_sb3_outside": round(floor / outside["sb3"], 4),
                                                 "ours_outside_over_floor": round(outside["ours"] / floor, 4)}
        if task == "so101_lift":  # a run that never reached counts at its last env step (a lower bound)
            steps = statistics.median(r["env_steps_to_target"] or (r["curve"][-1][1] if r["curve"] else 0)
                                      for r in runs[task]["ours"].values())
            goals.append(goal("ppo_median_env_steps_to_90pct_so101_lift", steps, 1.8e6, "<="))
        # The floor under the ratio: ours' time inside env.step alone over SB3's whole time. A learner that cost
        # nothing, needing the env steps ours needed, would still take this ratio (both step the same env).
        sim = summary[task]["median_sim_s_to_target"]
        summary[task]["ratio_floor_ours_sim_s_over_sb3_wall_s"] = {
            o: round(sim["ours"] / t[o], 4) for o in ("sb3", "sb3_gym")
            if o in ran and sim.get("ours") is not None and reached[o]}
        goals.append(goal(f"ppo_reaches_90pct_{task}_all_seeds", float(reached["ours"] == n_seeds), 1.0, ">="))
        print(f"{task}: " + ", ".join(f"{n} {v:.1f} s" for n, v in t.items()))
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "ppo_vs_sb3.png", dpi=100)

    data = {"merged_from": merged_from, "tasks": tasks, "num_envs": {t: NUM_ENVS[t] for t in tasks},
            "physics_threads": THREADS, "torch_threads": 1,
            "update_threads": {"ours": "robot-rl train's default: the cores available", "sb3": 1, "sb3_gym": 1,
                               "sb3_update_threads": available_cores()},
            "target_success_rate": TARGET,
            "success_window_episodes": WINDOW, "summary": summary,
            "note": "a run that did not reach the target within the budget counts as the budget: the ratio is then "
                    "a bound",
            "runs": {t: {n: {str(k): v for k, v in sorted(r.items())} for n, r in ms.items()}
                     for t, ms in runs.items()}}
    path = write_result("ppo_vs_sb3", data, goals, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
