"""How high can a value model's VOC go on ``benchmarks/recap.py``'s held-out episodes? A ceiling from privileged state.

``recap.py``'s goal asks the learned value model (cameras + joints + instruction) for a value-order correlation
(VOC, ``robot_rl.models.voc``) of at least 0.8 on its held-out successful episodes; it reaches ~0.71, 0.87-0.97 on
the expert's episodes and much less on the degraded expert's successes. VOC scores a value by how monotonically it
rises over a successful episode; a degraded episode that drops its cube or misses a grasp and tries again is not
monotone in truth: the best value of the state after a drop is lower than before it. So on mixed data even a perfect
V(o) scores below 1. This benchmark measures how far below, with the same episodes and targets:

1. **Data**, by ``robot-rl collect`` with ``env_state=true`` and no cameras (``recap.py``'s recipe, seeds and env
   count, so the episodes are the very ones ``recap.py`` records with cameras; checked on ``observation.state``
   when ``--compare`` names that dataset): the 300 training episodes (90 expert, 210 with every flaw) and the 50
   held-out ones (15 / 35), plus ``--scale`` times as many training episodes from other seeds.
2. **State value models**: an MLP with ``recap.py``'s distributional head (201 bins on [-1, 0], HL-Gauss) and targets
   (``robot_rl.data.labels.value_targets``, M = 150), on (a) the simulator's privileged state (the arm, the cube's
   pose, the pad contacts: what no camera needs to recover) or (b) the six joints alone, trained on the 300 episodes
   and on the scaled set, several seeds each.
3. **Scores** on the held-out successful episodes: VOC over all of them, over the expert's and over the degraded
   successes, and the success AUC; beside them ``recap.py``'s image value models' (from ``recap.json``).

4. **RECAP labelled by the better model** (``--recap``, after ``--image``): ``recap.py``'s ``recap_balanced`` on its
   300 mixed episodes, labelled per frame by the image value model fitted on the scaled set
   (``algo.value.pretrained``) and, beside it, by its own 300-episode value model; success at each CFG β on
   ``recap.py``'s evaluation seeds, and the expert's share of the positives.

Privileged state with 5x the data is close to the best V(o) of these episodes (the cube's and arm's full state is
what decides the rest of the episode, up to the scripted flaws' own randomness): its VOC is what the goal can hope
for on this held-out mix.

    python benchmarks/value_ceiling.py                      # ~40 min on 2 cores (collection ~15 min)
    python benchmarks/value_ceiling.py --scale 2 --steps 300 --seeds 1 --out /tmp/vc   # a smoke run (~8 min)

    python benchmarks/value_ceiling.py --image --compare /tmp/recap_bench/heldout --image-value-steps 12000
    python benchmarks/value_ceiling.py --recap --compare /tmp/recap_bench/heldout   # after --image (12,000 steps)

Writes ``benchmarks/results/value_ceiling.json`` + ``value_ceiling.png``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import robot_rl  # noqa: F401, I001  (before torch: OpenMP's spin, robot_rl.OPENMP_SPIN)
import numpy as np
import torch
from torch import nn

from benchmarks.common import RESULTS, save_figure, write_result
from benchmarks.recap import EPISODE_LENGTH, TASK, _overrides
from benchmarks.vla_bc import VISUAL_DR

NAME = "value_ceiling"
N_EXPERT_HELDOUT = 15  # recap.py's held-out set: its first 15 episodes are the expert's (seed 2), then 35 degraded


# ------------------------------------------------------------------------------------------------------ data
def collect_state(root: Path, episodes: int, quality: float, seed: int, append: bool, num_envs: int) -> dict[str, Any]:
    """``robot-rl collect`` of so101_lift with the env's state columns and no cameras (recap.py's other settings)."""
    from robot_rl.cli.build import compose
    from robot_rl.cli.collect import collect as run_collect

    cfg = compose("collect", [f"task={TASK}", f"episodes={episodes}", f"dataset.root={root}",
                              f"dataset.append={'true' if append else 'false'}", f"quality={quality}",
                              "task.cameras=[]", f"sim.num_envs={num_envs}", f"seed={seed}", "progress=false",
                              "env_state=true", *_overrides(VISUAL_DR, "sim.randomization")])
    c = run_collect(cfg)
    return {"episodes": c.episodes, "successes": c.successes, "frames": c.frames, "quality": quality, "seed": seed,
            "seconds": round(c.seconds, 1)}


def read_columns(root: Path) -> dict[str, np.ndarray]:
    """Index, state and success columns of every episode of a dataset, sorted by (episode, frame)."""
    from policies import keys
    from robot_rl.data.lerobot_format import read_frames, read_meta

    meta = read_meta(root)
    eps = np.array(sorted(int(e) for e in meta.episodes["episode_index"]))
    cols = read_frames(meta, eps, [keys.OBS_STATE, keys.ENV_STATE_COL, keys.SUCCESS_COL]).columns
    return {"episode_index": cols["episode_index"], "frame_index": cols["frame_index"],
            "joints": cols[keys.OBS_STATE].astype(np.float32), "privileged": cols[keys.ENV_STATE_COL].astype(np.float32),
            "success": cols[keys.SUCCESS_COL].reshape(-1).astype(bool)}


def episode_success(cols: dict[str, np.ndarray]) -> np.ndarray:
    """[F] whether each frame's episode succeeded."""
    eps, succ = cols["episode_index"], cols["success"]
    ok = {int(e): bool(succ[eps == e].any()) for e in np.unique(eps)}
    return np.array([ok[int(e)] for e in eps])


