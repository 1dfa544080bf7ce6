"""Scores of a value (or progress) model, as pure functions: value-order correlation and success prediction.

- VOC (value-order correlation, GVL's metric): on a successful episode a good value rises with time, so the
  Spearman rank correlation between the predicted values and the frame indices is near 1; VOC is its mean over
  the successful episodes.
- Success AUC: how well the value of an episode's first frame separates successes from failures, the area under the
  ROC curve (the Mann-Whitney probability that a random success scores above a random failure; ties count 1/2).
"""

from __future__ import annotations

import numpy as np


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of x [n], ties sharing their average rank (as ``scipy.stats.rankdata``)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ: the Pearson correlation of the average ranks of x and y [n]; NaN when either is constant or
    n < 2."""
    x, y = np.asarray(x), np.asarray(y)
    if len(x) != len(y):
        raise ValueError(f"spearman: x has {len(x)} values, y {len(y)}")
    if len(x) < 2:
        return float("nan")
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = np.sqrt((rx**2).sum() * (ry**2).sum())
    return float((rx * ry).sum() / den) if den > 0 else float("nan")


def value_order_correlation(values: np.ndarray, episode_index: np.ndarray, frame_index: np.ndarray,
                            success: np.ndarray) -> tuple[float, dict[int, float]]:
    """VOC over successful episodes.

    Args:
        values: predicted V per frame [F].
        episode_index, frame_index: per frame [F].
        success: per frame [F], bool: the frame's episode succeeded (the same for all its frames).

    Returns:
        (the mean of the per-episode Spearman ρ(values, frame_index) over successful episodes with at least two
        frames and a non-constant value — NaN when there is none —, {episode: ρ}).
    """
    values, eps, frames, ok = (np.asarray(a) for a in (values, episode_index, frame_index, success))
    per_episode = {}
    for e in np.unique(eps[ok.astype(bool)]):
        sel = eps == e
        rho = spearman(values[sel], frames[sel])
        if not np.isnan(rho):
            per_episode[int(e)] = rho
    mean = float(np.mean(list(per_episode.values()))) if per_episode else float("nan")
    return mean, per_episode


def success_auc(scores: np.ndarray, success: np.ndarray) -> float:
    """P(score of a random success > score of a random failure) + ½ P(equal); NaN without both kinds."""
    scores, success = np.asarray(scores, dtype=np.float64), np.asarray(success).astype(bool)
    pos, neg = scores[success], scores[~success]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum()
    equal = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * equal) / (len(pos) * len(neg)))
