"""RECAP vs AWR vs BC on mixed-quality so101_lift demonstrations, at equal gradient steps, and the improvement loop.

1. **Data.** ``robot-rl collect`` records so101_lift (front + wrist cameras at 64x64, the six joints in degrees, the
   instruction; the visual randomization of ``benchmarks/vla_bc.py``): ``--expert-fraction`` (30 %) of the
   episodes by the scripted expert as written (quality 1), the rest by the degraded expert (``--degraded-quality``:
   action noise, hesitation, detours, missed grasps, dropped cubes; ``sim.experts``). A separate held-out set of
   mixed episodes scores the value model.
2. **Training**, per seed, each ``robot-rl offline`` run in its own process for ``--steps`` policy gradient steps:
   ``bc`` (all data), ``awr`` and ``recap`` (the same value model and labels: RECAP's run fits them and AWR's run
   reuses them), ``recap_balanced`` (RECAP drawing ``--positive-share`` of each batch from positive frames), and
   ``bc_expert`` (BC on the expert episodes alone: what the good data teaches); on demand the ablations
   ``recap_oracle`` / ``recap_oracle_balanced`` (the indicator set to "the expert recorded this episode").
3. **Evaluation**: ``--eval-episodes`` seeded episodes per policy (the same seeds for every method; other seeds than
   the data's), success and failure rates; RECAP at each ``--betas`` (CFG β is a sampling setting of one trained
   policy). VOC of each learned value model on the held-out successful episodes. A video of BC and of RECAP on the
   same seeds.
4. **Loop**: ``robot-rl recap`` from the mixed dataset for ``--loop-rounds`` rounds (policy collection with the
   expert intervening where the value model says the episode goes wrong, retraining, evaluation), round 0 being
   ``--loop-method``'s run; ``--loop-beta``, ``--loop-warm-start`` as ``robot-rl recap``'s guidance_beta, warm_start.

    python benchmarks/recap.py                  # the full run (sized to issue 15: hours on 2 CPU cores)
    python benchmarks/recap.py --smoke --out /tmp/recap_smoke   # minutes: proves every stage end to end
    # the committed recap.json (degraded episodes with every flaw; 2026-12-02, after the randomization fixes):
    python benchmarks/recap.py --methods recap_balanced,awr,bc,bc_expert,recap_oracle_balanced --seeds 1 \
        --steps 3000 --value-steps 1500 --loop-rounds 2 --loop-episodes 60 --loop-method recap_balanced \
        --loop-beta 2.5 --loop-warm-start --work /tmp/recap_new --out /tmp/recap_out
    python benchmarks/recap.py --extend --methods recap_balanced_top --seeds 1 --steps 3000 --value-steps 1500 \
        --loop-rounds 0 --work /tmp/recap_new --out /tmp/recap_out
    python benchmarks/recap.py --extend --first-seed 1 --seeds 2 --steps 3000 --value-steps 1500 --loop-rounds 0 \
        --methods recap_balanced,recap_balanced_top,awr,bc,bc_expert,recap_oracle_balanced \
        --work /tmp/recap_new --out /tmp/recap_out   # seed 1 (~40 min)
    python benchmarks/recap.py --extend --first-seed 2 --seeds 3 --steps 3000 --value-steps 1500 --loop-rounds 0 \
        --methods recap_balanced,bc,bc_expert,recap_oracle_balanced --work /tmp/recap_new --out /tmp/recap_out
    # the label variants of 2026-12-02 (the same value models, relabelled; recap_balanced_smooth seed 0 only):
    python benchmarks/recap.py --extend --seeds 1 --steps 3000 --value-steps 1500 --loop-rounds 0 \
        --methods recap_balanced_smooth --work /tmp/recap_new --out /tmp/recap_out
    python benchmarks/recap.py --extend --seeds 3 --steps 3000 --value-steps 1500 --loop-rounds 0 \
        --methods recap_balanced_episode --work /tmp/recap_new --out /tmp/recap_out   # (seed 0, then --first-seed 1)
    # the committed recap_q05.json (each flaw of a degraded episode on with probability 0.5; run before the
    # randomization fixes of 2026-12-02, its expert episodes were the previous recap.json's), collected and trained
    # in one go, then (interrupted after recap_balanced) finished with --skip-collect --reuse-runs:
    python benchmarks/recap.py --degraded-quality 0.5 --methods recap,recap_balanced_short,recap_balanced,bc \
        --seeds 1 --steps 3000 --value-steps 1500 --loop-rounds 0 --work /tmp/recap_q05 --name recap_q05 \
        --out /tmp/recap_q05_out
    python benchmarks/recap.py --extend --methods '' --degraded-quality 0.5 --seeds 1 --steps 3000 --value-steps 1500 \
        --loop-rounds 1 --loop-episodes 60 --loop-method recap_balanced --loop-beta 2.5 --loop-warm-start \
        --work /tmp/recap_q05 --name recap_q05 --out /tmp/recap_q05_out   # one loop round (~22 min here)

Measured (1 seed, 2 cores, nothing else heavy beside it; a quiet machine): collecting 300 + 50 episodes 6.5 min
(degraded episodes 1.4 s each, expert 0.5 s); per 3000-step run 4-8 min (a policy step ~0.08 s, a value step
0.12 s: RECAP's 1500 value steps 3 min + labelling 20 s); 100 evaluation episodes 16-25 s; the loop ~9 min per round
with 60 episodes; on 2026-12-02 (a faster machine) collecting took 4.4 min, a 3000-step run 5-7 min, the two loop
rounds 15 min. (Other sessions' machines ran the same work 2-3x slower: 14-17 min per 3000-step run on
2026-12-01.) ``--smoke`` (tiny sizes) proves every stage in ~20 min.

Writes ``NAME.json`` + ``NAME.png`` (+ ``NAME_bc.mp4``, ``NAME_<recap variant>.mp4``; ``--name``, default recap) into
``--out``; the JSON holds the seconds each stage took, to size a real run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import robot_rl  # noqa: F401, I001  (before torch: OpenMP's spin, robot_rl.OPENMP_SPIN)
import numpy as np
import torch

from benchmarks.common import RESULTS, goal, robot_rl_command, save_figure, write_result
from benchmarks.vla_bc import VISUAL_DR

NAME = "recap"
TASK = "so101_lift"
EPISODE_LENGTH = 150  # so101_lift's (sim.tasks.common.ArmTaskConfig.episode_length): M of the value targets
METHODS = ("bc", "recap", "awr", "bc_expert")  # recap before awr: awr reuses its value model and labels
# On demand (--methods): recap_oracle, an ablation after recap (its labels: who recorded the episode); the
# "_balanced" variants draw positive frames at --positive-share of each batch (algo.recap.positive_share).
# recap_balanced reuses recap's value model and labels when recap ran first (else it fits the same ones itself);
# recap_oracle_balanced takes its value model from recap or recap_balanced.
# recap_balanced_short: recap_balanced relabelled with a short N-step advantage (--short-n-step; the same value
# model): at N = 50 a degraded episode's pauses are labelled positive as often as its moving frames (the advantage
# over 50 frames is mostly the episode's outcome), at N = 3 they are mostly negative.
# recap_balanced_top: recap_balanced relabelled with a smaller positive fraction (--top-fraction; the same value
# model): the expert's frames are ~10 % of the mixed data, so at the default 30 % at most a third of the positives
# can be the expert's (recap.json's label_quality: 20 %).
# recap_balanced_smooth: recap_balanced relabelled at --top-fraction with N = --smooth-n-step and the advantage
# averaged over --smooth-window frames of its episode (algo.labels.smooth_window): N = 50 frames (π*0.6's, at 30 Hz)
# is longer than the expert's whole lift (~32 frames), so A_t is mostly the episode's outcome; one frame's A is the
# difference of two noisy value predictions, and a window averages those errors out. Chosen from label precision
# on recap.json's own data (seeds 0-2's value models, the expert's share of the positives at the top 10 %): N = 50
# per frame 0.27-0.31, N = 10 per frame 0.33-0.36, N = 10 over 17 / 33 / 51 frames 0.42-0.44 / 0.55-0.59 / 0.69-0.71.
# recap_balanced_episode: the same at a window spanning every episode (2 M + 1 frames): each frame labelled by its
# episode's mean advantage, an episode-level filter built from the same value model (top 10 % at N = 10: 94 % of
# the positives the expert's on seed 0's value model).
RELABELLED = ("recap_balanced_short", "recap_balanced_top", "recap_balanced_smooth", "recap_balanced_episode")
KNOWN_METHODS = (*METHODS, "recap_oracle", "recap_balanced", "recap_oracle_balanced", *RELABELLED)
FAMILIES = ("bc", "awr", "recap", "recap_balanced", "recap_oracle", "recap_oracle_balanced", *RELABELLED)
LEARNED_LABELS = ("recap", "recap_balanced", *RELABELLED)  # RECAP variants whose labels are the value's
EVAL_SEED = 900_000  # evaluation episode i of seed s: EVAL_SEED + 1000 s + i, the same for every method
SMOKE = {"episodes": 12, "heldout": 4, "steps": 20, "value_steps": 20, "seeds": 1, "eval_episodes": 4,
         "num_envs": 4, "loop_rounds": 1, "loop_episodes": 4, "betas": "1.0,2.0", "video": False}


def _overrides(d: dict[str, Any], prefix: str) -> list[str]:
    return [f"{prefix}.{k}={json.dumps(v).replace(' ', '')}" for k, v in d.items()]


# ------------------------------------------------------------------------------------------------------ data
def collect(root: Path, episodes: int, quality: float, num_envs: int, seed: int, append: bool) -> dict[str, Any]:
    """``robot-rl collect`` of so101_lift at ``quality`` into ``root`` (in process)."""
    from robot_rl.cli.build import compose
    from robot_rl.cli.collect import collect as run_collect

    cfg = compose("collect", [f"task={TASK}", f"episodes={episodes}", f"dataset.root={root}",
                              f"dataset.append={'true' if append else 'false'}", f"quality={quality}",
                              "task.cameras=[front,wrist]", "task.image_width=64", "task.image_height=64",
                              f"sim.num_envs={num_envs}", f"seed={seed}", "progress=false",
                              *_overrides(VISUAL_DR, "sim.randomization")])
    c = run_collect(cfg)
    print(f"collect q={quality}: {c.episodes} episodes ({c.successes} successes) in {c.seconds:.0f} s", file=sys.stderr)
    return {"episodes": c.episodes, "successes": c.successes, "frames": c.frames, "quality": quality,
            "seconds": round(c.seconds, 1)}


# -------------------------------------------------------------------------------------------------- training
def train(algo: str, root: Path, run_dir: Path, steps: int, seed: int, extra: list[str]) -> dict[str, Any]:
    """``robot-rl offline algo=<algo>`` in its own process; returns the export, timings and the labels summary."""
    cmd = [*robot_rl_command(), "offline", f"algo={algo}", f"dataset.root={root}", f"run_dir={run_dir}",
           f"steps={steps}", f"seed={seed}", "dataset.progress=false", "logger.progress=false", *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"command": " ".join(cmd), "process_wall_s": round(wall, 1), **run_record(run_dir)}


def finished(run_dir: Path, steps: int) -> bool:
    """Whether ``run_dir`` holds a finished run of ``steps`` policy steps (``--reuse-runs``)."""
    curve = run_dir / "curve.jsonl"
    lines = [ln for ln in curve.read_text().splitlines() if ln.strip()] if curve.is_file() else []
    return bool(lines) and json.loads(lines[-1])["updates"] >= steps and (run_dir / "checkpoints").is_dir()


def run_record(run_dir: Path) -> dict[str, Any]:
    """A finished run's timings, export, curve and labels summary."""
    curve = [json.loads(line) for line in (run_dir / "curve.jsonl").read_text().splitlines() if line.strip()]
    out = {"train_wall_s": round(curve[-1]["wall_s"], 1),
           "updates": curve[-1]["updates"], "policy": str(_latest_policy(run_dir)),
           "curve": [{"updates": p["updates"], "wall_s": round(p["wall_s"], 1), "loss": p.get("loss")} for p in curve]}
    labels = run_dir / "labels" / "labels.json"
    if labels.is_file():
        meta = json.loads(labels.read_text())
        out["labels"] = {k: meta[k] for k in ("positive_fraction", "thresholds", "frames")} | meta.get("summary", {})
    return out


