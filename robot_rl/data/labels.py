"""RECAP's labels of logged frames: value targets, rewards, N-step advantages and the "good action" indicator,
as pure functions over frame arrays, and the sidecar that stores them beside (never inside) a dataset.

Frames are rows sorted by (episode_index, frame_index), as ``ChunkSampler`` holds them; per-frame arrays are [F].
With M the task's max episode length (frames; each task of a multi-task dataset has its own: ``task_scales``) and C
the failure penalty (frames, default M):

    value target   successful episode, first success at frame T (``next.success`` first True there, or as
                   ``LabelConfig``'s outcome settings read it: ``solved_frames``):
                       y_t = −(T − t) / M          for t ≤ T,     0 after T
                   failed episode of L frames:
                       y_t = max(−1, −(L − t + C) / M)   (= −1 for every frame when C = M)
    reward         r_t = −1/M per frame before the first success; 0 at and after it (reaching success ends the
                   cost); a failed episode pays −1/M per frame and −C/M more on its last frame. So Σ_{k≥t} r_k is the
                   unclipped value target: the reward and the value agree.
    advantage      A_t = Σ_{k<N} r_{t+k} + V(o_{t+N}) − V(o_t), rewards and V taken as 0 past the episode's end
                   (no bootstrap across episodes or past a terminal frame); with ``smooth_window`` W > 1, the mean
                   of A over the frames t − W//2 .. t + W//2 of the same episode (those that exist): the advantage
                   of the stretch around t, whose value-model errors partly cancel (one frame's A is the difference
                   of two noisy predictions; the indicator conditions a whole action chunk anyway)
    indicator      I_t = 1[A_t ≥ the ``1 − positive_fraction`` quantile of A over the frames of the same task]
                   (top 30 % positive by default), forced to 1 on correction frames: ``intervention`` frames of an
                   episode in which the policy also acted (a human took over from it there). An episode recorded
                   entirely by a human (teleoperated or scripted demos, which ``robot-rl collect`` tags
                   ``intervention`` throughout, actor=human) is a demonstration, judged by its advantages like any
                   other, so that mixed-quality demos are not all forced positive.

The sidecar (``write_sidecar``): ``labels.parquet`` (one row per frame: index, episode_index, frame_index,
task_index, value_target, reward, value, advantage, advantage_indicator, intervention) and ``labels.json``
(thresholds per task, settings, the dataset's fingerprint) in a folder of the caller's (a run folder).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

LABELS_PARQUET, LABELS_JSON = "labels.parquet", "labels.json"


@dataclass
class LabelConfig:
    """How frames are labelled (units: frames, value units)."""

    n_step: int = 50  # N of the N-step advantage (frames; 50 at 30 Hz in π*0.6)
    positive_fraction: float = 0.3  # share of each task's frames labelled positive (threshold at its quantile)
    # M (frames) of every task not in max_episode_length_by_task; None: each task's longest episode in the data
    max_episode_length: int | None = None
    # instruction -> M (frames) of that task (a multi-task dataset's tasks have their own time limits)
    max_episode_length_by_task: dict[str, int] = field(default_factory=dict)
    fail_penalty: float | None = None  # C (frames) added to a failed episode's remaining steps; None: M
    smooth_window: int = 1  # W (frames, odd): A averaged over a centred window of its episode; 1: per frame
    # Where each episode's outcome is read: a frame is solved where ``success_column`` >= ``success_threshold``.
    # ``next.success`` (bool) is what lerobot-eval and robot-rl collect write; LeRobot's HIL-SERL recorder
    # (gym_manipulator, mode=record) writes no such column but ``next.reward`` = 1.0 on the frame a human (or its
    # reward classifier) flags success, so ``next.reward`` reads those datasets as they are.
    success_column: str = "next.success"
    success_threshold: float = 0.5
    # For data with no outcome column (lerobot-record demos, a DAgger rollout, a real arm's recordings): the episodes
    # (episode_index) that succeeded, each solved on its last frame, every other one failed; or, the other way
    # round, those that failed, every other one solved on its last frame. Either replaces ``success_column``.
    successful_episodes: list[int] | None = None
    failed_episodes: list[int] | None = None
    # Where human corrections are read (frames >= 0.5): ``intervention`` as LeRobot's DAgger rollout and robot-rl
    # write it; a HIL-SERL learner's saved replay buffer has ``complementary_info.is_intervention`` (0.0 / 1.0).
    # A dataset without the column has no corrections.
    intervention_column: str = "intervention"

    def __post_init__(self) -> None:
        if self.n_step < 1:
            raise ValueError(f"labels n_step must be >= 1, got {self.n_step}")
        if self.smooth_window < 1 or self.smooth_window % 2 == 0:
            raise ValueError(f"labels smooth_window must be an odd number >= 1 (a centred window), got "
                             f"{self.smooth_window}")
        if not 0.0 < self.positive_fraction <= 1.0:
            raise ValueError(f"labels positive_fraction must be in (0, 1], got {self.positive_fraction}")
        if self.max_episode_length is not None and self.max_episode_length < 1:
            raise ValueError(f"labels max_episode_length must be >= 1, got {self.max_episode_length}")
        bad = {t: m for t, m in self.max_episode_length_by_task.items() if int(m) < 1}
        if bad:
            raise ValueError(f"labels max_episode_length_by_task must map each instruction to >= 1 frames, got {bad}")
        if self.fail_penalty is not None and self.fail_penalty < 0:
            raise ValueError(f"labels fail_penalty must be >= 0, got {self.fail_penalty}")
        if self.successful_episodes is not None and self.failed_episodes is not None:
            raise ValueError("labels: set successful_episodes or failed_episodes, not both")
        for name in ("successful_episodes", "failed_episodes"):
            listed = getattr(self, name)
            if listed is not None and any(int(e) < 0 for e in listed):
                raise ValueError(f"labels {name} must be episode indices >= 0, got {list(listed)}")

    @property
    def named_episodes(self) -> tuple[str, list[int]] | None:
        """("successful_episodes" or "failed_episodes", the list) when outcomes are given by episode, else None."""
        for name in ("successful_episodes", "failed_episodes"):
            if getattr(self, name) is not None:
                return name, [int(e) for e in getattr(self, name)]
        return None


# ------------------------------------------------------------------------------------------- episodes
def episode_bounds(episode_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row, last row) of each frame's episode, [F] each; rows must be grouped by episode.

    Raises:
        ValueError: an episode's rows are not contiguous.
    """
    eps = np.asarray(episode_index).reshape(-1)
    if len(eps) == 0:
        raise ValueError("no frames to label")
    change = np.flatnonzero(np.diff(eps) != 0) + 1
    starts, ends = np.r_[0, change], np.r_[change - 1, len(eps) - 1]
    if len(np.unique(eps[starts])) != len(starts):
        raise ValueError("frames must be grouped by episode (sorted by episode_index, frame_index)")
    lengths = ends - starts + 1
    return np.repeat(starts, lengths), np.repeat(ends, lengths)


