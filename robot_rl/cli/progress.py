"""``robot-rl progress``: train a progress model (``robot_rl.rewards.progress``) on a LeRobotDataset v3, the potential
of dense rewards for ``robot-rl train ... reward.progress=<its folder>``.

    robot-rl collect task=so101_lift episodes=50 dataset.root=data/lift env_state=true task.cameras=[]
    robot-rl progress dataset.root=data/lift run_dir=runs/lift_progress
    robot-rl train task=so101_lift reward.progress=runs/lift_progress ...

The folder gets the model (``progress.json`` with its scores, ``progress.safetensors``) and ``progress.png``: Φ
over time on held-out successful episodes, which a good model draws rising from 0 to 1.
"""

from __future__ import annotations

import datetime
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_rl.rewards.progress import ProgressConfig


@dataclass
class ProgressDataset:
    root: str | None = None  # the LeRobotDataset v3 folder (only read), recorded with env_state=true
    timing_check: bool = True  # leave out episodes recorded with late ticks (robot_rl.data.timing)


@dataclass
class ProgressCommand(ProgressConfig):
    """configs/progress.yaml: the model's config (``ProgressConfig``: hidden_dims, steps, lr, failure_label,
    mismatch_fraction, holdout, seed, ...) and where it reads and writes."""

    dataset: ProgressDataset = field(default_factory=ProgressDataset)
    run_dir: str | None = None  # default: runs/progress_<dataset folder name>_<YYYYmmdd_HHMMSS>
    device: str = "cpu"
    progress: bool = True  # tqdm bar on stderr


def draw_curves(ax: Any, curves: dict[str, list[float]]) -> None:
    """Φ against the episode's fraction of time on ``ax``, one line per held-out episode (``report.json``'s
    ``held_out_curves``)."""
    for ep, phi in curves.items():
        n = max(len(phi) - 1, 1)
        ax.plot([i / n for i in range(len(phi))], phi, lw=1.2, label=f"episode {ep}")
    ax.set(xlabel="fraction of the episode", ylabel="progress Φ", ylim=(-0.05, 1.05))
    ax.legend(fontsize=7)


def plot_curves(curves: dict[str, list[float]], path: Path, title: str) -> Path | None:
    """``draw_curves`` into a PNG; None when nothing to draw."""
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from robot_rl.logging import save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    draw_curves(ax, curves)
    return save_figure(fig, path, title, plt)


def progress(cfg: Any) -> Path:
    """Train, save, plot; returns the model's folder."""
    import dataclasses

    from omegaconf import OmegaConf

    from robot_rl.checkpoint import check_new_run_dir
    from robot_rl.cli.config import resolve_device, typed
    from robot_rl.logging import step_bar
    from robot_rl.rewards.progress import fit_progress

    raw = OmegaConf.to_container(cfg, resolve=True)
    c = typed(ProgressCommand, raw, "")
    if not c.dataset.root:
        raise ValueError("robot-rl progress needs dataset.root=DIR (a LeRobotDataset v3 recorded with env_state=true)")
    root = Path(c.dataset.root)
    stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
    run_dir = Path(c.run_dir or f"runs/progress_{root.name}_{stamp}")
    check_new_run_dir(run_dir)
    model_cfg = ProgressConfig(**{f.name: getattr(c, f.name) for f in dataclasses.fields(ProgressConfig)})
    with step_bar(c.steps, "progress model", c.progress) as tick:  # a DatasetError is a ValueError: exit 2
        model, report = fit_progress(root, model_cfg, resolve_device(c.device), tick, c.dataset.timing_check)
    model.save(run_dir)
    (run_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    voc = report.get("held_out_voc")
    plot_curves(report.get("held_out_curves", {}), run_dir / "progress.png",
                f"{root.name}: held-out VOC {voc:.3f}" if voc is not None else root.name)
    print(f"progress model: {report['frames']} frames of {report['episodes']} episodes; VOC train "
          f"{report.get('train_voc', float('nan')):.3f}, held out {voc if voc is None else round(voc, 3)}; "
          f"saved in {run_dir}", file=sys.stderr)
    return run_dir