def _latest_policy(run_dir: Path) -> Path:
    from robot_rl.checkpoint import POLICY_DIR, load_meta

    folder, _ = load_meta(run_dir)
    return folder / POLICY_DIR


def expert_episodes(root: Path, count: int) -> list[int]:
    """The first ``count`` episodes of the dataset: the expert's (recorded first)."""
    from robot_rl.data.lerobot_format import read_meta

    eps = sorted(int(e) for e in read_meta(root).episodes["episode_index"])
    return eps[:count]


# ------------------------------------------------------------------------------------------------ evaluation
def _env(num_envs: int, seed: int) -> Any:
    from sim.config import SimConfig
    from sim.randomization import RandomizationConfig
    from sim.registry import make_env, task_config

    sim = SimConfig(num_envs=num_envs, num_threads=2, seed=seed, randomization=RandomizationConfig(**VISUAL_DR))
    return make_env(TASK, sim, task_config(TASK, {"cameras": []}))


def evaluate_policy(policy: Any, episodes: int, num_envs: int, seed: int) -> dict[str, Any]:
    from robot_rl.cli.build import policy_view
    from robot_rl.evaluation import evaluate

    start = time.perf_counter()
    with _env(min(num_envs, episodes), seed) as env:
        r = evaluate(policy_view(env, policy), policy.eval(), episodes, seed)
    return {**r.to_json(), "failure_rate": 1.0 - r.success_rate, "seconds": round(time.perf_counter() - start, 1)}


