"""Wall-clock to 90% success on so101_reach: our PPO vs Stable-Baselines3 PPO, side by side in one run.

Both learn on the same batched env (64 envs, 2 physics threads; SB3 through ``sim.gym.sb3_vec_env``) with the same
recipe (rsl_rl's: 24 steps per env, 5 epochs x 4 minibatches, lr 1e-3, γ 0.99, λ 0.95, clip 0.2, entropy 0.01,
value coef 1, grad-norm 1, ELU [256, 128, 64] actor and critic, observation normalization: VecNormalize for SB3,
which has no adaptive-KL lr and no separate critic observations). One torch thread each. Success is the rolling
rate over the last 200 finished episodes for both; the clock starts when learning starts and stops when that
rate first reaches 90% (or at the budget).

    python benchmarks/ppo_vs_sb3.py            # 3 seeds, up to 10 min per library per seed (about an hour)
    python benchmarks/ppo_vs_sb3.py --quick    # 1 seed, up to 2 min each
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import RESULTS, goal, write_result  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TASK, NUM_ENVS, THREADS, TARGET, WINDOW = "so101_reach", 64, 2, 0.9, 200


def run_ours(seed: int, budget_min: float) -> dict:
    """Through the CLI's own train(): the recipe in configs/algo/ppo.yaml, nothing tuned here."""
    from robot_rl.cli.main import _compose, train
    from robot_rl.logging import read_curve

    run_dir = Path(tempfile.mkdtemp(prefix="ppo_vs_sb3_ours_"))
    cfg = _compose("train", [f"task={TASK}", "algo=ppo", f"seed={seed}", f"sim.num_envs={NUM_ENVS}",
                             f"sim.num_threads={THREADS}", "total_steps=null", f"max_minutes={budget_min}",
                             f"stop_success_rate={TARGET}", f"success_window={WINDOW}", "eval.enabled=false",
                             "logger.progress=false", "logger.tensorboard=false", "checkpoint.every=100000",
                             f"run_dir={run_dir}"])
    train(cfg)
    pts = read_curve(run_dir)
    curve = [(p["wall_s"], p["env_steps"], p["success_rate"]) for p in pts if p["success_rate"] is not None]
    return _summary(curve, budget_min)


def run_sb3(seed: int, budget_min: float) -> dict:
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    from sim.core import SimConfig
    from sim.gym import sb3_vec_env
    from sim.registry import make_env, task_config

    venv = VecNormalize(sb3_vec_env(make_env(TASK, SimConfig(num_envs=NUM_ENVS, num_threads=THREADS, seed=seed),
                                             task_config(TASK))), norm_obs=True, norm_reward=False, gamma=0.99)
    venv.seed(seed)
    arch = [256, 128, 64]
    model = SB3PPO("MlpPolicy", venv, n_steps=24, batch_size=24 * NUM_ENVS // 4, n_epochs=5, learning_rate=1e-3,
                   gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.01, vf_coef=1.0, max_grad_norm=1.0,
                   policy_kwargs={"net_arch": {"pi": arch, "vf": arch}, "activation_fn": torch.nn.ELU},
                   seed=seed, device="cpu", verbose=0)
    curve: list[tuple[float, int, float]] = []

    class Track(BaseCallback):
        def _on_training_start(self) -> None:
            self.t0, self.succ = time.perf_counter(), deque(maxlen=WINDOW)

        def _on_step(self) -> bool:
            for info, done in zip(self.locals["infos"], self.locals["dones"], strict=True):
                if done:
                    self.succ.append(float(info.get("is_success", False)))
            wall = time.perf_counter() - self.t0
            if len(self.succ) == WINDOW:
                rate = sum(self.succ) / WINDOW
                curve.append((wall, self.num_timesteps, rate))
                if rate >= TARGET:
                    return False
            return wall < 60 * budget_min

    model.learn(total_timesteps=10**9, callback=Track())
    venv.close()
    return _summary(curve, budget_min)


def _summary(curve: list[tuple[float, int, float]], budget_min: float) -> dict:
    hit = next((c for c in curve if c[2] >= TARGET), None)
    return {"reached": hit is not None, "wall_s_to_target": None if hit is None else round(hit[0], 2),
            "env_steps_to_target": None if hit is None else hit[1], "budget_s": 60 * budget_min,
            "final_success_rate": curve[-1][2] if curve else None,
            "curve": [(round(w, 2), s, round(r, 4)) for w, s, r in curve[:: max(1, len(curve) // 200)]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 2-minute budget per library")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--budget-min", type=float, default=None, help="wall-clock budget per library per seed")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    seeds = list(range(args.seeds or (1 if args.quick else 3)))
    budget = args.budget_min or (2.0 if args.quick else 10.0)
    torch.set_num_threads(1)

    runs: dict[str, dict[int, dict]] = {"ours": {}, "sb3": {}}
    for seed in seeds:
        for name, fn in (("ours", run_ours), ("sb3", run_sb3)):
            runs[name][seed] = fn(seed, budget)
            r = runs[name][seed]
            print(f"{name} seed {seed}: reached={r['reached']} wall_s={r['wall_s_to_target']} "
                  f"env_steps={r['env_steps_to_target']}", flush=True)

    def median_time(name: str) -> float:  # a run that never reached the target counts as the budget (a bound)
        return statistics.median(r["wall_s_to_target"] or r["budget_s"] for r in runs[name].values())

    ours_t, sb3_t = median_time("ours"), median_time("sb3")
    ratio = ours_t / sb3_t
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, color in (("ours", "tab:blue"), ("sb3", "tab:orange")):
        for seed, r in runs[name].items():
            xs, ys = [c[0] / 60 for c in r["curve"]], [c[2] for c in r["curve"]]
            ax.plot(xs, ys, color=color, alpha=0.8, label=name if seed == seeds[0] else None)
    ax.axhline(TARGET, color="gray", ls="--", lw=1)
    ax.set(xlabel="wall-clock (min)", ylabel=f"success rate (last {WINDOW} episodes)",
           title=f"PPO on {TASK}, {NUM_ENVS} envs: ours vs SB3 ({len(seeds)} seed(s))")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "ppo_vs_sb3.png", dpi=100)

    data = {"task": TASK, "num_envs": NUM_ENVS, "physics_threads": THREADS, "torch_threads": 1,
            "target_success_rate": TARGET, "success_window_episodes": WINDOW, "seeds": seeds,
            "budget_s_per_library_per_seed": 60 * budget,
            "median_wall_s_to_target": {"ours": ours_t, "sb3": sb3_t},
            "note": "a run that did not reach the target within the budget counts as the budget: the ratio is then "
                    "an upper bound",
            "runs": runs}
    goals = [goal("ppo_wallclock_ratio_vs_sb3_so101_reach", ratio, 0.25, "<="),
             goal("ppo_reaches_90pct_so101_reach_all_seeds", float(all(r["reached"] for r in runs["ours"].values())),
                  1.0, ">=")]
    path = write_result("ppo_vs_sb3", data, goals, args.out)
    print(f"ours {ours_t:.1f} s, sb3 {sb3_t:.1f} s, ratio {ratio:.3f}; wrote {path}")


if __name__ == "__main__":
    main()
