"""``robot-rl success``: train a success classifier (``robot_rl.rewards.success``) on a LeRobotDataset v3 with
outcomes, or label a copy of a dataset without them, so ``robot-rl offline algo=recap`` can learn from it.

    robot-rl collect task=so101_lift episodes=60 dataset.root=data/lift task.terminate_on_success=false quality=0.85
    robot-rl success dataset.root=data/lift run_dir=runs/lift_success          # train; report.json + success.png
    robot-rl success dataset.root=data/real label.model=runs/lift_success label.out=data/real_labelled
    robot-rl offline algo=recap dataset.root=data/real_labelled ...

Training writes the classifier (``success.json`` with its scores, ``success.safetensors``), ``report.json`` and
``success.png`` (p(success) over held-out episodes, their true success frames shaded, and the ROC curve) into
``run_dir``. Labelling (``label.model`` given) trains nothing: it writes a new dataset at ``label.out``, the source's
files with ``next.success`` from the classifier's rule (``label.threshold``, ``label.consecutive``; the model's own
by default); the source is only read.
"""

from __future__ import annotations

import datetime
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_rl.rewards.success import SuccessConfig


@dataclass
class SuccessDataset:
    root: str | None = None  # the LeRobotDataset v3 folder (only read): with next.success to train, any to label
    timing_check: bool = True  # training: leave out episodes recorded with late ticks (robot_rl.data.timing)


@dataclass
class SuccessLabel:
    """Labelling instead of training: ``model`` set."""

    model: str | None = None  # a classifier's folder (robot-rl success run_dir=...); None: train one
    out: str | None = None  # the labelled copy's folder (new; never the source)
    threshold: float | None = None  # p at or above which a frame hits; None: the model's own
    consecutive: int | None = None  # k frames in a row; None: the model's own


@dataclass
class SuccessCommand(SuccessConfig):
    """configs/success.yaml: the classifier's config (``SuccessConfig``: cameras, steps, threshold, consecutive,
    holdout, seed, ...), where it reads and writes, and the labelling section."""

    dataset: SuccessDataset = field(default_factory=SuccessDataset)
    label: SuccessLabel = field(default_factory=SuccessLabel)
    run_dir: str | None = None  # default: runs/success_<dataset folder name>_<YYYYmmdd_HHMMSS>
    device: str = "cpu"
    progress: bool = True  # tqdm bars on stderr


def plot_report(report: dict[str, Any], path: Path, title: str) -> Path | None:
    """p(success) against time of held-out episodes (true success frames shaded) and the held-out ROC curve."""
    curves = report.get("held_out_curves") or {}
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from robot_rl.logging import save_figure

    fig, (ax, roc) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (ep, c) in enumerate(curves.items()):
        line, = ax.plot(c["p"], lw=1.2, label=f"episode {ep}")
        solved = np.flatnonzero(c["success"])
        if len(solved):
            ax.axvspan(solved[0], solved[-1] + 0.5, color=line.get_color(), alpha=0.12, lw=0)
    ax.axhline(report["threshold"], color="k", ls="--", lw=0.8, label="threshold")
    ax.set(xlabel="frame", ylabel="p(success)", ylim=(-0.05, 1.05))
    ax.legend(fontsize=7)
    p = np.concatenate([c["p"] for c in curves.values()])
    y = np.concatenate([c["success"] for c in curves.values()]).astype(bool)
    if y.any() and (~y).any():
        order = np.argsort(-p, kind="stable")
        tpr = np.r_[0, np.cumsum(y[order]) / y.sum()]
        fpr = np.r_[0, np.cumsum(~y[order]) / (~y).sum()]
        roc.plot(fpr, tpr, lw=1.5)
    roc.plot([0, 1], [0, 1], color="grey", ls=":", lw=0.8)
    roc.set(xlabel="false positive rate", ylabel="true positive rate", title="held-out frames (episodes drawn)")
    return save_figure(fig, path, title, plt)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def success(cfg: Any) -> Path:
    """Train, save, report and plot; or (``label.model``) write a labelled copy. Returns the folder written."""
    import dataclasses

    from omegaconf import OmegaConf

    from robot_rl.cli.config import resolve_device, typed
    from robot_rl.logging import step_bar
    from robot_rl.rewards.success import CONFIG_FILE, fit_success, label_dataset, load_success

    c = typed(SuccessCommand, OmegaConf.to_container(cfg, resolve=True), "")
    if not c.dataset.root:
        raise ValueError("robot-rl success needs dataset.root=DIR (a LeRobotDataset v3: with next.success to train a "
                         "classifier, any to label with label.model=RUN label.out=NEW_DIR)")
    root, device = Path(c.dataset.root), resolve_device(c.device)
    if c.label.model is not None or c.label.out is not None:
        if c.label.model is None or c.label.out is None:
            raise ValueError("labelling needs both label.model=RUN (a classifier's folder) and label.out=NEW_DIR")
        model = load_success(c.label.model, device)
        summary = label_dataset(model, root, c.label.out, c.label.threshold, c.label.consecutive,
                                str(Path(c.label.model).resolve()), c.progress)
        print(f"success labels: {summary['successful_episodes']} of {summary['episodes']} episodes labelled "
              f"successful (p >= {summary['threshold']:g} for {summary['consecutive']} frames); labelled copy in "
              f"{c.label.out}", file=sys.stderr)
        return Path(c.label.out)
    stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
    run_dir = Path(c.run_dir or f"runs/success_{root.name}_{stamp}")
    if (run_dir / CONFIG_FILE).exists():
        raise ValueError(f"run_dir={run_dir} already holds a success classifier ({CONFIG_FILE}): give another run_dir "
                         f"(or none: a new timestamped folder)")
    model_cfg = SuccessConfig(**{f.name: getattr(c, f.name) for f in dataclasses.fields(SuccessConfig)})
    with step_bar(c.steps, "success classifier", c.progress) as tick:  # a DatasetError is a ValueError: exit 2
        model, report = fit_success(root, model_cfg, device, tick, c.dataset.timing_check, c.progress)
    model.save(run_dir)
    (run_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    held = report.get("held_out", {})
    plot_report(report, run_dir / "success.png", f"{root.name}: held-out AUC {_fmt(held.get('auc'))}, episode "
                f"accuracy {_fmt(held.get('episode_accuracy'))}")
    print(f"success classifier: {report['frames']} frames of {report['episodes']} episodes; held out: AUC "
          f"{_fmt(held.get('auc'))}, precision {_fmt(held.get('precision'))}, recall {_fmt(held.get('recall'))} at "
          f"p >= {c.threshold:g}, episode accuracy {_fmt(held.get('episode_accuracy'))} (k = {c.consecutive}); "
          f"saved in {run_dir}", file=sys.stderr)
    return run_dir