def oracle_labels(recap_run: Path, run_dir: Path, n_expert: int) -> None:
    """``run_dir`` prepared for RECAP with oracle labels: RECAP's value model and labels of the same seed copied, the
    indicator replaced by who recorded the episode (the expert's episodes positive, the degraded ones negative). Its
    policy is the extraction's ceiling with perfect labels: against RECAP's, it separates what the value model's
    labels cost from what the conditioned extraction can do."""
    from dataclasses import replace

    from robot_rl.data.labels import read_sidecar, write_sidecar

    if not (recap_run / "labels").is_dir():
        raise RuntimeError(f"recap_oracle needs RECAP's run of the same seed first ({recap_run})")
    run_dir.mkdir(parents=True)
    shutil.copytree(recap_run / "value", run_dir / "value")
    labels, meta = read_sidecar(recap_run / "labels")
    write_sidecar(replace(labels, advantage_indicator=labels.episode_index < n_expert), run_dir / "labels",
                  {k: v for k, v in meta.items() if k in ("dataset", "settings", "summary")})


def _labelled_run(work: Path, seed: int) -> Path | None:
    """The run of ``seed`` whose value model and labels the other advantage methods reuse (recap's first)."""
    for m in ("recap", "recap_balanced"):
        if (work / f"{m}_s{seed}" / "labels").is_dir():
            return work / f"{m}_s{seed}"
    return None


