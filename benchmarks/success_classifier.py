"""A success classifier for recordings without outcomes (DESIGN.md §5; docs/dense_rewards.md, "A success classifier
for recordings without outcomes"): the measurements that section quotes, by the commands it gives.

1. ``robot-rl collect task=so101_lift episodes=60 ... task.episode_length=80 task.terminate_on_success=false
   quality=0.7 seed=1``: the training recording (two 64x64 cameras, the expert at quality 0.7, so some episodes fail;
   the expert holds the cube up after a success, so a successful episode holds many success frames).
2. ``robot-rl success dataset.root=... run_dir=...`` with its defaults (1,500 steps): the classifier and its
   held-out scores from ``report.json`` (a quarter of the successful and of the failed episodes held out): frame ROC
   AUC, precision and recall of p >= threshold, the episode rule's accuracy and the onset error; the wall-clock.
3. ``robot-rl collect ... episodes=20 ... seed=2``: an independent recording, and ``robot-rl success
   dataset.root=... label.model=... label.out=...``: its labelled copy.
4. The copy's ``next.success`` against the recording's own (``robot_rl.rewards.success``'s scores): episodes right,
   frame precision and recall, and how many frames the first labelled frame lies after the true first success.

Writes benchmarks/results/success_classifier.json and .png.

    python benchmarks/success_classifier.py                        # ~10 min on 2 cores
    python benchmarks/success_classifier.py --episodes 12 --other-episodes 4 --steps 50 --out /tmp/sc   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, goal, run_robot_rl, save_figure, write_result

NAME = "success_classifier"
TASK = "so101_lift"
AUC_TARGET, EPISODE_ACCURACY_TARGET = 0.95, 0.95


def collect_args(root: Path, episodes: int, seed: int, episode_length: int, quality: float) -> list[str]:
    """The docs' ``robot-rl collect`` of a lift recording that runs on past the success."""
    return ["collect", f"task={TASK}", f"episodes={episodes}", f"dataset.root={root}",
            f"task.episode_length={episode_length}", "task.terminate_on_success=false", f"quality={quality}",
            f"seed={seed}", "progress=false"]


def read_success(root: Path) -> tuple[Any, Any]:
    """(``next.success`` bool [F], episode_index [F]) of every frame, sorted by (episode, frame)."""
    from policies import keys
    from robot_rl.data.lerobot_format import read_frames, read_meta

    meta = read_meta(root)
    frames = read_frames(meta, meta.episodes["episode_index"], [keys.SUCCESS_COL])
    return frames.columns[keys.SUCCESS_COL].reshape(-1).astype(bool), frames.columns["episode_index"]


def compare_labels(labelled: Any, recorded: Any, episode: Any) -> dict[str, Any]:
    """A labelled copy's ``next.success`` against the recording's own (both sorted by episode, frame): the scores of
    ``score_frames`` (the labels as p in {0, 1}, threshold 0.5, k = 1: the rule passes them through) and the onset lag
    of every episode both call successful (first labelled frame − first true success frame; > 0: late)."""
    import numpy as np

    from robot_rl.rewards.success import episode_any, score_frames

    labelled, recorded, episode = (np.asarray(labelled, dtype=bool), np.asarray(recorded, dtype=bool),
                                   np.asarray(episode))
    scores = score_frames(labelled.astype(np.float64), recorded, episode, 0.5, 1)
    eps, truth = episode_any(recorded, episode)
    _, guess = episode_any(labelled, episode)
    lag = {str(int(e)): int(np.argmax(labelled[episode == e])) - int(np.argmax(recorded[episode == e]))
           for e, t, g in zip(eps, truth, guess, strict=True) if t and g}
    ep = scores["episode"]
    return {"frames": scores["frames"], "episodes": len(eps), "successful_episodes": int(truth.sum()),
            "failed_episodes": int((~truth).sum()), "labelled_successful_episodes": int(guess.sum()),
            "episodes_right": ep["tp"] + ep["tn"], "episode_accuracy": scores["episode_accuracy"],
            "episode_confusion": {k: ep[k] for k in ("tp", "fp", "fn", "tn")},
            "frame_precision": scores["precision"], "frame_recall": scores["recall"],
            "frame_confusion": {k: scores[k] for k in ("tp", "fp", "fn", "tn")},
            "onset_lag_frames": lag,
            "onset_lag_min": min(lag.values()) if lag else None, "onset_lag_max": max(lag.values()) if lag else None,
            "onset_lag_mean": scores["onset_error_frames"]["mean"]}


def held_out_summary(report: dict[str, Any]) -> dict[str, Any]:
    """What the docs quote of ``robot-rl success``'s report.json: the held-out scores and the episode counts."""
    held, train = report["held_out"], report.get("train", {})
    ep = held["episode"]
    return {"frames": held["frames"], "positive_frames": held["positive_frames"], "episodes": len(held["episodes"]),
            "successful_episodes": ep["tp"] + ep["fn"], "failed_episodes": ep["fp"] + ep["tn"],
            "train_episodes": len(train.get("episodes", [])), "auc": held["auc"], "precision": held["precision"],
            "recall": held["recall"], "threshold": report["threshold"], "consecutive": report["consecutive"],
            "episodes_right": ep["tp"] + ep["tn"], "episode_accuracy": held["episode_accuracy"],
            "onset_error_mean_frames": held["onset_error_frames"]["mean"],
            "onset_error_mean_abs_frames": held["onset_error_frames"]["mean_abs"], "pr_table": held["pr_table"]}