def first_success(episode_index: np.ndarray, success: np.ndarray) -> np.ndarray:
    """Row of the first ``next.success`` frame of each frame's episode, −1 where the episode never succeeds: [F]."""
    succ = np.asarray(success).reshape(-1).astype(bool)
    start, end = episode_bounds(episode_index)
    out = np.full(len(succ), -1, dtype=np.int64)
    for s in np.unique(start):
        hits = np.flatnonzero(succ[s:end[s] + 1])
        if len(hits):
            out[s:end[s] + 1] = s + hits[0]
    return out


def solved_frames(columns: dict[str, np.ndarray], cfg: LabelConfig) -> np.ndarray:
    """[F] bool, True where a frame is solved, by ``cfg``'s outcome: ``columns[cfg.success_column] >=
    cfg.success_threshold``; with ``cfg.successful_episodes``, the last frame of each listed episode; with
    ``cfg.failed_episodes``, the last frame of each episode not listed. Listed episodes that are not among the frames
    (left out by a split or the timing check) play no part; ``robot_rl.data.outcomes.check_outcome_columns`` checks
    the lists against the dataset itself.

    Raises:
        ValueError: the success column is missing.
    """
    eps = np.asarray(columns["episode_index"]).reshape(-1)
    if cfg.named_episodes is not None:
        name, listed = cfg.named_episodes
        _, end = episode_bounds(eps)
        hit = np.isin(eps, np.asarray(listed, dtype=np.int64))
        return (hit if name == "successful_episodes" else ~hit) & (np.arange(len(eps)) == end)
    if cfg.success_column not in columns:
        raise ValueError(f"no {cfg.success_column!r} column among the frames read (algo.labels.success_column)")
    values = np.asarray(columns[cfg.success_column], dtype=np.float64).reshape(-1)
    return values >= cfg.success_threshold