def label_quality(labels_dir: Path, n_expert: int) -> dict[str, Any]:
    """How well the labels tell the expert's frames (episodes 0..n_expert-1, recorded first) from the degraded ones:
    the share of each labelled positive, the share of positives that are the expert's, the mean advantage, and the
    positive rate and mean predicted value by fifth of the episode (frame index / length) of the expert's and of the
    successful degraded episodes: whether the expert's grasp and lift (its last fifths) are among the positives at
    all, and how the value model rates each kind's states."""
    from robot_rl.data.labels import episode_bounds, read_sidecar

    labels, _ = read_sidecar(labels_dir)
    expert = labels.episode_index < n_expert
    pos = labels.advantage_indicator.astype(bool)
    start, end = episode_bounds(labels.episode_index)
    fifth = np.minimum((5 * (np.arange(len(pos)) - start)) // (end - start + 1), 4)
    succeeded = labels.value_target[end] == 0.0  # the episode's last frame is at (or after) its first success

    def by_fifth(mask: np.ndarray, x: np.ndarray = pos) -> list[float | None]:
        return [round(float(x[mask & (fifth == k)].mean()), 4) if (mask & (fifth == k)).any() else None
                for k in range(5)]

    return {"expert_frames": int(expert.sum()), "degraded_frames": int((~expert).sum()),
            "positive_rate_expert_frames": float(pos[expert].mean()),
            "positive_rate_degraded_frames": float(pos[~expert].mean()),
            "expert_share_of_positives": float(pos[expert].sum() / max(pos.sum(), 1)),
            "mean_advantage_expert": float(labels.advantage[expert].mean()),
            "mean_advantage_degraded": float(labels.advantage[~expert].mean()),
            "positive_rate_by_fifth_expert": by_fifth(expert),
            "positive_rate_by_fifth_degraded_successful": by_fifth(~expert & succeeded),
            "mean_value_by_fifth_expert": by_fifth(expert, labels.value),
            "mean_value_by_fifth_degraded_successful": by_fifth(~expert & succeeded, labels.value)}


def heldout_voc(value_dir: Path, heldout: Path) -> dict[str, Any]:
    """VOC (and success AUC) of a value model on a held-out dataset."""
    from policies import keys
    from robot_rl.algos.value_learning import load_value_model, predict_values
    from robot_rl.data.lerobot_loader import ChunkDatasetConfig, ChunkSampler
    from robot_rl.models.voc import success_auc, value_order_correlation

    model, _ = load_value_model(value_dir)
    sampler = ChunkSampler(ChunkDatasetConfig(root=str(heldout), horizon=1, augment=False, progress=False,
                                              batch_size=1, extra_columns=[keys.SUCCESS_COL]))
    values = predict_values(model, sampler)
    cols = {k: v.numpy() for k, v in sampler.columns().items()}
    eps, frames = cols["episode_index"], cols["frame_index"]
    succ = cols[keys.SUCCESS_COL].astype(bool)
    ok = {int(e): bool(succ[eps == e].any()) for e in np.unique(eps)}
    frame_ok = np.array([ok[int(e)] for e in eps])
    voc, per = value_order_correlation(values, eps, frames, frame_ok)
    first = frames == 0
    return {"voc": voc, "episodes": len(ok), "successful_episodes": int(sum(ok.values())),
            "success_auc": success_auc(values[first], frame_ok[first]),
            "per_episode": {str(k): round(v, 4) for k, v in per.items()}}


def videos(policies: dict[str, Any], out_dir: Path, seed: int, name: str = NAME) -> dict[str, str | None]:
    from robot_rl.cli.build import policy_view
    from robot_rl.evaluation import record_video

    out = {}
    for method, policy in policies.items():
        with _env(1, seed) as env:
            path = record_video(policy_view(env, policy), policy, out_dir / f"{name}_{method}.mp4", seed, 3, "front",
                                160, 120)
        out[method] = None if path is None else str(path)
    return out


# ------------------------------------------------------------------------------------------------------ loop
def run_loop(root: Path, run_dir: Path, rounds: int, episodes: int, steps: int, eval_episodes: int, num_envs: int,
             offline_extra: list[str], init_run: Path | None, loop_extra: list[str]) -> dict[str, Any]:
    """``robot-rl recap`` from the mixed dataset; round 0 is RECAP's seed-0 run (``init_run``) when there is one;
    ``loop_extra``: more settings of the loop (warm_start, guidance_beta)."""
    cmd = [*robot_rl_command(), "recap", f"task={TASK}", f"rounds={rounds}", f"run_dir={run_dir}",
           f"init_dataset={root}", *([f"init_run={init_run}"] if init_run is not None else []),
           f"episodes_per_round={episodes}", f"steps={steps}", *loop_extra,
           f"eval_episodes={eval_episodes}", f"eval_envs={min(num_envs, eval_episodes)}", f"sim.num_envs={num_envs}",
           *_overrides(VISUAL_DR, "sim.randomization"),
           "offline=[" + ",".join(f"'{o}'" for o in offline_extra) + "]"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"command": " ".join(cmd), "seconds": round(time.perf_counter() - start, 1),
            **json.loads((run_dir / "results.json").read_text())}


# ------------------------------------------------------------------------------------------------------ plot
def _family(key: str) -> str | None:
    """The method of an eval key (``recap_oracle_balanced_beta2.5`` -> ``recap_oracle_balanced``; bc_expert -> bc)."""
    base = key.split("_beta")[0]
    base = "bc" if base == "bc_expert" else base
    return base if base in FAMILIES else None


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(data["summary"])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, max(4.0, 0.32 * len(names) + 1.5)),
                                 gridspec_kw={"width_ratios": [1.4, 1]})
    means = [data["summary"][m]["success_mean"] for m in names]
    errs = [data["summary"][m]["success_std"] for m in names]
    colors = [f"C{FAMILIES.index(_family(m))}" if _family(m) else "C7" for m in names]
    ax.barh(range(len(names)), means, xerr=errs, capsize=3, color=colors)
    for i, m in enumerate(means):
        ax.text(m + 0.01, i, f"{m:.2f}", va="center", fontsize=8)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"success rate, mean over seeds ({data['settings']['eval_episodes']} episodes per seed; bars: std)")
    ax.set_xlim(0, 1.08)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("so101_lift, mixed-quality data, equal gradient steps")
    loop = data.get("loop", {}).get("rounds", [])
    if loop:
        bx.plot([r["round"] for r in loop], [r["success_rate"] for r in loop], "o-", label="success")
        bx.plot([r["round"] for r in loop], [r["failure_rate"] for r in loop], "s--", label="failure")
        bx.set_xlabel("improvement round")
        bx.set_ylim(0, 1.05)
        bx.legend()
        bx.grid(alpha=0.3)
        bx.set_title("RECAP loop (robot-rl recap)")
    else:
        bx.axis("off")
        bx.text(0.5, 0.5, "the loop was not run (--loop-rounds 0)", ha="center", va="center")
    save_figure(fig, path, dpi=100)