# ---------------------------------------------------------------------------------------------------- model
class StateValue(nn.Module):
    """V(s) as recap's value head: normalised state -> 3 x 256 MLP -> 201 logits on [-1, 0]."""

    def __init__(self, mean: np.ndarray, std: np.ndarray, bins: int = 201, hidden: int = 256) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean))
        self.register_buffer("std", torch.as_tensor(np.maximum(std, 1e-3)))
        d = len(mean)
        self.net = nn.Sequential(nn.Linear(d, hidden), nn.LayerNorm(hidden), nn.SiLU(), nn.Linear(hidden, hidden),
                                 nn.LayerNorm(hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, bins))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.std)


def train_value(x: np.ndarray, y: np.ndarray, steps: int, seed: int, batch: int = 256,
                val: tuple[np.ndarray, dict[str, np.ndarray]] | None = None, every: int = 500
                ) -> tuple[StateValue, dict[str, Any]]:
    """Cross-entropy against HL-Gauss targets (σ = 0.75 bins, as ``ValueConfig``), AdamW 3e-4, weight decay 1e-4.

    ``val`` (inputs, columns of validation episodes taken from the training set, never the held-out ones): every
    ``every`` steps the VOC on its successes is measured and the best model kept (early stopping; a fixed budget
    overfits the small set and underfits the large one). Returns the model and {step chosen, validation VOC curve}."""
    from robot_rl.models.value import bin_centers, hl_gauss
    from robot_rl.models.voc import value_order_correlation

    torch.manual_seed(seed)
    model = StateValue(x.mean(0), x.std(0))
    centers = bin_centers(201, -1.0, 0.0)
    sigma = 0.75 * float(centers[1] - centers[0])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=1e-4)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    gen = torch.Generator().manual_seed(seed)
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    curve = []
    for step in range(1, steps + 1):
        model.train()
        idx = torch.randint(0, len(xt), (batch,), generator=gen)
        loss = -(hl_gauss(yt[idx], centers, sigma) * model(xt[idx]).log_softmax(-1)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if val is not None and (step % every == 0 or step == steps):
            vx, vc = val
            voc, _ = value_order_correlation(predict(model.eval(), vx), vc["episode_index"], vc["frame_index"],
                                             episode_success(vc))
            curve.append([step, round(voc, 4)])
            if best is None or voc > best[0]:
                best = (voc, step, {k: v.clone() for k, v in model.state_dict().items()})
    info: dict[str, Any] = {"steps": steps}
    if best is not None:
        model.load_state_dict(best[2])
        info = {"steps": steps, "chosen_step": best[1], "validation_voc": round(best[0], 4), "validation_curve": curve}
    return model.eval(), info


def split_validation(cols: dict[str, np.ndarray], every: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Row masks (train, validation): every ``every``-th episode of the training set validates."""
    val = cols["episode_index"] % every == every - 1
    return ~val, val


@torch.no_grad()
def predict(model: StateValue, x: np.ndarray) -> np.ndarray:
    from robot_rl.models.value import bin_centers, expected_value

    return expected_value(model(torch.as_tensor(x)), bin_centers(201, -1.0, 0.0)).numpy()


def by_kind(per_episode: dict[Any, float]) -> dict[str, float]:
    """Mean per-episode VOC of the held-out expert's episodes and of the degraded successes ({episode: ρ}, keys int or
    str as JSON gives them back)."""
    per = {int(e): v for e, v in per_episode.items()}
    return {"voc_expert": round(float(np.mean([v for e, v in per.items() if e < N_EXPERT_HELDOUT])), 4),
            "voc_degraded_successes": round(float(np.mean([v for e, v in per.items() if e >= N_EXPERT_HELDOUT])), 4)}


def scores(values: np.ndarray, held: dict[str, np.ndarray]) -> dict[str, Any]:
    """VOC over the held-out successes (all, the expert's, the degraded ones) and the success AUC."""
    from robot_rl.models.voc import success_auc, value_order_correlation

    eps, frames, ok = held["episode_index"], held["frame_index"], episode_success(held)
    voc, per = value_order_correlation(values, eps, frames, ok)
    first = frames == 0
    return {"voc": round(voc, 4), **by_kind(per), "successful_episodes": len(per),
            "success_auc": round(success_auc(values[first], ok[first]), 4),
            "per_episode": {str(k): round(v, 4) for k, v in per.items()}}


def image_model_scores(recap_json: Path) -> dict[str, Any]:
    """``recap.py``'s image value models on the same held-out episodes, split the same way."""
    if not recap_json.is_file():
        return {}
    runs = json.loads(recap_json.read_text()).get("value_heldout_runs", {})
    out = {}
    for name, r in runs.items():
        out[name] = {"voc": round(r["voc"], 4), **by_kind(r["per_episode"]), "success_auc": round(r["success_auc"], 4)}
    return out


# ------------------------------------------------------------------------------------------ the image model
def image_scaled(a: argparse.Namespace, sets: dict[str, list[tuple[int, float, int]]]) -> dict[str, Any]:
    """recap.py's image value model (its own code path: ``robot-rl offline algo=recap``, cameras + joints +
    instruction) trained on the scaled set recorded with cameras (the same seeds and env count as the state set, so
    the same episodes), scored on recap.py's held-out dataset (``--compare``)."""
    from benchmarks.recap import collect, heldout_voc, train

    name = f"train_{a.scale}x"
    root = a.work / f"{name}_images"
    record = a.work / f"{name}_images_collect.json"
    if not record.is_file():
        shutil.rmtree(root, ignore_errors=True)
        t = time.perf_counter()
        parts = [collect(root, n, q, a.scaled_num_envs, s, i > 0) for i, (n, q, s) in enumerate(sets[name])]
        record.write_text(json.dumps({"parts": parts, "seconds": round(time.perf_counter() - t, 1)}, indent=1))
    out: dict[str, Any] = {"train_set": name, "collect": json.loads(record.read_text()), "runs": {}}
    for steps in a.image_value_steps:
        run_dir = a.work / f"image_value_{name}_{steps}"
        shutil.rmtree(run_dir, ignore_errors=True)
        t = time.perf_counter()
        rec = train("recap", root, run_dir, 1, 0, [f"algo.value.steps={steps}",
                                                   f"algo.labels.max_episode_length={EPISODE_LENGTH}"])
        voc = heldout_voc(run_dir / "value", a.compare)
        out["runs"][str(steps)] = {
            "command": rec["command"], "seconds": round(time.perf_counter() - t, 1), "voc": round(voc["voc"], 4),
            **by_kind(voc["per_episode"]), "success_auc": round(voc["success_auc"], 4), "per_episode": voc["per_episode"]}
        print(f"image value model, {name}, {steps} steps: {out['runs'][str(steps)]['voc']}", file=sys.stderr)
    return out


# --------------------------------------------------------------------------- RECAP labelled by the scaled model
RECAP_BALANCED = ["algo.lr_schedule=cosine", "algo.warmup_updates=200", f"algo.labels.max_episode_length={EPISODE_LENGTH}",
                  "algo.recap.positive_share=0.5"]  # recap.py's recap_balanced (its --extra, value_extra, variant)
RECAP_BETAS = (1.0, 1.5, 2.5)


def recap_with_scaled_value(a: argparse.Namespace) -> dict[str, Any]:
    """recap.py's ``recap_balanced`` (seed 0, its settings and evaluation seeds) on its 300 mixed episodes
    (``--compare``'s sibling ``mixed``), labelled per frame by (a) the image value model ``--image`` fitted on the
    scaled set (``algo.value.pretrained``, nothing refitted) and (b) its own value model fitted on the 300 episodes
    (recap.py's recipe, 1,500 value steps): does a better value model make per-frame RECAP labels pay off? Scored by
    success over 100 seeded episodes at each CFG β, the expert's share of the positives, and each model's held-out
    VOC."""
    from benchmarks.recap import EVAL_SEED, evaluate_policy, heldout_voc, label_quality, train
    from policies import load_policy

    mixed = a.compare.parent / "mixed"
    scaled = a.work / f"image_value_train_{a.scale}x_{a.recap_value_steps}" / "value"
    if not (scaled / "manifest.json").is_file():
        raise SystemExit(f"--recap needs the scaled image value model {scaled} (run --image with "
                         f"--image-value-steps {a.recap_value_steps} first)")
    variants = {"scaled_value": [f"algo.value.pretrained={scaled}"], "own_value": ["algo.value.steps=1500"]}
    variants = {k: v for k, v in variants.items() if k in a.recap_variants}
    out: dict[str, Any] = {"dataset": str(mixed), "policy_steps": a.recap_steps, "value_model_scaled": str(scaled),
                           "eval_episodes": 100, "eval_seed": EVAL_SEED, "runs": {}}
    for name, extra in variants.items():
        run_dir = a.work / f"recap_{name}"
        shutil.rmtree(run_dir, ignore_errors=True)
        t = time.perf_counter()
        rec = train("recap", mixed, run_dir, a.recap_steps, 0, RECAP_BALANCED + extra)
        policy = load_policy(rec["policy"])
        success = {}
        for beta in RECAP_BETAS:
            policy.cfg.guidance_beta = beta
            success[f"beta{beta:g}"] = evaluate_policy(policy, 100, a.num_envs, EVAL_SEED)["success_rate"]
        quality = label_quality(run_dir / "labels", 90)
        out["runs"][name] = {
            "command": rec["command"], "seconds": round(time.perf_counter() - t, 1), "success": success,
            "heldout_voc": round(heldout_voc(run_dir / "value", a.compare)["voc"], 4),
            "expert_share_of_positives": round(quality["expert_share_of_positives"], 4),
            "positive_rate_by_fifth_expert": quality["positive_rate_by_fifth_expert"]}
        print(f"recap_balanced labelled by {name}: {out['runs'][name]}", file=sys.stderr)
    return out


# ------------------------------------------------------------------------------------------------------ plot
def plot(data: dict[str, Any], curves: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.5))
    rows = [(f"image (recap.py) {k}", v) for k, v in data["image_models"].items()]
    rows += [(k, v["mean"]) for k, v in data["state_models"].items()]
    scaled = data.get("image_model_scaled")
    if scaled:
        rows += [(f"image, {scaled['train_set']}, {k} steps", v) for k, v in scaled["runs"].items()]
    parts = ("voc", "voc_expert", "voc_degraded_successes")
    w = 0.8 / len(parts)
    for j, p in enumerate(parts):
        ax.bar(np.arange(len(rows)) + (j - 1) * w, [r[1][p] for r in rows], w, label=p)
    ax.axhline(0.8, color="k", ls="--", lw=1, label="recap.py goal (VOC 0.8)")
    ax.set_xticks(np.arange(len(rows)), [r[0] for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_title("VOC on recap.py's held-out successful episodes", fontsize=9)
    ax.legend(fontsize=7)
    for label, c in curves["values"].items():
        bx.plot(c, label=label)
    bx.plot(curves["target"], "k--", label="target: -(frames to success) / 150")
    bx.set_xlabel("frame")
    bx.set_ylabel("V")
    bx.set_title(f"held-out degraded success {curves['episode']}: the best state model's lowest VOC", fontsize=9)
    bx.legend(fontsize=7)
    save_figure(fig, path)


# ------------------------------------------------------------------------------------------------------ main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=int, default=5, help="the large training set is this many times the 300 episodes")
    p.add_argument("--steps", type=int, default=6000, help="gradient steps of each state value model")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--early-stop", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the step with the best VOC on a tenth of the training episodes (never the held-out)")
    p.add_argument("--num-envs", type=int, default=25, help="recap.py's: the same episodes need the same env count")
    p.add_argument("--scaled-num-envs", type=int, default=50, help="envs recording the large set (other episodes)")
    p.add_argument("--image", action="store_true",
                   help="add to the value_ceiling.json in --out: recap.py's image value model trained on the scaled "
                        "set recorded with cameras (needs --compare, recap.py's held-out dataset)")
    p.add_argument("--image-value-steps", type=int, nargs="+", default=[6000],
                   help="--image: value model gradient steps (one run each)")
    p.add_argument("--recap", action="store_true",
                   help="add to the value_ceiling.json in --out: recap.py's recap_balanced on its mixed set (the "
                        "folder beside --compare) labelled by the --image model vs by its own value model")
    p.add_argument("--recap-value-steps", type=int, default=12000, help="--recap: which --image model labels")
    p.add_argument("--recap-steps", type=int, default=3000, help="--recap: policy gradient steps (recap.py's)")
    p.add_argument("--recap-variants", nargs="+", choices=("scaled_value", "own_value"),
                   default=["scaled_value", "own_value"],
                   help="--recap: label with the scaled model and/or the run's own 300-episode model (the latter is "
                        "recap.py's recap_balanced, seed 0)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the MLPs are small: one is fastest)")
    p.add_argument("--work", type=Path, default=Path("/tmp/value_ceiling"))
    p.add_argument("--skip-collect", action="store_true", help="reuse the datasets in --work")
    p.add_argument("--compare", type=Path, default=None,
                   help="recap.py's held-out dataset (e.g. /tmp/recap_bench/heldout): check the episodes are the same")
    p.add_argument("--recap-json", type=Path, default=RESULTS / "recap.json")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    if a.scale < 2:
        p.error("--scale must be >= 2 (1 is the 300 episodes themselves)")
    torch.set_num_threads(a.threads)
    sets = {"train_1x": [(90, 1.0, 0), (210, 0.0, 1)], "heldout": [(15, 1.0, 2), (35, 0.0, 3)],
            f"train_{a.scale}x": [(90 * a.scale, 1.0, 10), (210 * a.scale, 0.0, 11)]}
    if a.image or a.recap:
        if a.compare is None:
            p.error("--image and --recap need --compare (recap.py's held-out dataset, with cameras)")
        path = a.out / f"{NAME}.json"
        data = {k: v for k, v in json.loads(path.read_text()).items()
                if k not in ("name", "date", "commit", "command", "machine", "goals")}
        data["settings"].setdefault("extended_by", []).append(" ".join(sys.argv))
        if a.image:
            earlier = data.get("image_model_scaled", {}).get("runs", {})  # runs of other step counts stay
            data["image_model_scaled"] = image_scaled(a, sets)
            data["image_model_scaled"]["runs"] = {**earlier, **data["image_model_scaled"]["runs"]}
        if a.recap:
            data["recap_labelled_by_scaled_value"] = recap_with_scaled_value(a)
        write_result(NAME, data, [], a.out)
        plot(data, data["curve_example"], a.out / f"{NAME}.png")
        return
    data: dict[str, Any] = {"settings": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                                         "sets": {k: [{"episodes": n, "quality": q, "seed": s} for n, q, s in v]
                                                  for k, v in sets.items()},
                                         "episode_length": EPISODE_LENGTH}}
    record = a.work / "collect.json"  # the collection's record, kept for --skip-collect
    if not a.skip_collect:
        shutil.rmtree(a.work, ignore_errors=True)
        collected = {}
        for name, parts in sets.items():
            envs = a.num_envs if name in ("train_1x", "heldout") else a.scaled_num_envs
            collected[name] = [collect_state(a.work / name, n, q, s, i > 0, envs) for i, (n, q, s) in enumerate(parts)]
            print(f"collected {name}: {collected[name]}", file=sys.stderr)
        record.write_text(json.dumps(collected, indent=1))
    if record.is_file():
        data["collect"] = json.loads(record.read_text())
    from robot_rl.data.labels import value_targets

    cols = {name: read_columns(a.work / name) for name in sets}
    held = cols["heldout"]
    if a.compare is not None:
        from robot_rl.data.lerobot_format import read_frames, read_meta

        meta = read_meta(a.compare)
        ref = read_frames(meta, np.array(sorted(int(e) for e in meta.episodes["episode_index"])),
                          ["observation.state"]).columns
        same = ref["observation.state"].shape == held["joints"].shape and bool(
            np.array_equal(ref["observation.state"], held["joints"]))
        data["same_episodes_as"] = {"dataset": str(a.compare), "identical_observation_state": same}
        if not same:
            raise SystemExit(f"the held-out episodes differ from {a.compare}'s: VOCs would not compare")
    data["frames"] = {k: len(v["episode_index"]) for k, v in cols.items()}
    data["image_models"] = image_model_scores(a.recap_json)
    data["state_models"] = {}
    best: tuple[float, str, StateValue] | None = None
    for inputs in ("privileged", "joints"):
        for train_set in ("train_1x", f"train_{a.scale}x"):
            c = cols[train_set]
            y = value_targets(c["episode_index"], c["success"], EPISODE_LENGTH)
            fit, val = split_validation(c) if a.early_stop else (np.ones(len(y), bool), np.zeros(len(y), bool))
            vcols = {k: v[val] for k, v in c.items()}
            runs = []
            for seed in range(a.seeds):
                t = time.perf_counter()
                model, info = train_value(c[inputs][fit], y[fit], a.steps, seed,
                                          val=(c[inputs][val], vcols) if a.early_stop else None)
                r = {**scores(predict(model, held[inputs]), held), **info}
                r["train_s"] = round(time.perf_counter() - t, 1)
                runs.append(r)
                key = f"{inputs} state, {train_set}"
                print(f"{key} seed {seed}: VOC {r['voc']} (expert {r['voc_expert']}, degraded "
                      f"{r['voc_degraded_successes']}), AUC {r['success_auc']}, step {r.get('chosen_step')}",
                      file=sys.stderr)
                if best is None or r["voc"] > best[0]:
                    best = (r["voc"], key, model)
            data["state_models"][key] = {
                "inputs": inputs, "train_set": train_set, "runs": runs,
                "mean": {m: round(statistics.mean(r[m] for r in runs), 4)
                         for m in ("voc", "voc_expert", "voc_degraded_successes", "success_auc")}}
    # the curve figure: the best model's lowest-VOC held-out degraded success, with the other inputs' model beside it
    assert best is not None
    per = data["state_models"][best[1]]["runs"][0]["per_episode"]
    worst = min((int(e) for e in per if int(e) >= N_EXPERT_HELDOUT), key=lambda e: per[str(e)])
    sel = held["episode_index"] == worst
    y_held = value_targets(held["episode_index"], held["success"], EPISODE_LENGTH)
    inputs_best = data["state_models"][best[1]]["inputs"]
    curves = {"episode": worst, "target": y_held[sel].tolist(),
              "values": {best[1]: predict(best[2], held[inputs_best][sel]).round(4).tolist()}}
    data["curve_example"] = curves
    data["note"] = ("VOC of recap.py's value models on its held-out successful episodes, beside state value models "
                    "(same head, targets and held-out episodes) that see the simulator's full state: the privileged "
                    "model trained on the larger set approximates the best V(o) of this data, and its VOC on the "
                    "degraded successes is what their drops and retries allow.")
    a.out.mkdir(parents=True, exist_ok=True)
    write_result(NAME, data, [], a.out)
    plot(data, curves, a.out / f"{NAME}.png")
    print(json.dumps({k: v["mean"] for k, v in data["state_models"].items()}, indent=1))


if __name__ == "__main__":
    main()
