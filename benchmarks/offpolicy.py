"""FlashSAC vs Stable-Baselines3 SAC (and our PPO), side by side in one run.

Part 1, our tasks at equal wall-clock: FlashSAC (configs/algo/flashsac.yaml, the CLI's CPU defaults), SB3 SAC (its
defaults: 1 env, [256, 256] MLPs, batch 256, 1 update per step, lr 3e-4) on the same env through
``sim.gym.sb3_vec_env``, and our PPO (configs/algo/ppo.yaml). Every ``eval_every`` seconds of training the clock
stops and the deterministic policy is evaluated on 50 seeded episodes (the same for every method); success rate
against training wall-clock is the curve.

Part 2, gymnasium MuJoCo at equal env steps: FlashSAC (1 env, batch 256, 2 updates per env step, see
``GYM_FLASHSAC``; the rest from flashsac.yaml) vs SB3 SAC (defaults), both on one env, through
``sim.gym_vec.GymVecEnv`` for ours; mean return of 5 deterministic episodes at the end.

    python benchmarks/offpolicy.py --quick    # so101_reach, 1 seed, 3 min per method; HalfCheetah-v5 5k steps
    python benchmarks/offpolicy.py            # so101_reach + so101_lift, 3 seeds, 15 min each; HalfCheetah-v5 and
                                              # Humanoid-v5, 3 seeds, 100k steps (many hours on 2 cores)
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib
import numpy as np
import torch

from benchmarks.common import RESULTS, goal, provenance, write_result

matplotlib.use("Agg")
import matplotlib.pyplot as plt

TARGET, EVAL_EPISODES, EVAL_SEED = 0.9, 50, 10_000
Curve = list[tuple[float, int, float, float]]  # (train wall s, env steps, success rate, mean return)


def _eval_env(task: str) -> Any:
    from sim.config import SimConfig
    from sim.registry import make_env, task_config

    return make_env(task, SimConfig(num_envs=EVAL_EPISODES, num_threads=2, seed=EVAL_SEED), task_config(task))


def _evaluate(env: Any, act: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> tuple[float, float]:
    from robot_rl.evaluation import evaluate

    r = evaluate(env, act, EVAL_EPISODES, seed=EVAL_SEED)
    return r.success_rate, r.mean_return


def _ours(task: str, algo: str, seed: int, budget_s: float, eval_every: float, stop_at: float | None = None) -> Curve:
    """Our learner as ``robot-rl train task=<task> algo=<algo>`` builds it, driven iteration by iteration, until
    ``budget_s`` of training or (``stop_at``) the first evaluation at that success rate."""
    from omegaconf import OmegaConf

    from robot_rl.checkpoint import CheckpointManager
    from robot_rl.cli.build import build_algorithm, build_env, build_runner, compose, seed_everything
    from robot_rl.logging import LoggerConfig, RunLogger
    from robot_rl.runners.common import RunLimits

    cfg = OmegaConf.to_container(compose("train", [f"task={task}", f"algo={algo}", f"seed={seed}"]), resolve=True)
    algo_raw = dict(cfg["algo"])
    seed_everything(seed)
    env = build_env(cfg["task"], cfg["sim"])
    built, runner_keys = build_algorithm(algo_raw.pop("name"), algo_raw, env, torch.device("cpu"))
    tmp = Path(tempfile.mkdtemp(prefix=f"offpolicy_{algo}_"))
    logger = RunLogger(tmp, LoggerConfig(progress=False, tensorboard=False))
    runner = build_runner(algo, env, built, runner_keys, RunLimits(total_steps=None, max_minutes=1e9, seed=seed),
                          logger, CheckpointManager(tmp / "c"), {})
    runner.start()
    step = runner.run_iteration  # the runner's loop body, without its checkpoint writes
    ev, curve, next_eval = _eval_env(task), [], 0.0
    policy = built.policy
    while True:
        if runner.elapsed_s >= next_eval or runner.elapsed_s >= budget_s:
            policy.eval()
            succ, ret = _evaluate(ev, lambda o: policy.act(o, deterministic=True))
            curve.append((round(runner.elapsed_s, 1), runner.env_steps, succ, round(ret, 3)))
            print(f"  {algo:8s} {task} seed {seed}: {runner.elapsed_s:6.1f} s {runner.env_steps:8d} steps "
                  f"success {succ:.2f} return {ret:7.2f}", flush=True)
            next_eval += eval_every
            if runner.elapsed_s >= budget_s or (stop_at is not None and succ >= stop_at):
                break
        step()
    env.close()
    ev.close()
    logger.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return curve


def _sb3_sac(task: str, seed: int, budget_s: float, eval_every: float, num_envs: int = 1) -> Curve:
    """SB3 SAC with its defaults on 1 env; with ``num_envs`` > 1 (``sb3_sac_vec``) on as many envs as FlashSAC, one
    gradient step per vector step (FlashSAC's update-to-data ratio), so that it sees the same stream of data."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger

    from sim.config import SimConfig
    from sim.gym import sb3_vec_env
    from sim.registry import make_env, task_config

    venv = sb3_vec_env(make_env(task, SimConfig(num_envs=num_envs, num_threads=1, seed=seed), task_config(task)))
    venv.seed(seed)
    model = SAC("MlpPolicy", venv, seed=seed, device="cpu", verbose=0)  # train_freq 1, gradient_steps 1: per step
    model.set_logger(Logger(None, []))  # SB3's default leaves an empty /tmp/SB3-<date> folder per run
    # of the vector env (SB3 counts train_freq in vector steps)
    ev, curve, name = _eval_env(task), [], "sb3_sac" if num_envs == 1 else "sb3_sac_vec"

    def act(o: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.as_tensor(model.predict(o["policy"].cpu().numpy(), deterministic=True)[0])

    class Clock(BaseCallback):
        def _on_training_start(self) -> None:
            self.t0, self.paused, self.next = time.perf_counter(), 0.0, 0.0

        def _on_step(self) -> bool:
            train_s = time.perf_counter() - self.t0 - self.paused
            if train_s >= self.next or train_s >= budget_s:
                start = time.perf_counter()
                succ, ret = _evaluate(ev, act)
                self.paused += time.perf_counter() - start
                curve.append((round(train_s, 1), self.num_timesteps, succ, round(ret, 3)))
                print(f"  {name:8s} {task} seed {seed}: {train_s:6.1f} s {self.num_timesteps:8d} steps "
                      f"success {succ:.2f} return {ret:7.2f}", flush=True)
                self.next += eval_every
            return train_s < budget_s

    model.learn(total_timesteps=10**9, callback=Clock())
    venv.close()
    ev.close()
    return curve


# FlashSAC on one gymnasium env (the rest from configs/algo/flashsac.yaml); --gym-flashsac adds Hydra overrides
# after these. DESIGN.md §5's single-CPU-env setting is batch 512, 1 update per env step; at the same compute, batch
# 256 with 2 updates per env step learned Humanoid-v5 faster here (30 k steps, seed 0: 474 vs 390; width 128 at
# batch 256, 1 update: 414), so the benchmark runs that (results/offpolicy.json, notes).
_GYM_COMMON = ["algo.learning_starts=1000", "algo.steps_per_iteration=100"]
DESIGN_GYM_FLASHSAC = ["algo.batch_size=512", "algo.updates_per_step=1.0", *_GYM_COMMON]
GYM_FLASHSAC = ["algo.batch_size=256", "algo.updates_per_step=2.0", *_GYM_COMMON]


def _gym_flashsac(env_id: str, seed: int, steps: int, overrides: list[str]) -> float:
    from omegaconf import OmegaConf

    from robot_rl.cli.build import build_algorithm, build_runner, compose, seed_everything
    from robot_rl.logging import LoggerConfig, RunLogger
    from robot_rl.runners.common import RunLimits
    from sim.gym_vec import GymVecEnv

    algo_raw = OmegaConf.to_container(compose("train", ["algo=flashsac", *overrides]).algo, resolve=True)
    seed_everything(seed)
    env = GymVecEnv(env_id, num_envs=1, seed=seed)
    algo, runner_keys = build_algorithm(algo_raw.pop("name"), algo_raw, env, torch.device("cpu"))
    tmp = Path(tempfile.mkdtemp(prefix="offpolicy_gym_"))
    runner = build_runner("flashsac", env, algo, runner_keys, RunLimits(total_steps=steps, seed=seed),
                          RunLogger(tmp, LoggerConfig(progress=False, tensorboard=False)), None, {})
    runner.learn()
    runner.logger.close()
    shutil.rmtree(tmp, ignore_errors=True)
    algo.policy.eval()
    return _gym_return(env_id, seed, lambda x: algo.policy.act(torch.as_tensor(x, dtype=torch.float32)[None])[0]
                       .numpy())


def _gym_sb3_sac(env_id: str, seed: int, steps: int) -> float:
    import gymnasium
    from stable_baselines3 import SAC
    from stable_baselines3.common.logger import Logger

    model = SAC("MlpPolicy", gymnasium.make(env_id), seed=seed, device="cpu", verbose=0)
    model.set_logger(Logger(None, []))  # SB3's default leaves an empty /tmp/SB3-<date> folder per run
    model.learn(total_timesteps=steps)
    low, high = model.action_space.low, model.action_space.high
    # our GymVecEnv maps [-1, 1] onto the bounds; SB3 predicts in env units: rescale back for the shared scorer
    return _gym_return(env_id, seed, lambda x: 2.0 * (model.predict(x, deterministic=True)[0] - low) / (high - low)
                       - 1.0)


def _gym_return(env_id: str, seed: int, act: Callable[[np.ndarray], np.ndarray], episodes: int = 5) -> float:
    import gymnasium

    env = gymnasium.make(env_id)
    low, high = env.action_space.low, env.action_space.high
    total = []
    for i in range(episodes):
        x, _ = env.reset(seed=EVAL_SEED + seed * 100 + i)
        done, ret = False, 0.0
        while not done:
            a = np.clip(act(x), -1.0, 1.0)
            x, r, term, trunc, _ = env.step(low + 0.5 * (a + 1.0) * (high - low))
            ret, done = ret + float(r), term or trunc
        total.append(ret)
    env.close()
    return float(np.mean(total))


PART1: dict[str, Callable[[str, int, float, float], Curve]] = {
    "flashsac": lambda task, seed, b, e: _ours(task, "flashsac", seed, b, e),
    "sb3_sac": _sb3_sac,
    "sb3_sac_vec": lambda task, seed, b, e: _sb3_sac(task, seed, b, e, num_envs=16),
    "ppo": lambda task, seed, b, e: _ours(task, "ppo", seed, b, e),
}


def _time_to(curve: Curve, target: float) -> float | None:
    return next((c[0] for c in curve if c[2] >= target), None)


def _overrides(setting: list[str]) -> dict[str, str]:
    """Hydra overrides as key -> value, the last one winning (two lists can mean the same setting)."""
    return dict(o.split("=", 1) for o in setting)


def _merge(path: Path, part1: dict, part2: dict, budgets: dict[str, float],
           setting: list[str], other_settings: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """Fold an earlier run's results (the JSON at ``path``) into this run's: seeds this run did not redo are added
    (``--merge``). Parts of the benchmark take hours on 2 cores; they can run as separate processes, one per core,
    and meet here. A task's runs must share one budget. Gymnasium FlashSAC runs of another setting than this run's
    (``setting``) are not scored: they go to ``other_settings``, kept in the JSON with what they came from."""
    import json

    if not path.exists():
        return None
    old = json.loads(path.read_text())
    for task, methods in old.get("curves", {}).items():
        budget = old["budget_s"][task]
        if task in part1 and budgets[task] != budget:
            raise ValueError(f"--merge: {task} ran with {budgets[task]} s here and {budget} s in {path}")
        budgets[task] = budget
        for m, runs in methods.items():
            for seed, curve in runs.items():
                part1.setdefault(task, {}).setdefault(m, {}).setdefault(int(seed), [tuple(p) for p in curve])
    for env_id, rec in old.get("gym", {}).items():
        if env_id in part2 and budgets[env_id] != rec["env_steps"]:
            raise ValueError(f"--merge: {env_id} ran {budgets[env_id]} steps here and {rec['env_steps']} in {path}")
        budgets[env_id] = rec["env_steps"]
        other_settings.setdefault(env_id, []).extend(rec.get("other_flashsac_settings", []))
        old_setting = rec.get("flashsac_setting", DESIGN_GYM_FLASHSAC)  # results from before the option: DESIGN's
        for m, runs in rec["returns"].items():
            if m == "flashsac" and _overrides(old_setting) != _overrides(setting):
                other_settings[env_id].append({"setting": old_setting, "returns": runs, "from": str(path)})
                continue
            for seed, v in runs.items():
                part2.setdefault(env_id, {}).setdefault(m, {}).setdefault(int(seed), v)
    for task, methods in list(part1.items()):  # seeds in order
        part1[task] = {m: dict(sorted(r.items())) for m, r in methods.items()}
    return provenance(path, old)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="so101_reach, 1 seed, 3 min each; HalfCheetah 5k steps")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--budget-s", type=float, default=None, help="override the wall-clock budget per method")
    parser.add_argument("--gym-steps", type=int, default=None, help="override the env steps of part 2")
    parser.add_argument("--tasks", nargs="*", default=None, help="part 1 tasks (none: skip part 1)")
    parser.add_argument("--gym-envs", nargs="*", default=None, help="part 2 gymnasium ids (none: skip part 2)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--methods", nargs="+", default=["flashsac", "sb3_sac", "ppo"], choices=list(PART1),
                        help="methods (sb3_sac_vec: SB3 SAC on FlashSAC's 16 envs, 1 update per vector step; "
                             "part 2 runs flashsac and sb3_sac of these)")
    parser.add_argument("--gym-flashsac", nargs="*", default=[], metavar="OVERRIDE",
                        help=f"Hydra overrides for FlashSAC in part 2, after {' '.join(GYM_FLASHSAC)}")
    parser.add_argument("--merge", action="store_true",
                        help="add the runs (task, method, seed) of the existing JSON in --out that this run did not do")
    parser.add_argument("--merge-from", type=Path, nargs="*", default=[],
                        help="more offpolicy.json files to add runs from (e.g. parts run in other processes)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        tasks, seeds, budget_s, eval_every = ["so101_reach"], [0], 180.0, 20.0
        gym_ids, gym_seeds, gym_steps = ["HalfCheetah-v5"], [0], 5_000
    else:
        tasks, seeds, budget_s, eval_every = ["so101_reach", "so101_lift"], [0, 1, 2], 900.0, 30.0
        gym_ids, gym_seeds, gym_steps = ["HalfCheetah-v5", "Humanoid-v5"], [0, 1, 2], 100_000

    budget_s, gym_steps = args.budget_s or budget_s, args.gym_steps or gym_steps
    tasks = tasks if args.tasks is None else args.tasks
    gym_ids = gym_ids if args.gym_envs is None else args.gym_envs
    seeds = gym_seeds = seeds if args.seeds is None else args.seeds
    eval_every = min(eval_every, budget_s / 10)
    budgets: dict[str, float] = {}  # per task: wall-clock s (part 1) or env steps (part 2)
    part1: dict[str, dict[str, dict[int, Curve]]] = {}
    for task in tasks:
        part1[task], budgets[task] = {m: {} for m in args.methods}, budget_s
        for seed in seeds:
            for m in args.methods:
                part1[task][m][seed] = PART1[m](task, seed, budget_s, eval_every)
    part2: dict[str, dict[str, dict[int, float]]] = {}
    setting = GYM_FLASHSAC + args.gym_flashsac  # FlashSAC's overrides in part 2 (the scored runs)
    other_settings: dict[str, list[dict[str, Any]]] = {}  # merged FlashSAC runs of other settings, per env
    for env_id in gym_ids:
        gym_methods = [(n, fn) for n, fn in (("flashsac", functools.partial(_gym_flashsac, overrides=setting)),
                                             ("sb3_sac", _gym_sb3_sac)) if n in args.methods]
        part2[env_id], budgets[env_id] = {n: {} for n, _ in gym_methods}, gym_steps
        for seed in gym_seeds:
            for name, fn in gym_methods:
                start = time.perf_counter()
                part2[env_id][name][seed] = fn(env_id, seed, gym_steps)
                print(f"  {name:8s} {env_id} seed {seed}: return {part2[env_id][name][seed]:.1f} after {gym_steps} "
                      f"steps ({time.perf_counter() - start:.0f} s)", flush=True)
    merged_from = [m for path in ([args.out / "offpolicy.json"] if args.merge else []) + args.merge_from
                   if (m := _merge(path, part1, part2, budgets, setting, other_settings)) is not None]

    # ------------------------------------------------------------------------------------------ summary
    goals, summary = [], {}
    for task, methods in part1.items():
        s = {}
        for name, runs in methods.items():
            finals = [c[-1][2] for c in runs.values()]
            times = [_time_to(c, TARGET) for c in runs.values()]
            s[name] = {"final_success_median": statistics.median(finals),
                       "time_to_90_s": times, "final_success": finals}
        summary[task] = s
        b = budgets[task]
        s["budget_s"], s["seeds"] = b, {m: sorted(r) for m, r in methods.items()}
        if "flashsac" not in s:
            continue
        # The goals: ahead of SB3 SAC (each setting that ran) on every task, ahead of our PPO on
        # so101_lift. Elsewhere the FlashSAC/PPO ratio is reported in the summary, not scored.
        for other in ("sb3_sac", "sb3_sac_vec"):
            if other in s:
                goals.append(goal(f"flashsac_minus_{other}_success_at_budget_{task}",
                                  s["flashsac"]["final_success_median"] - s[other]["final_success_median"], 0.0, ">="))
        if "ppo" in s:
            # A FlashSAC run that never reached 90% counts as twice the budget, a PPO run as the budget: never
            # reaching it cannot meet the goal, and the ratio stays a bound in the right direction.
            t_flash = statistics.median(t if t is not None else 2 * b for t in s["flashsac"]["time_to_90_s"])
            t_ppo = statistics.median(t if t is not None else b for t in s["ppo"]["time_to_90_s"])
            s["flashsac_over_ppo_time_to_90"] = round(t_flash / t_ppo, 3)
            if task == "so101_lift":
                goals.append(goal(f"flashsac_over_ppo_time_to_90_{task}", t_flash / t_ppo, 1.0, "<="))
    for env_id, methods in part2.items():
        med = {name: statistics.median(v.values()) for name, v in methods.items() if v}
        summary[env_id] = {"return_median": med, "returns": methods, "env_steps": budgets[env_id]}
        if {"flashsac", "sb3_sac"} <= set(med):
            goals.append(goal(f"flashsac_minus_sb3_sac_return_{env_id}", med["flashsac"] - med["sb3_sac"], 0.0, ">="))

    colors = {"flashsac": "tab:blue", "sb3_sac": "tab:orange", "ppo": "tab:green", "sb3_sac_vec": "tab:red"}
    fig, axes = plt.subplots(1, len(part1) + (1 if part2 else 0), figsize=(6 * (len(part1) + 1), 4), squeeze=False)
    for ax, (task, methods) in zip(axes[0], part1.items(), strict=False):
        for name, runs in methods.items():
            for seed, curve in runs.items():
                ax.plot([c[0] / 60 for c in curve], [c[2] for c in curve], color=colors[name], alpha=0.8,
                        label=name if seed == min(runs) else None)
        ax.axhline(TARGET, color="gray", ls="--", lw=1)
        ax.set(xlabel="training wall-clock (min)", ylabel="eval success rate (50 episodes)",
               title=f"{task}, {max(len(r) for r in methods.values())} seed(s), 2 CPU cores")
        ax.legend()
        ax.grid(alpha=0.3)
    if part2:
        ax = axes[0][-1]
        names = list(colors)[:2]
        for i, name in enumerate(names):
            vals = [statistics.median(part2[e][name].values()) if part2[e].get(name) else np.nan for e in part2]
            bars = ax.bar(np.arange(len(part2)) + 0.4 * i, vals, width=0.4, color=colors[name], label=name)
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
            for j, e in enumerate(part2):  # each seed's return on its bar
                runs = list(part2[e].get(name, {}).values())
                ax.scatter([j + 0.4 * i] * len(runs), runs, color="black", s=10, zorder=3,
                           label="one seed" if i == j == 0 else None)
        ax.set_xticks(np.arange(len(part2)) + 0.2, [f"{e}\n{budgets[e] // 1000}k steps" for e in part2])
        ax.set(ylabel="return after equal env steps (median over seeds)", title="gymnasium MuJoCo, equal env steps")
        ax.legend()
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "offpolicy.png", dpi=100)
    plt.close(fig)

    data = {"merged_from": merged_from, "quick": args.quick, "budget_s": {t: budgets[t] for t in part1},
            "eval_every_s": eval_every,
            "eval": f"{EVAL_EPISODES} deterministic episodes, reset seed {EVAL_SEED}; clock paused while evaluating",
            "torch_threads": 1, "summary": summary,
            "curves": {t: {m: {str(s): c for s, c in r.items()} for m, r in ms.items()} for t, ms in part1.items()},
            "gym": {e: {"env_steps": budgets[e], "flashsac_setting": setting,
                        "other_flashsac_settings": other_settings.get(e, []),
                        "returns": {m: {str(s): v for s, v in r.items()} for m, r in ms.items()}}
                    for e, ms in part2.items()},
            "notes": [("time_to_90_s: first evaluation at >= 90% success (training seconds), null if never; in the "
                       "ratio goal a FlashSAC run that never got there counts as twice the budget, a PPO run as the "
                       "budget"),
                      ("methods: FlashSAC = configs/algo/flashsac.yaml (16 envs, 1 update per vector step); SB3 SAC = "
                       "its defaults (1 env, [256, 256] MLPs, batch 256, 1 update per env step, lr 3e-4) through "
                       "sim.gym.sb3_vec_env; sb3_sac_vec = the same on 16 envs, 1 update per vector step; "
                       "PPO = configs/algo/ppo.yaml (64 envs); one torch thread each"),
                      ("part 2: FlashSAC ran flashsac_setting (Hydra overrides); FlashSAC runs of other settings "
                       "merged in are kept under other_flashsac_settings and not scored"),
                      ("parts run as separate processes (one per core, each one torch thread + 2 physics threads) "
                       "and were merged with --merge-from: wall-clock numbers are noisy")]}
    path = write_result("offpolicy", data, goals, args.out)
    print(f"wrote {path} and {args.out / 'offpolicy.png'}")
    for g in goals:
        print(f"  {g['name']}: {g['value']} (target {g['direction']} {g['target']}) met={g['met']}")


if __name__ == "__main__":
    main()