# ------------------------------------------------------------------------------------------------------ main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=300, help="mixed-quality training episodes")
    p.add_argument("--expert-fraction", type=float, default=0.3, help="share of them by the expert at quality 1")
    p.add_argument("--degraded-quality", type=float, default=0.0, help="the others' expert quality (0: every flaw)")
    p.add_argument("--heldout", type=int, default=50, help="held-out mixed episodes for the value model's VOC")
    p.add_argument("--steps", type=int, default=6000, help="policy gradient steps of every method")
    p.add_argument("--value-steps", type=int, default=3000, help="value model gradient steps (recap; awr reuses)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0,
                   help="with --extend: train and evaluate seeds first-seed..seeds-1 only, keeping the earlier ones")
    p.add_argument("--eval-episodes", type=int, default=100)
    p.add_argument("--betas", default="1.0,1.5,2.5", help="CFG betas RECAP's policy is evaluated at")
    p.add_argument("--num-envs", type=int, default=25)
    p.add_argument("--loop-rounds", type=int, default=2)
    p.add_argument("--loop-episodes", type=int, default=100, help="episodes collected per loop round")
    p.add_argument("--loop-method", choices=LEARNED_LABELS, default="recap",
                   help="the loop's RECAP: its round 0 is that method's seed-0 run when there is one")
    p.add_argument("--loop-beta", type=float, default=None, help="CFG β of the loop's policies (default: 1)")
    p.add_argument("--loop-warm-start", action=argparse.BooleanOptionalAction, default=False,
                   help="each round fine-tunes the last round's policy instead of training from scratch")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--short-n-step", type=int, default=3, help="N of recap_balanced_short's advantage (frames)")
    p.add_argument("--top-fraction", type=float, default=0.1,
                   help="share of frames labelled positive by recap_balanced_top / _smooth / _episode "
                        "(algo.labels.positive_fraction)")
    p.add_argument("--smooth-n-step", type=int, default=10, help="N of recap_balanced_smooth's and _episode's advantage (frames)")
    p.add_argument("--smooth-window", type=int, default=31,
                   help="frames recap_balanced_smooth averages each advantage over (algo.labels.smooth_window)")
    p.add_argument("--positive-share", type=float, default=0.5,
                   help="share of each batch drawn from positive frames by the *_balanced methods")
    p.add_argument("--extra", nargs="*", default=["algo.lr_schedule=cosine", "algo.warmup_updates=200"],
                   help="overrides for every robot-rl offline run")
    p.add_argument("--video", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--smoke", action="store_true", help=f"tiny sizes: {SMOKE}")
    p.add_argument("--work", type=Path, default=Path("/tmp/recap_bench"))
    p.add_argument("--skip-collect", action="store_true", help="reuse the datasets in --work")
    p.add_argument("--reuse-runs", action="store_true",
                   help="evaluate the runs in --work that finished --steps instead of training them again (an "
                        "interrupted benchmark; with --skip-collect)")
    p.add_argument("--extend", action="store_true",
                   help="add to the recap.json already in --out (runs in --work): the --methods given (e.g. "
                        "--methods recap_oracle, or '' for none) and the loop when --loop-rounds > 0")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default=NAME, help="file names of the results: NAME.json, NAME.png, NAME_<method>.mp4")
    a = p.parse_args()
    if a.reuse_runs and not a.skip_collect and not a.extend:
        p.error("--reuse-runs needs --skip-collect (collecting starts --work afresh)")
    if (a.first_seed and not a.extend) or not 0 <= a.first_seed < max(a.seeds, 1):
        p.error("--first-seed needs --extend (the earlier seeds' results) and must be below --seeds")
    if a.smoke:
        for k, v in SMOKE.items():
            setattr(a, k, v)
        a.extra = [*a.extra, "updates_per_iteration=10"]
    os.environ.setdefault("MUJOCO_GL", "egl")
    torch.set_num_threads(2)
    a.out.mkdir(parents=True, exist_ok=True)
    methods = a.methods.split(",")
    betas = [float(b) for b in a.betas.split(",")]
    mixed, heldout = a.work / "mixed", a.work / "heldout"
    n_expert = round(a.expert_fraction * a.episodes)
    data: dict[str, Any] = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                            "timing_s": {}}
    data["settings"]["expert_episodes"] = n_expert
    methods = [m for m in methods if m]
    unknown = set(methods) - set(KNOWN_METHODS)
    if unknown:
        p.error(f"unknown --methods {sorted(unknown)}; known: {list(KNOWN_METHODS)}")
    if a.extend:
        data = {k: v for k, v in json.loads((a.out / f"{a.name}.json").read_text()).items()
                if k not in ("name", "date", "commit", "command", "machine", "goals")}
        data["settings"].setdefault("extended_by", []).append(" ".join(sys.argv))
        a.skip_collect, a.video = True, False
        drop_rerun_evals(data["eval"], methods, a.first_seed)
        if "recap" in methods:
            data.pop("value_heldout", None)
    t = time.perf_counter()
    if not a.skip_collect:
        shutil.rmtree(a.work, ignore_errors=True)
        data["collect"] = {"expert": collect(mixed, n_expert, 1.0, a.num_envs, 0, False),
                           "degraded": collect(mixed, a.episodes - n_expert, a.degraded_quality, a.num_envs, 1, True),
                           "heldout_expert": collect(heldout, max(1, round(a.expert_fraction * a.heldout)), 1.0,
                                                     a.num_envs, 2, False),
                           "heldout_degraded": collect(heldout, a.heldout - max(1, round(a.expert_fraction *
                                                                                        a.heldout)),
                                                       a.degraded_quality, a.num_envs, 3, True)}
    if not a.extend:
        data["timing_s"]["collect"] = round(time.perf_counter() - t, 1)
    value_extra = [f"algo.value.steps={a.value_steps}", f"algo.labels.max_episode_length={EPISODE_LENGTH}"]
    if not a.extend:
        data["training"], data["eval"] = {}, {}
    from policies import load_policy

    for seed in range(a.first_seed, a.seeds):
        for m in methods:
            run_dir = a.work / f"{m}_s{seed}"
            if a.reuse_runs and finished(run_dir, a.steps):  # an interrupted benchmark: evaluate what it trained
                print(f"reusing the finished run {run_dir}", file=sys.stderr)
                data["training"][f"{m}_s{seed}"] = rec = {**run_record(run_dir), "reused": True}
                _evaluate_run(data, a, m, rec, run_dir, seed, betas, heldout)
                continue
            shutil.rmtree(run_dir, ignore_errors=True)
            extra = list(a.extra)
            algo = "bc" if m == "bc_expert" else "awr" if m == "awr" else "recap" if m.startswith("recap") else m
            if algo in ("awr", "recap"):
                extra += value_extra
            extra += _variant_overrides(m, a)
            source = _labelled_run(a.work, seed)
            if m.startswith("recap_oracle"):
                if source is None:
                    raise RuntimeError(f"{m} needs RECAP's value model of seed {seed} first (--methods recap,{m})")
                oracle_labels(source, run_dir, n_expert)
            elif m in ("awr", "recap_balanced", *RELABELLED) and source is not None:
                run_dir.mkdir(parents=True)  # the same value model (and labels but for N) as RECAP's run
                for sub in ("value",) if m in RELABELLED else ("value", "labels"):
                    shutil.copytree(source / sub, run_dir / sub)
            if m == "bc_expert":
                extra.append("dataset.episodes=[" + ",".join(map(str, expert_episodes(mixed, n_expert))) + "]")
            t = time.perf_counter()
            rec = train(algo, mixed, run_dir, a.steps, seed, extra)
            data["timing_s"][f"train_{m}_s{seed}"] = round(time.perf_counter() - t, 1)
            data["training"][f"{m}_s{seed}"] = rec
            _evaluate_run(data, a, m, rec, run_dir, seed, betas, heldout)
    data.setdefault("label_quality", {}).update({
        f"{m}_s{seed}": label_quality(a.work / f"{m}_s{seed}" / "labels", data["settings"]["expert_episodes"])
        for seed in range(a.seeds) for m in LEARNED_LABELS if m in methods
        and (a.work / f"{m}_s{seed}" / "labels").is_dir()})
    data["summary"] = {k: {"success_mean": statistics.mean(e["success_rate"] for e in v),
                           "success_std": statistics.pstdev([e["success_rate"] for e in v]),
                           "failure_mean": statistics.mean(e["failure_rate"] for e in v)}
                       for k, v in data["eval"].items()}
    learned = [k for k in data["summary"] if k.split("_beta")[0] in LEARNED_LABELS and k.split("_beta")[0] in methods]
    if a.video and "bc" in methods and learned:  # BC beside the best learned-label RECAP variant, at its best β
        best = max(learned, key=lambda k: data["summary"][k]["success_mean"])
        shown = best.split("_beta")[0]
        pols = {m: load_policy(data["training"][f"{m}_s0"]["policy"]) for m in ("bc", shown)}
        pols[shown].cfg.guidance_beta = float(best.split("_beta")[1])
        data["videos"] = videos(pols, a.out, EVAL_SEED, a.name)
        data["videos_beta"] = pols[shown].cfg.guidance_beta
    if a.loop_rounds > 0:
        t = time.perf_counter()
        shutil.rmtree(a.work / "loop", ignore_errors=True)  # robot-rl recap would resume an earlier loop there
        init_run = a.work / f"{a.loop_method}_s0"
        balanced = _variant_overrides(a.loop_method, a)
        data["loop"] = run_loop(mixed, a.work / "loop", a.loop_rounds, a.loop_episodes, a.steps,
                                a.eval_episodes, a.num_envs, [*a.extra, *value_extra, *balanced,
                                                              "dataset.progress=false", "logger.progress=false"],
                                init_run if (init_run / "labels").is_dir() else None,
                                [f"warm_start={str(a.loop_warm_start).lower()}",
                                 *([f"guidance_beta={a.loop_beta}"] if a.loop_beta is not None else [])])
        data["loop"]["method"], data["loop"]["beta"] = a.loop_method, a.loop_beta
        data["timing_s"]["loop"] = round(time.perf_counter() - t, 1)
    goals = _goals(data, betas)
    path = write_result(a.name, data, goals, a.out)
    plot(data, a.out / f"{a.name}.png")
    print(f"wrote {path}; seconds per stage: {json.dumps(data['timing_s'])}", file=sys.stderr)
    for g in goals:
        print(f"  {g['name']}: {g['value']} ({g['direction']} {g['target']}: {'met' if g['met'] else 'NOT met'})",
              file=sys.stderr)