def intervention_frames(columns: dict[str, np.ndarray], cfg: LabelConfig) -> np.ndarray | None:
    """[F] bool, True on the frames ``cfg.intervention_column`` marks (>= 0.5: bools, or 0.0 / 1.0 floats), or None
    when the frames carry no such column (no corrections)."""
    if cfg.intervention_column not in columns:
        return None
    return np.asarray(columns[cfg.intervention_column], dtype=np.float64).reshape(-1) >= 0.5


def max_length(episode_index: np.ndarray, cfg_value: int | None) -> int:
    """M: the configured max episode length, else the longest episode (frames)."""
    if cfg_value is not None:
        return int(cfg_value)
    start, end = episode_bounds(episode_index)
    return int((end - start).max() + 1)


def task_scales(episode_index: np.ndarray, task_index: np.ndarray, tasks: list[str] | None,
                cfg: LabelConfig) -> dict[int, int]:
    """M of each task index among the frames: ``cfg.max_episode_length_by_task`` by the task's instruction (``tasks``
    indexed by task_index), else ``cfg.max_episode_length``, else the longest episode of that task.

    Raises:
        ValueError: an instruction of ``max_episode_length_by_task`` is not among ``tasks`` (a misspelling would
            silently give that task another scale).
    """
    eps, task = np.asarray(episode_index).reshape(-1), np.asarray(task_index).reshape(-1)
    by_task = dict(cfg.max_episode_length_by_task)
    if by_task:
        known = list(tasks or [])
        missing = sorted(set(by_task) - set(known))
        if missing:
            raise ValueError(f"algo.labels.max_episode_length_by_task names {missing}, which the data's instructions "
                             f"{known} do not include")
    out = {}
    for t in np.unique(task).tolist():
        name = tasks[t] if tasks is not None and t < len(tasks) else None
        if name in by_task:
            out[int(t)] = int(by_task[name])
        else:
            out[int(t)] = max_length(eps[task == t], cfg.max_episode_length)
    return out


def frame_scales(task_index: np.ndarray, scales: dict[int, int]) -> np.ndarray:
    """M of each frame [F] float64, its task's (``task_scales``)."""
    task = np.asarray(task_index).reshape(-1).astype(np.int64)
    lookup = np.zeros(max(scales) + 1, dtype=np.float64)
    for t, m in scales.items():
        lookup[t] = m
    return lookup[task]


def value_targets(episode_index: np.ndarray, success: np.ndarray, max_len: int | np.ndarray,
                  fail_penalty: float | None = None) -> np.ndarray:
    """y_t [F] float32 (see the module docstring): −(frames to the first success)/M, failures −(L − t + C)/M, all
    clipped to [−1, 0]. ``max_len``: M, one for every frame or each frame's [F] (``frame_scales``)."""
    max_len = np.asarray(max_len, dtype=np.float64)
    c = max_len if fail_penalty is None else float(fail_penalty)
    start, end = episode_bounds(episode_index)
    first = first_success(episode_index, success)
    rows = np.arange(len(start))
    to_go = np.where(first >= 0, np.maximum(first - rows, 0), (end - rows + 1) + c)
    return np.clip(-to_go / max_len, -1.0, 0.0).astype(np.float32)


def rewards(episode_index: np.ndarray, success: np.ndarray, max_len: int | np.ndarray,
            fail_penalty: float | None = None) -> np.ndarray:
    """r_t [F] float32 consistent with ``value_targets`` (before clipping): Σ_{k ≥ t} r_k = −to_go_t / M (``max_len``
    as there)."""
    max_len = np.asarray(max_len, dtype=np.float64)
    c = max_len if fail_penalty is None else float(fail_penalty)
    start, end = episode_bounds(episode_index)
    first = first_success(episode_index, success)
    rows = np.arange(len(start))
    r = np.where((first >= 0) & (rows >= first), 0.0, -1.0 / max_len)
    r = r - np.where((first < 0) & (rows == end), c / max_len, 0.0)
    return r.astype(np.float32)


