"""benchmarks/success_classifier.py's comparison, summary and goals, by hand (nothing trained): a labelled copy scored
against the recording's own next.success, the held-out scores read from a report, and goals computed from them."""

from __future__ import annotations

import numpy as np

from benchmarks.success_classifier import compare_labels, goals, held_out_summary


def test_labels_are_compared_per_episode_and_per_frame():
    episode = np.repeat([0, 1, 2, 3], 5)
    recorded = np.array([0, 0, 1, 1, 1,    0, 0, 0, 0, 0,    0, 1, 1, 1, 1,    0, 0, 0, 1, 1], dtype=bool)
    labelled = np.array([0, 0, 0, 1, 1,    0, 0, 0, 0, 0,    0, 0, 0, 1, 1,    0, 0, 0, 0, 0], dtype=bool)
    out = compare_labels(labelled, recorded, episode)
    assert (out["episodes"], out["successful_episodes"], out["failed_episodes"]) == (4, 3, 1)
    assert (out["labelled_successful_episodes"], out["episodes_right"], out["episode_accuracy"]) == (2, 3, 0.75)
    assert out["episode_confusion"] == {"tp": 2, "fp": 0, "fn": 1, "tn": 1}
    assert out["frame_confusion"] == {"tp": 4, "fp": 0, "fn": 5, "tn": 11}
    assert (out["frame_precision"], out["frame_recall"]) == (1.0, 4 / 9)
    # first labelled frame − first true one, only where both call the episode successful: 3 − 2, 3 − 1
    assert out["onset_lag_frames"] == {"0": 1, "2": 2}
    assert (out["onset_lag_min"], out["onset_lag_max"], out["onset_lag_mean"]) == (1, 2, 1.5)
    # an early label counts negative; a false success breaks precision, not recall
    labelled = recorded.copy()
    labelled[[1, 7]] = True
    out = compare_labels(labelled, recorded, episode)
    assert out["onset_lag_frames"] == {"0": -1, "2": 0, "3": 0} and out["onset_lag_mean"] == -1 / 3
    assert (out["episodes_right"], out["frame_recall"], out["frame_precision"]) == (3, 1.0, 9 / 11)


def report(auc, episode_confusion):
    ep = {"tp": 0, "fp": 0, "fn": 0, "tn": 0, **episode_confusion}
    n = sum(ep.values())
    return {"threshold": 0.5, "consecutive": 3, "train": {"episodes": list(range(45))},
            "held_out": {"frames": 80 * n, "positive_frames": 300, "episodes": list(range(45, 45 + n)), "auc": auc,
                         "precision": 0.954, "recall": 0.946, "episode": ep,
                         "episode_accuracy": (ep["tp"] + ep["tn"]) / n,
                         "onset_error_frames": {"mean": 3.6, "mean_abs": 3.6}, "pr_table": []}}


def test_held_out_summary_counts_episodes_from_the_episode_confusion():
    held = held_out_summary(report(0.998, {"tp": 8, "fn": 2, "tn": 4, "fp": 1}))
    assert (held["episodes"], held["successful_episodes"], held["failed_episodes"]) == (15, 10, 5)
    assert (held["train_episodes"], held["episodes_right"], held["episode_accuracy"]) == (45, 12, 12 / 15)
    assert (held["auc"], held["onset_error_mean_frames"]) == (0.998, 3.6)


def test_goals_are_computed_from_the_measured_numbers():
    out = {"held_out": held_out_summary(report(0.998, {"tp": 10, "tn": 5})),
           "independent": {"episode_accuracy": 19 / 20}}
    auc, acc = goals(out)
    assert (auc["name"], auc["value"], auc["target"], auc["met"]) == ("held_out_frame_auc", 0.998, 0.95, True)
    assert (acc["value"], acc["target"], acc["met"]) == (0.95, 0.95, True)  # at the target: met
    out["held_out"]["auc"], out["independent"]["episode_accuracy"] = 0.949, 18 / 20
    assert [g["met"] for g in goals(out)] == [False, False]
    out["held_out"]["auc"], out["independent"]["episode_accuracy"] = None, None  # one class only: no score
    assert [(g["value"], g["met"]) for g in goals(out)] == [(0.0, False), (0.0, False)]