def _evaluate_run(data: dict[str, Any], a: argparse.Namespace, m: str, rec: dict[str, Any], run_dir: Path, seed: int,
                  betas: list[float], heldout: Path) -> None:
    """Success of a trained method (RECAP at each β) on the evaluation seeds, and its value model's held-out VOC."""
    from policies import load_policy

    policy = load_policy(rec["policy"])
    for beta in (betas if m.startswith("recap") else [None]):
        key = m if beta is None else f"{m}_beta{beta:g}"
        if beta is not None:
            policy.cfg.guidance_beta = beta
        t = time.perf_counter()
        ev = evaluate_policy(policy, a.eval_episodes, a.num_envs, EVAL_SEED + 1000 * seed)
        data["timing_s"][f"eval_{key}_s{seed}"] = round(time.perf_counter() - t, 1)
        data["eval"].setdefault(key, []).append(ev)
        print(f"seed {seed} {key}: success {ev['success_rate']:.3f}", file=sys.stderr)
    if m in ("recap", "recap_balanced"):  # the value model each learned-label RECAP run used
        t = time.perf_counter()
        voc = heldout_voc(run_dir / "value", heldout)
        data.setdefault("value_heldout_runs", {})[f"{m}_s{seed}"] = voc
        if m == "recap":
            data.setdefault("value_heldout", []).append(voc)
        data["timing_s"][f"voc_{m}_s{seed}"] = round(time.perf_counter() - t, 1)