def n_step_advantages(values: np.ndarray, reward: np.ndarray, episode_index: np.ndarray, n: int) -> np.ndarray:
    """A_t = Σ_{k<N} r_{t+k} + V_{t+N} − V_t [F] float32, with r and V = 0 past the episode's last frame."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    r = np.asarray(reward, dtype=np.float64).reshape(-1)
    _, end = episode_bounds(episode_index)
    rows = np.arange(len(v))
    csum = np.r_[0.0, np.cumsum(r)]
    stop = np.minimum(rows + n, end + 1)  # exclusive
    ret = csum[stop] - csum[rows]
    boot = np.where(rows + n <= end, v[np.minimum(rows + n, len(v) - 1)], 0.0)
    return (ret + boot - v).astype(np.float32)


def smooth_advantages(advantage: np.ndarray, episode_index: np.ndarray, window: int) -> np.ndarray:
    """[F] float32: the mean of A over rows t − window//2 .. t + window//2 that lie in t's episode (fewer at its
    ends); ``window`` 1 returns A unchanged."""
    adv = np.asarray(advantage, dtype=np.float64).reshape(-1)
    if window == 1:
        return adv.astype(np.float32)
    start, end = episode_bounds(episode_index)
    rows, half = np.arange(len(adv)), window // 2
    lo, hi = np.maximum(rows - half, start), np.minimum(rows + half, end)  # inclusive
    csum = np.r_[0.0, np.cumsum(adv)]
    return ((csum[hi + 1] - csum[lo]) / (hi - lo + 1)).astype(np.float32)


def task_thresholds(advantage: np.ndarray, task_index: np.ndarray, positive_fraction: float) -> dict[int, float]:
    """Per task: the (1 − positive_fraction) quantile of its frames' advantages (linear interpolation, numpy's
    default), so about ``positive_fraction`` of them lie at or above it."""
    adv, tasks = np.asarray(advantage, dtype=np.float64), np.asarray(task_index).reshape(-1)
    return {int(t): float(np.quantile(adv[tasks == t], 1.0 - positive_fraction)) for t in np.unique(tasks)}


def corrections(episode_index: np.ndarray, intervention: np.ndarray) -> np.ndarray:
    """bool [F]: intervention frames of episodes that also hold non-intervention (policy) frames."""
    inter = np.asarray(intervention).reshape(-1).astype(bool)
    start, end = episode_bounds(episode_index)
    csum = np.r_[0, np.cumsum(inter)]
    all_human = (csum[end + 1] - csum[start]) == (end - start + 1)
    return inter & ~all_human


def indicators(advantage: np.ndarray, task_index: np.ndarray, thresholds: dict[int, float],
               intervention: np.ndarray | None = None) -> np.ndarray:
    """I_t = 1[A_t ≥ threshold of its task] or intervention: bool [F]."""
    tasks = np.asarray(task_index).reshape(-1)
    thr = np.array([thresholds[int(t)] for t in tasks], dtype=np.float64)
    out = np.asarray(advantage, dtype=np.float64) >= thr
    if intervention is not None:
        out |= np.asarray(intervention).reshape(-1).astype(bool)
    return out


# ------------------------------------------------------------------------------------------- all labels
@dataclass
class Labels:
    """Every label of a frame table, [F] each, rows as the frames they were computed on."""

    index: np.ndarray  # the dataset's global frame index
    episode_index: np.ndarray
    frame_index: np.ndarray
    task_index: np.ndarray
    value_target: np.ndarray
    reward: np.ndarray
    value: np.ndarray  # V(o_t) predicted by the value model
    advantage: np.ndarray  # the one the indicator thresholds (window-averaged when smooth_window > 1)
    advantage_indicator: np.ndarray  # bool
    intervention: np.ndarray  # bool: correction frames (``corrections``), the ones forced positive
    thresholds: dict[int, float]
    max_episode_length: dict[int, int]  # M of each task index (``task_scales``)

    COLUMNS = ("index", "episode_index", "frame_index", "task_index", "value_target", "reward", "value", "advantage",
               "advantage_indicator", "intervention")

    @property
    def positive_fraction(self) -> float:
        return float(self.advantage_indicator.mean())


def targets_for(columns: dict[str, np.ndarray], success_col: str, cfg: LabelConfig,
                tasks: list[str] | None = None) -> tuple[np.ndarray, dict[int, int]]:
    """(value targets [F], M of each task index) of a frame table ``columns`` (episode_index, task_index and the
    success column); ``tasks``: the instructions by task_index (for ``max_episode_length_by_task``)."""
    eps = columns["episode_index"]
    scales = task_scales(eps, columns["task_index"], tasks, cfg)
    m = frame_scales(columns["task_index"], scales)
    return value_targets(eps, columns[success_col], m, cfg.fail_penalty), scales


def compute_labels(columns: dict[str, np.ndarray], values: np.ndarray, success_col: str, cfg: LabelConfig,
                   intervention_col: str | None = None, tasks: list[str] | None = None) -> Labels:
    """Targets, rewards, advantages and indicators of a frame table (index, episode_index, frame_index,
    task_index, the success column, optionally the intervention column) given predicted values [F]; correction
    frames (``corrections``) are forced positive. ``tasks``: as ``targets_for``'s."""
    eps = np.asarray(columns["episode_index"]).reshape(-1)
    scales = task_scales(eps, columns["task_index"], tasks, cfg)
    m = frame_scales(columns["task_index"], scales)  # each frame's M, for the targets and the rewards alike
    target = value_targets(eps, columns[success_col], m, cfg.fail_penalty)
    r = rewards(eps, columns[success_col], m, cfg.fail_penalty)
    adv = smooth_advantages(n_step_advantages(values, r, eps, cfg.n_step), eps, cfg.smooth_window)
    task = np.asarray(columns["task_index"]).reshape(-1)
    thr = task_thresholds(adv, task, cfg.positive_fraction)
    inter = (corrections(eps, columns[intervention_col]) if intervention_col
             else np.zeros(len(eps), dtype=bool))
    return Labels(np.asarray(columns["index"]).reshape(-1), eps, np.asarray(columns["frame_index"]).reshape(-1),
                  task, target, r, np.asarray(values, dtype=np.float32).reshape(-1), adv,
                  indicators(adv, task, thr, inter), inter, thr, scales)


