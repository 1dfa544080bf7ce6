"""What a run shows and leaves behind: a progress bar, TensorBoard (and optional W&B) scalars, the learning
curve (``curve.jsonl`` + ``learning_curve.png``) and mp4 videos. Shared by every runner.

When a write fails (no space left, a read-only disk), the learning curve is essential: ``curve_point`` raises an
``OutputWriteError`` and the run stops naming its last good checkpoint. TensorBoard, the PNG and videos are not:
each warns once and the run goes on without it.
"""

from __future__ import annotations

import json
import logging as _pylogging
import os
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robot_rl.checkpoint import OutputWriteError

log = _pylogging.getLogger(__name__)

CURVE_FILE = "curve.jsonl"
CURVE_PNG = "learning_curve.png"


@dataclass
class LoggerConfig:
    """Where scalars go."""

    progress: bool = True  # tqdm bar on stderr (steps/s, mean return, success rate)
    tensorboard: bool = True  # event files under <run_dir>/tb
    wandb: bool = False  # also log to Weights & Biases (needs the wandb package; offline unless configured)
    wandb_project: str = "robot_rl"  # W&B project name


class RunLogger:
    """Progress bar + scalar sinks + the learning-curve history of one run.

    Args:
        run_dir: the run folder.
        cfg: which sinks.
        total_steps: env steps the run aims at (the bar's total), or None when bounded by time.
        initial_steps: env steps already done (a resumed run).
        config: the run's resolved config (sent to W&B).
    """

    def __init__(self, run_dir: str | Path, cfg: LoggerConfig, total_steps: int | None = None,
                 initial_steps: int = 0, config: dict[str, Any] | None = None) -> None:
        self.run_dir, self.cfg = Path(run_dir), cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._bar = self._writer = self._wandb = None
        if cfg.progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=initial_steps, unit="step", unit_scale=True,
                             dynamic_ncols=True, smoothing=0.1)
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_tensorboard_thread_errors()
            try:
                self._writer = SummaryWriter(str(self.run_dir / "tb"))
            except OSError as e:
                self._tensorboard_failed(e)
        if cfg.wandb:
            try:
                import wandb
            except ImportError:
                log.warning("logger.wandb=true but the wandb package is not installed; W&B logging is off")
            else:
                self._wandb = wandb.init(project=cfg.wandb_project, dir=str(self.run_dir), config=config,
                                         name=self.run_dir.name, resume="allow")

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log scalars at env step ``step`` (TensorBoard tags as given, e.g. ``reward/distance``)."""
        if self._writer is not None:
            try:
                for k, v in values.items():
                    self._writer.add_scalar(k, v, step)
            except OSError as e:  # the event writer's thread failed (a full disk): raised on the next write
                self._tensorboard_failed(e)
        if self._wandb is not None:
            self._wandb.log(dict(values), step=step)

    def progress(self, steps: int, mean_return: float | None, success_rate: float | None) -> None:
        """Advance the bar by ``steps`` env steps and show the rolling episode stats."""
        if self._bar is None:
            return
        self._bar.update(steps)
        post = {}
        if mean_return is not None:
            post["return"] = f"{mean_return:.2f}"
        if success_rate is not None:
            post["success"] = f"{success_rate:.2f}"
        self._bar.set_postfix(post, refresh=False)

    def _tensorboard_failed(self, err: OSError) -> None:
        """TensorBoard is not worth stopping a run for: say so once and log without it."""
        log.warning("TensorBoard is off for the rest of the run: could not write %s (%s)", self.run_dir / "tb",
                    err.strerror or err)
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass  # the same failure, already reported

    # ----------------------------------------------------------------------------------- learning curve
    def curve_point(self, point: dict[str, float]) -> None:
        """Append one point (iteration, env_steps, wall_s, success_rate, mean_return) to ``curve.jsonl``.

        Raises:
            OutputWriteError: the line could not be written (a partial line is skipped by ``read_curve`` and
                dropped by ``truncate_curve`` on resume).
        """
        file = self.run_dir / CURVE_FILE
        try:
            with open(file, "a") as f:
                f.write(json.dumps(point) + "\n")
        except OSError as e:
            raise OutputWriteError(file, e) from e

    def truncate_curve(self, iteration: int) -> None:
        """Drop points after ``iteration`` (a resumed run redoes them); the file is replaced atomically.

        Raises:
            OutputWriteError: the new file could not be written (the old one is kept).
        """
        pts = [p for p in read_curve(self.run_dir) if p.get("iteration", 0) <= iteration]
        tmp = self.run_dir / (CURVE_FILE + ".tmp")
        try:
            tmp.write_text("".join(json.dumps(p) + "\n" for p in pts))
            os.replace(tmp, self.run_dir / CURVE_FILE)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise OutputWriteError(self.run_dir / CURVE_FILE, e) from e

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError as e:
                self._tensorboard_failed(e)
        if self._wandb is not None:
            self._wandb.finish()


@contextmanager
def step_bar(total: int, desc: str, enabled: bool = True) -> Iterator[Callable[[int, float], None]]:
    """A tqdm bar on stderr over ``total`` gradient steps; yields ``tick(step, loss)``, the callback a fitting loop
    calls (the bar moves to ``step`` and shows the loss). Closed when the block ends, raised or not."""
    from tqdm import tqdm

    bar = tqdm(total=total, unit="step", desc=desc, disable=not enabled, file=sys.stderr)

    def tick(step: int, loss: float) -> None:
        bar.update(step - bar.n)
        bar.set_postfix(loss=f"{loss:.4f}")

    try:
        yield tick
    finally:
        bar.close()


class SilentLogger:
    """``RunLogger``'s methods, doing nothing: the logger of a data-parallel rank other than 0 (rank 0 logs the run)."""

    def scalars(self, step: int, values: dict[str, float]) -> None:
        pass

    def progress(self, steps: int, mean_return: float | None, success_rate: float | None) -> None:
        pass

    def curve_point(self, point: dict[str, float]) -> None:
        pass

    def truncate_curve(self, iteration: int) -> None:
        pass

    def close(self) -> None:
        pass