def drop_rerun_evals(evals: dict[str, list[dict[str, Any]]], methods: list[str], first_seed: int) -> None:
    """Before ``--extend`` runs ``methods`` again from ``first_seed``: drop their evaluations (every β) of those
    seeds, in place; the earlier seeds' stay."""
    kept = EVAL_SEED + 1000 * first_seed  # evaluation seeds of training seed s start at EVAL_SEED + 1000 s
    for m in methods:
        for k in [k for k in evals if k == m or k.startswith(f"{m}_beta")]:
            evals[k] = [e for e in evals[k] if e["seed"] < kept]


def _variant_overrides(method: str, a: argparse.Namespace) -> list[str]:
    """The RECAP settings a method's name stands for: positive-balanced batches, a short N-step advantage, a
    smaller positive fraction, a window-averaged advantage (at the smaller fraction)."""
    out = [f"algo.recap.positive_share={a.positive_share}"] if "_balanced" in method else []
    out += [f"algo.labels.n_step={a.short_n_step}"] if method.endswith("_short") else []
    if method.endswith(("_smooth", "_episode")):
        window = 2 * EPISODE_LENGTH + 1 if method.endswith("_episode") else a.smooth_window
        out += [f"algo.labels.n_step={a.smooth_n_step}", f"algo.labels.smooth_window={window}"]
    return out + ([f"algo.labels.positive_fraction={a.top_fraction}"] if method.endswith(("_top", "_smooth", "_episode"))
                  else [])