# ------------------------------------------------------------------------------------------- the sidecar
def write_sidecar(labels: Labels, folder: str | Path, info: dict[str, Any]) -> Path:
    """Write ``labels.parquet`` and ``labels.json`` (thresholds, M, ``info``) into ``folder`` atomically (tmp file,
    fsync, rename; the JSON last). Never point ``folder`` into a dataset: the source stays byte-for-byte as it was."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({c: np.asarray(getattr(labels, c)) for c in Labels.COLUMNS})
    tmp = folder / f".{LABELS_PARQUET}.tmp"
    pq.write_table(table, tmp)
    _fsync_replace(tmp, folder / LABELS_PARQUET)
    meta = {"thresholds": {str(k): v for k, v in labels.thresholds.items()},
            "max_episode_length": {str(k): v for k, v in labels.max_episode_length.items()},
            "frames": len(labels.index),
            "positive_fraction": labels.positive_fraction, **info}
    tmp = folder / f".{LABELS_JSON}.tmp"
    tmp.write_text(json.dumps(meta, indent=2))
    _fsync_replace(tmp, folder / LABELS_JSON)
    return folder


def read_sidecar(folder: str | Path) -> tuple[Labels, dict[str, Any]]:
    """The labels and the JSON of a sidecar folder (FileNotFoundError naming the file when absent)."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    meta = json.loads((folder / LABELS_JSON).read_text())
    table = pq.read_table(folder / LABELS_PARQUET)
    cols = {c: table.column(c).to_numpy() for c in Labels.COLUMNS}
    thr = {int(k): float(v) for k, v in meta["thresholds"].items()}
    m = meta["max_episode_length"]
    if not isinstance(m, dict):  # written before each task had its own M: one for every task
        m = {str(t): m for t in np.unique(cols["task_index"]).tolist()}
    return Labels(**cols, thresholds=thr, max_episode_length={int(k): int(v) for k, v in m.items()}), meta


def _fsync_replace(tmp: Path, path: Path) -> None:
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
