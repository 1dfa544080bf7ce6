"""Dense rewards from a learned progress model (DESIGN.md §5): PPO on so101_reach with the task's sparse reward
alone, shaped by a progress model learned from logged demos, shaped by the true distance to the target (the
potential a person would write), and with the task's hand-written dense reward, side by side.

1. ``robot-rl collect``: ``--demos`` expert episodes and ``--disturbed`` episodes of the expert whose commands reach
   the arm with noise (DART, ``disturbance=1.0``, ``disturbance_steps=5``: it corrects from states off its path, so
   the model sees more of the workspace), env state recorded, no cameras.
2. ``robot-rl progress`` with its defaults: the progress model (``robot_rl.rewards.progress``), scored by VOC on
   held-out successful episodes and, on the states of a random walk of the arm, by its rank correlation with the
   negative distance to the target.
3. One run per arm and seed (``robot-rl train task=so101_reach algo=ppo`` through the build API, in its own
   process, one at a time), up to ``--steps`` env steps, stopping at 90 % training success:
   - ``sparse``: the success term alone (distance and action-rate weights 0; success pays 10 and ends the episode);
   - ``progress``: the same + ``reward.progress`` (``--scale`` x (γ Φ(o') − Φ(o)), Φ the learned progress);
   - ``distance``: the same + the shaping of Φ = −(distance to the target in m), ``--scale`` per m;
   - ``dense``: the task's own reward (distance, success, action rate) with its PPO recipe (the main job).

Records env steps to 90 % training success (immune to the machine's noise), wall-clock and the learning curves, in
benchmarks/results/dense_rewards.json and .png.

    python benchmarks/dense_rewards.py                           # 3 seeds x 4 arms, ~15 min on 2 cores
    python benchmarks/dense_rewards.py --seeds 1 --arms sparse,progress
    python benchmarks/dense_rewards.py --algo flashsac --steps 100000     # the off-policy learner
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, goal, run_robot_rl, save_figure, write_result

NAME = "dense_rewards"
TASK = "so101_reach"
SPARSE = ["task.reward_weights.distance=0", "task.reward_weights.action_rate=0"]
ARMS = ("sparse", "progress", "distance", "dense")
TARGET = 0.9


def train_overrides(arm: str, seed: int, steps: int, model: Path, scale: float, run_dir: Path,
                    algo: str = "ppo") -> list[str]:
    common = ["task=" + TASK, f"algo={algo}", f"seed={seed}", f"total_steps={steps}", f"stop_success_rate={TARGET}",
              "eval.enabled=false", "logger.progress=false", f"run_dir={run_dir}"]
    if arm == "progress":
        return [*common, *SPARSE, f"reward.progress={model}", f"reward.scale={scale}"]
    return [*common, *({"sparse": SPARSE, "distance": SPARSE, "dense": []}[arm])]


def one_run(arm: str, overrides: list[str], scale: float) -> None:
    """The child process of one run: build it as ``robot-rl train`` does; the distance arm wraps its env."""
    from robot_rl.cli.build import build_training, compose
    from robot_rl.rewards import ShapedEnv

    run = build_training(compose("train", overrides))
    try:
        if arm == "distance":
            lo, hi = run.env.obs_spec.parts["policy"]["target_rel"]  # target − end effector, m
            run.runner.env = ShapedEnv(run.env, lambda o: -o["policy"][:, lo:hi].norm(dim=1),
                                       gamma=run.algo.cfg.gamma, scale=scale)
        run.runner.learn()
    finally:
        run.close()


def random_walk_correlation(model_dir: Path, seed: int = 0) -> float:
    """Spearman ρ(Φ, −distance to the target) over the states of 64 arms moved by a smoothed random walk for 100
    steps: how well the learned progress orders states no demonstration visited."""
    import torch

    from robot_rl.models.voc import spearman
    from robot_rl.rewards.progress import load_progress
    from sim.config import SimConfig
    from sim.registry import make_env

    model = load_progress(model_dir)
    with make_env(TASK, SimConfig(num_envs=64, num_threads=1, seed=seed)) as env:
        lo, hi = env.obs_spec.parts["policy"]["target_rel"]
        obs, _ = env.reset(seed=seed)
        gen, a = torch.Generator().manual_seed(seed), torch.zeros(64, env.action_dim)
        phi, dist = [], []
        for _ in range(100):
            a = (0.9 * a + 0.45 * torch.randn(a.shape, generator=gen)).clamp(-1, 1)
            obs, *_ = env.step(a)
            phi.append(model.potential(obs))
            dist.append(obs["policy"][:, lo:hi].norm(dim=1))
    return spearman(torch.cat(phi).numpy(), -torch.cat(dist).numpy())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demos", type=int, default=100, help="expert episodes")
    p.add_argument("--disturbed", type=int, default=200, help="episodes of the expert under DART noise")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300_000, help="env steps per run at most")
    p.add_argument("--scale", type=float, default=10.0, help="reward.scale of the shaped arms")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--algo", default="ppo", choices=("ppo", "flashsac"), help="the learner (results: dense_rewards"
                   "[_flashsac].json)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--work", type=Path, default=None, help="keep the dataset, model and runs here")
    p.add_argument("--one-run", nargs=2, metavar=("ARM", "OVERRIDES_JSON"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one_run:
        one_run(a.one_run[0], json.loads(a.one_run[1]), a.scale)
        return
    arms = a.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"unknown arms {unknown}; known: {list(ARMS)}")

    from robot_rl.logging import read_curve

    with tempfile.TemporaryDirectory() as tmp:
        work = a.work or Path(tmp)
        data, model = work / "reach_demos", work / "progress"
        common = [f"task={TASK}", f"dataset.root={data}", "env_state=true", "task.cameras=[]", "progress=false"]
        collect_s = run_robot_rl(["collect", *common, f"episodes={a.demos}", "seed=0"], "collect (expert)")
        if a.disturbed:
            collect_s += run_robot_rl(["collect", *common, f"episodes={a.disturbed}", "seed=1", "disturbance=1.0",
                                   "disturbance_steps=5", "dataset.append=true"], "collect (disturbed)")
        fit_s = run_robot_rl(["progress", f"dataset.root={data}", f"run_dir={model}", "progress=false"],
                         "robot-rl progress")
        report = json.loads((model / "report.json").read_text())
        walk_rho = random_walk_correlation(model)
        print(f"progress model: held-out VOC {report.get('held_out_voc'):.3f}, random-walk ρ(Φ, −d) {walk_rho:.3f}, "
              f"{report['frames']} frames, {fit_s:.0f} s", flush=True)
        runs: dict[str, list[dict]] = {arm: [] for arm in arms}
        for seed in range(a.seeds):
            for arm in arms:  # one at a time: wall-clock stays comparable
                run_dir = work / f"run_{arm}_s{seed}"
                overrides = train_overrides(arm, seed, a.steps, model, a.scale, run_dir, a.algo)
                start = time.perf_counter()
                proc = subprocess.run([sys.executable, __file__, "--scale", str(a.scale), "--one-run", arm,
                                       json.dumps(overrides)], capture_output=True, text=True, check=False,
                                      env={**os.environ, "MUJOCO_GL": "egl"})
                if proc.returncode != 0:
                    raise SystemExit(f"{arm} seed {seed} failed:\n{proc.stderr[-3000:]}")
                curve = read_curve(run_dir)
                hit = next((pt for pt in curve if (pt.get("success_rate") or 0.0) >= TARGET), None)
                runs[arm].append({
                    "seed": seed, "env_steps_to_90": hit["env_steps"] if hit else None,
                    "wall_s_to_90": round(hit["wall_s"], 1) if hit else None, "env_steps": curve[-1]["env_steps"],
                    "process_wall_s": round(time.perf_counter() - start, 1),
                    "final_success_rate": curve[-1].get("success_rate"),
                    "curve": [{k: pt.get(k) for k in ("env_steps", "wall_s", "success_rate")} for pt in curve]})
                print(f"{arm} seed {seed}: 90 % at {hit and hit['env_steps']} env steps", flush=True)

    out = {
        "task": TASK, "algo": {"ppo": "ppo (configs/algo_task/ppo_so101_reach.yaml), 64 envs",
                               "flashsac": "flashsac (configs/algo/flashsac.yaml)"}[a.algo],
        "dataset": {"expert_episodes": a.demos, "disturbed_episodes": a.disturbed, "collect_s": round(collect_s, 1)},
        "progress_model": {**{k: report.get(k) for k in ("held_out_voc", "train_voc", "frames", "episodes",
                                                         "successful_episodes", "horizon", "parts_read")},
                           "random_walk_spearman_phi_vs_neg_distance": round(walk_rho, 4),
                           "fit_s": round(fit_s, 1)},
        "held_out_curves": report.get("held_out_curves", {}), "scale": a.scale, "max_env_steps": a.steps,
        "target_training_success": TARGET, "summary": {arm: summary(rs) for arm, rs in runs.items()}, "runs": runs,
    }
    name = NAME if a.algo == "ppo" else f"{NAME}_{a.algo}"
    path = write_result(name, out, goals(out), a.out)
    plot(out, a.out / f"{name}.png")
    print(json.dumps(out["summary"], indent=1))
    print(path)


def summary(rs: list[dict]) -> dict:
    """Runs reaching 90 %, their env steps, and the median over all runs, a run that never reached it counting as
    slower than every one that did (None when that median is such a run)."""
    steps = [r["env_steps_to_90"] for r in rs]
    median = statistics.median_low([math.inf if x is None else x for x in steps])
    return {"reached_90": f"{sum(x is not None for x in steps)}/{len(rs)}", "env_steps_to_90": steps,
            "median_env_steps_to_90": None if math.isinf(median) else median}


def goals(out: dict) -> list[dict]:
    """The progress model's held-out VOC >= 0.8; the progress arm's median env steps to 90 % <= 0.5x the sparse
    arm's (a sparse median past the budget counts as the budget)."""
    pm, s = out["progress_model"], out["summary"]
    found = [goal("progress_model_held_out_voc", pm.get("held_out_voc") or 0.0, 0.8, ">=")]
    if "progress" in s and "sparse" in s and s["progress"]["median_env_steps_to_90"] is not None:
        sparse = s["sparse"]["median_env_steps_to_90"] or out["max_env_steps"]
        found.append(goal("progress_over_sparse_median_env_steps_ratio",
                          s["progress"]["median_env_steps_to_90"] / sparse, 0.5, "<="))
    return found


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from robot_rl.cli.progress import draw_curves

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = {"sparse": "tab:gray", "progress": "tab:blue", "distance": "tab:orange", "dense": "tab:green"}
    for arm, rs in data["runs"].items():
        for i, r in enumerate(rs):
            xs = [pt["env_steps"] / 1e3 for pt in r["curve"]]
            ax.plot(xs, [pt["success_rate"] or 0.0 for pt in r["curve"]], color=colors[arm], lw=1.2,
                    label=f"{arm} (90 % at median {data['summary'][arm]['median_env_steps_to_90']})" if i == 0 else None)
    ax.axhline(TARGET, color="k", ls=":", lw=0.8)
    ax.set(xlabel="env steps (k)", ylabel="training success rate", ylim=(-0.02, 1.02),
           title=f"{data['algo'].split()[0]} {TASK}, sparse reward + shaping (λ {data['scale']})")
    ax.legend(fontsize=8)
    draw_curves(ax2, data["held_out_curves"])
    pm = data["progress_model"]
    ax2.set(title=f"held-out episodes: VOC {pm['held_out_voc']:.3f}; random walk ρ(Φ, −d) "
                  f"{pm['random_walk_spearman_phi_vs_neg_distance']:.2f}")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