def _quiet_tensorboard_thread_errors() -> None:
    """TensorBoard's event-writer thread keeps a write error for the main thread, which raises it on the next write
    (``RunLogger`` then warns once and drops TensorBoard), and also re-raises it, so ``threading`` prints a traceback
    for a failure already handled. Drop that print, for OSErrors of TensorBoard's threads only."""
    previous = threading.excepthook
    if getattr(previous, "_drops_tensorboard_errors", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if issubclass(args.exc_type, OSError) and type(args.thread).__module__.startswith("tensorboard."):
            return
        previous(args)

    hook._drops_tensorboard_errors = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def read_curve(run_dir: str | Path) -> list[dict[str, float]]:
    f = Path(run_dir) / CURVE_FILE
    if not f.is_file():
        return []
    out = []
    for line in f.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            continue
    return out


def plot_learning_curve(points: list[dict[str, float]], path: str | Path, title: str = "") -> Path | None:
    """PNG with success rate and mean return against env steps (left) and wall-clock minutes (right); with the
    share of steps a person drove where the points have it (a run with ``hil``, whose success rate and return are
    the policy's own episodes').

    Returns None (after a warning) when the file cannot be written: a plot is not worth failing a run for.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any("env_steps" in p for p in points):  # an offline run: its losses against updates and wall-clock
        return _plot_offline_curve(points, path, title, plt)
    rows = [("success_rate", "success rate"), ("mean_return", "mean return")]
    if any("intervention_rate" in p for p in points):
        rows = [("success_rate", "success rate\n(policy alone)"), ("mean_return", "mean return\n(policy alone)"),
                ("intervention_rate", "share of steps\na person drove")]
    fig, axes = plt.subplots(len(rows), 2, figsize=(10, 3 * len(rows)), sharey="row")
    steps = [p["env_steps"] for p in points]
    minutes = [p["wall_s"] / 60 for p in points]
    for row, (key, label) in enumerate(rows):
        ys = [np.nan if p.get(key) is None else p[key] for p in points]
        for col, (xs, xlabel) in enumerate(((steps, "env steps"), (minutes, "wall-clock (min)"))):
            ax = axes[row][col]
            ax.plot(xs, ys)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    return save_figure(fig, path, title, plt)


def _plot_offline_curve(points: list[dict[str, float]], path: str | Path, title: str, plt: Any) -> Path | None:
    """The loss terms of an offline run against gradient updates (left) and wall-clock minutes (right)."""
    names = sorted({k for p in points for k in p if k.startswith("loss")})
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey="row")
    for name in names:
        ys = [p.get(name, np.nan) for p in points]
        axes[0].plot([p["updates"] for p in points], ys, label=name)
        axes[1].plot([p["wall_s"] / 60 for p in points], ys, label=name)
    for ax, xlabel in zip(axes, ("gradient updates", "wall-clock (min)"), strict=True):
        ax.set_xlabel(xlabel)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("training loss")
    axes[0].legend()
    return save_figure(fig, path, title, plt)


def save_figure(fig: Any, path: str | Path, title: str, plt: Any) -> Path | None:
    """Title, lay out and write a learning-curve figure; a write error is a warning (and None), never a failure."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        log.warning("no learning-curve plot: could not write %s (%s)", path, e.strerror or e)
        Path(path).unlink(missing_ok=True)
        return None
    finally:
        plt.close(fig)
    return Path(path)


def _mp4_complete(path: Path) -> bool:
    """Whether the file is a whole mp4: top-level boxes (u32 big-endian size, 4-byte type; size 1: a u64 follows)
    tile it exactly and one is the ``moov`` index, which ffmpeg writes last."""
    data = path.read_bytes()
    pos, kinds = 0, set()
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if size == 1 and pos + 16 <= len(data):
            (size,) = struct.unpack(">Q", data[pos + 8:pos + 16])
        elif size == 0:  # "to the end of the file"
            size = len(data) - pos
        if size < 8:
            return False
        kinds.add(kind)
        pos += size
    return pos == len(data) and b"moov" in kinds


def write_video(frames: torch.Tensor | np.ndarray, path: str | Path, fps: float = 30.0) -> Path:
    """Write uint8 frames [T, 3, H, W] or [T, H, W, 3] to an mp4 (H.264 through imageio-ffmpeg).

    Raises:
        OSError: the file could not be written whole. ffmpeg reports a full disk on stderr only, and imageio does
            not check its exit status, so the finished file is checked instead (and removed when incomplete).
    """
    import imageio.v2 as imageio

    arr = frames.cpu().numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
    if arr.dtype != np.uint8 or arr.ndim != 4:
        raise ValueError(f"frames must be uint8 [T, 3, H, W] or [T, H, W, 3], got {arr.dtype} {arr.shape}")
    if arr.shape[1] == 3 and arr.shape[-1] != 3:
        arr = arr.transpose(0, 2, 3, 1)
    with imageio.get_writer(str(path), fps=fps, codec="libx264", macro_block_size=1, ffmpeg_log_level="error") as w:
        for frame in arr:
            w.append_data(np.ascontiguousarray(frame))
    path = Path(path)
    if not _mp4_complete(path):
        path.unlink(missing_ok=True)
        raise OSError(f"ffmpeg could not finish {path} (its message above says why, e.g. no space left)")
    return path
