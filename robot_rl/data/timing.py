"""Real capture timing of recorded episodes (RELIABILITY.md C4).

LeRobot writes ``timestamp = frame_index / fps`` whatever the loop really did, so a recording whose control loop
stalled (a slow policy step, a camera that blocked, a bus retry) looks perfectly regular on disk, and a policy
trained on it learns from actions that were held for two or five ticks as if they lasted one. ``robot-rl deploy``
therefore also records ``capture_time`` (``keys.CAPTURE_TIME_COL``): seconds from the episode's first read of the
robot to this frame's read, measured. From it:

    a tick is late when its interval exceeds ``late_factor`` periods (1.5 by default);
    an episode is flagged when more than ``late_share`` of its ticks are late (1 %), when any interval exceeds
    ``gap_factor`` periods (3), or when its capture times are not finite or go backwards.

Training loaders leave flagged episodes out by default (``dataset.timing_check``, ``demo_dataset.timing_check``)
and say which; a dataset without the column (simulation, LeRobot's own recordings) has nothing to check.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from policies import keys
from robot_rl.data.lerobot_format import DatasetError, DatasetMeta, read_frames

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimingRule:
    """When an episode's measured capture times make it unfit to train on (RELIABILITY.md C4's defaults)."""

    late_factor: float = 1.5  # a tick is late when its interval exceeds this many periods
    late_share: float = 0.01  # flag the episode when more than this share of its ticks is late
    gap_factor: float = 3.0  # flag the episode when any interval exceeds this many periods

    def __post_init__(self) -> None:
        if not (self.late_factor > 1.0 and 0.0 <= self.late_share < 1.0 and self.gap_factor >= self.late_factor):
            raise ValueError(f"timing rule needs late_factor > 1, 0 <= late_share < 1 and gap_factor >= late_factor, "
                             f"got {self}")


@dataclass(frozen=True)
class EpisodeTiming:
    """What an episode's capture times say: its ticks (intervals between frames), how many were late, the longest
    interval (s), and why it is flagged ("" when it is not)."""

    ticks: int
    late: int
    max_interval_s: float
    reason: str = ""

    @property
    def flagged(self) -> bool:
        return bool(self.reason)


def episode_timing(capture_time: np.ndarray, fps: float, rule: TimingRule = TimingRule()) -> EpisodeTiming:
    """The timing of one episode from its frames' capture times (s, in frame order)."""
    t = np.asarray(capture_time, dtype=np.float64).reshape(-1)
    if not np.isfinite(t).all():
        return EpisodeTiming(max(len(t) - 1, 0), 0, float("nan"), "capture_time is not finite")
    dt = np.diff(t)
    if not len(dt):
        return EpisodeTiming(0, 0, 0.0)
    period = 1.0 / fps
    late = int((dt > rule.late_factor * period).sum())
    longest = float(dt.max())
    if (dt < 0).any():
        reason = f"capture_time goes backwards at frame {int(np.flatnonzero(dt < 0)[0]) + 1}"
    elif longest > rule.gap_factor * period:
        reason = (f"a {longest * 1e3:.0f} ms gap at frame {int(dt.argmax()) + 1} (> {rule.gap_factor:g} periods of "
                  f"{period * 1e3:.1f} ms)")
    elif late > rule.late_share * len(dt):
        reason = (f"{late} of {len(dt)} ticks late (> {rule.late_factor:g} periods; more than "
                  f"{rule.late_share:.0%} allowed)")
    else:
        reason = ""
    return EpisodeTiming(len(dt), late, longest, reason)


def timing_by_episode(episode_index: np.ndarray, capture_time: np.ndarray, fps: float,
                      rule: TimingRule = TimingRule()) -> dict[int, EpisodeTiming]:
    """``episode_timing`` of every episode in frame rows sorted by (episode, frame)."""
    e = np.asarray(episode_index).reshape(-1)
    t = np.asarray(capture_time).reshape(-1)
    cuts = np.flatnonzero(np.diff(e)) + 1
    starts = np.concatenate([[0], cuts]) if len(e) else np.zeros(0, dtype=np.int64)
    ends = np.concatenate([cuts, [len(e)]]) if len(e) else np.zeros(0, dtype=np.int64)
    return {int(e[a]): episode_timing(t[a:b], fps, rule) for a, b in zip(starts, ends, strict=True)}


def drop_late_episodes(meta: DatasetMeta, episodes: np.ndarray, rule: TimingRule = TimingRule(),
                       what: str = "dataset.timing_check") -> np.ndarray:
    """``episodes`` of the dataset ``meta`` without those whose capture times are
    flagged, logging which were left out and why. Unchanged when the dataset has no ``capture_time`` column.

    Raises:
        DatasetError: every episode is flagged (naming ``what``, the switch that trains on them anyway).
    """
    if keys.CAPTURE_TIME_COL not in meta.features or not len(episodes):
        return episodes
    cols = read_frames(meta, episodes, [keys.CAPTURE_TIME_COL]).columns
    timing = timing_by_episode(cols["episode_index"], cols[keys.CAPTURE_TIME_COL], float(meta.fps), rule)
    flagged = {e: tm for e, tm in timing.items() if tm.flagged}
    if not flagged:
        return episodes
    shown = "; ".join(f"episode {e}: {tm.reason}" for e, tm in list(flagged.items())[:5])
    more = f" (and {len(flagged) - 5} more)" if len(flagged) > 5 else ""
    if len(flagged) == len(episodes):
        raise DatasetError(f"dataset {meta.root}: all {len(episodes)} episodes were recorded with late ticks "
                           f"({shown}{more}); set {what}=false to train on them anyway")
    log.warning("dataset %s: leaving out %d of %d episodes recorded with late ticks (%s%s); %s=false keeps them",
                meta.root, len(flagged), len(episodes), shown, more, what)
    return np.asarray([e for e in episodes.tolist() if e not in flagged], dtype=np.int64)


__all__ = ["EpisodeTiming", "TimingRule", "drop_late_episodes", "episode_timing", "timing_by_episode"]