def _goals(data: dict[str, Any], betas: list[float]) -> list[dict[str, Any]]:
    s, goals = data["summary"], []
    # RECAP with learned labels, as drawn (recap) or positive-balanced (recap_balanced); oracles are ablations
    recaps = [k for k in s if k.split("_beta")[0] in LEARNED_LABELS and "_beta" in k]
    best = max(recaps, key=lambda k: s[k]["success_mean"]) if recaps else None  # β and variant named in the goal
    if "bc" in s and best is not None:
        bc = s["bc"]
        if bc["success_mean"] > 0:
            goals.append(goal(f"{best}_success_over_bc", s[best]["success_mean"] / bc["success_mean"], 1.5, ">="))
        else:  # 0 successes in n episodes: BC's rate lies below 3 / n at 95 % (the rule of three), so the ratio
            # is at least RECAP's rate over that bound; a few successes over none is no 1.5x (0.01 over 3/300: 1.0)
            n = sum(e["num_episodes"] for e in data["eval"]["bc"])
            goals.append(goal(f"{best}_success_over_bc_rule_of_three", s[best]["success_mean"] / (3.0 / n), 1.5,
                              ">="))
        goals.append(goal(f"{best}_failures_over_bc", s[best]["failure_mean"] / max(bc["failure_mean"], 1e-9), 0.5,
                          "<="))
        if "bc_expert" in s:
            goals.append(goal(f"{best}_minus_bc_expert_success", s[best]["success_mean"] -
                              s["bc_expert"]["success_mean"], -0.05, ">="))
    runs = data.get("value_heldout_runs", {})  # the value model behind the best variant, else recap's
    family = best.split("_beta")[0] if best else "recap"
    family = "recap_balanced" if family in RELABELLED else family  # relabelled variants reuse its value model
    vocs = [v["voc"] for k, v in runs.items() if k.rsplit("_s", 1)[0] == family] or \
        [v["voc"] for v in data.get("value_heldout", [])]
    if vocs:
        finite = [v for v in vocs if not np.isnan(v)]
        goals.append(goal(f"value_voc_heldout_successes_{family}", statistics.mean(finite) if finite else float("nan"),
                          0.8, ">="))
    rounds = data.get("loop", {}).get("rounds", [])
    for prev, cur in itertools.pairwise(rounds):
        # rounded: success rates are counts over episodes, and 0.02 - 0.01 in floats falls short of 0.01
        goals.append(goal(f"loop_round{cur['round']}_success_gain",
                          round(cur["success_rate"] - prev["success_rate"], 6), 0.01, ">="))
    return goals


if __name__ == "__main__":
    main()