def goals(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Held-out frame AUC >= 0.95; episodes right on the independent recording >= 0.95 (a score that could not be
    computed -- one class only -- counts as 0)."""
    return [goal("held_out_frame_auc", out["held_out"]["auc"] or 0.0, AUC_TARGET, ">="),
            goal("independent_recording_episode_accuracy", out["independent"]["episode_accuracy"] or 0.0,
                 EPISODE_ACCURACY_TARGET, ">=")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=60, help="episodes of the training recording (seed 1)")
    p.add_argument("--other-episodes", type=int, default=20, help="episodes of the independent recording (seed 2)")
    p.add_argument("--steps", type=int, default=1500, help="the classifier's gradient steps (robot-rl success steps=)")
    p.add_argument("--episode-length", type=int, default=80)
    p.add_argument("--quality", type=float, default=0.7, help="the expert's quality while recording")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--work", type=Path, default=None, help="keep the recordings and the classifier here")
    a = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = a.work or Path(tmp)
        train_root, other_root = work / "lift_train", work / "lift_other"
        model_dir, labelled_root = work / "lift_success", work / "lift_other_labelled"
        collect_s = run_robot_rl(collect_args(train_root, a.episodes, 1, a.episode_length, a.quality), "collect (train)")
        print(f"training recording: {a.episodes} episodes in {collect_s:.0f} s", flush=True)
        fit_s = run_robot_rl(["success", f"dataset.root={train_root}", f"run_dir={model_dir}", f"steps={a.steps}",
                          "progress=false"], "robot-rl success (train)")
        report = json.loads((model_dir / "report.json").read_text())
        print(f"classifier: {fit_s:.0f} s, held-out AUC {report['held_out']['auc']}", flush=True)
        other_s = run_robot_rl(collect_args(other_root, a.other_episodes, 2, a.episode_length, a.quality),
                           "collect (independent)")
        label_s = run_robot_rl(["success", f"dataset.root={other_root}", f"label.model={model_dir}",
                            f"label.out={labelled_root}", "progress=false"], "robot-rl success (label)")
        recorded, episode = read_success(other_root)
        labelled, episode_l = read_success(labelled_root)
        if len(episode) != len(episode_l) or (episode != episode_l).any():
            raise SystemExit("the labelled copy's frames are not the recording's")
        independent = compare_labels(labelled, recorded, episode)

    out = {
        "task": TASK,
        "train_recording": {"episodes": a.episodes, "seed": 1, "episode_length": a.episode_length,
                            "quality": a.quality, "frames": report["frames"], "episodes_read": report["episodes"],
                            "successful_episodes": report["successful_episodes"],
                            "positive_frames": report["positive_frames"],
                            "timing_dropped": report.get("timing_dropped"), "collect_s": round(collect_s, 1)},
        "classifier": {"steps": a.steps, "cameras": report["cameras"], "final_loss": report["loss"],
                       "train_process_s": round(fit_s, 1)},
        "held_out": held_out_summary(report),
        "held_out_curves": report.get("held_out_curves", {}),
        "independent_recording": {"episodes": a.other_episodes, "seed": 2, "collect_s": round(other_s, 1),
                                  "label_process_s": round(label_s, 1)},
        "independent": independent,
    }
    path = write_result(NAME, out, goals(out), a.out)
    plot(out, a.out / f"{NAME}.png")
    print(json.dumps({k: out[k] for k in ("held_out", "independent")}, indent=1))
    print(path)


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    held, ind = data["held_out"], data["independent"]
    fig, (ax, bars, onset) = plt.subplots(1, 3, figsize=(15, 4.2))
    for ep, c in data["held_out_curves"].items():
        line, = ax.plot(c["p"], lw=1.1, label=f"episode {ep}")
        solved = np.flatnonzero(c["success"])
        if len(solved):
            ax.axvspan(solved[0], solved[-1] + 0.5, color=line.get_color(), alpha=0.10, lw=0)
    ax.axhline(held["threshold"], color="k", ls="--", lw=0.8)
    ax.set(xlabel="frame", ylabel="p(success)", ylim=(-0.05, 1.05),
           title=f"held-out episodes (true success shaded): AUC {held['auc']:.3f}")
    ax.legend(fontsize=7)
    names = ["frame AUC", "frame precision", "frame recall", "episode accuracy"]
    hv = [held["auc"], held["precision"], held["recall"], held["episode_accuracy"]]
    iv = [None, ind["frame_precision"], ind["frame_recall"], ind["episode_accuracy"]]
    x = np.arange(len(names))
    bars.bar(x - 0.2, [v or 0.0 for v in hv], 0.4, label=f"held out ({held['episodes']} episodes)")
    bars.bar(x + 0.2, [v or 0.0 for v in iv], 0.4, label=f"independent recording, labelled ({ind['episodes']})")
    for xi, (h, i) in enumerate(zip(hv, iv, strict=True)):
        for dx, v in ((-0.2, h), (0.2, i)):
            if v is not None:
                bars.text(xi + dx, v + 0.01, f"{v:.3f}", ha="center", fontsize=7)
    bars.axhline(0.95, color="k", ls=":", lw=0.8)
    bars.set(xticks=x, ylim=(0, 1.1), title=f"p >= {held['threshold']:g}, k = {held['consecutive']}")
    bars.set_xticklabels(names, fontsize=8)
    bars.legend(fontsize=7, loc="lower left")
    lags = list(ind["onset_lag_frames"].values())
    if lags:
        onset.hist(lags, bins=np.arange(min(lags) - 0.5, max(lags) + 1.5, 1.0), rwidth=0.8)
    mean = "n/a" if ind["onset_lag_mean"] is None else f"{ind['onset_lag_mean']:.1f}"
    onset.set(xlabel="first labelled frame − first true success frame", ylabel="episodes",
              title=f"independent: {ind['episodes_right']}/{ind['episodes']} episodes right, mean lag {mean}")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
