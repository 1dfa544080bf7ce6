"""benchmarks/recap.py's bookkeeping: what a variant's name stands for and which value model its goals read."""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.recap import EVAL_SEED, _goals, _variant_overrides, drop_rerun_evals, label_quality
from robot_rl.data.labels import Labels, write_sidecar


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"positive_share": 0.5, "short_n_step": 3, "top_fraction": 0.1,
                                  "smooth_n_step": 10, "smooth_window": 31, **kw})


def test_variant_names_stand_for_their_overrides():
    assert _variant_overrides("recap", _args()) == []
    assert _variant_overrides("recap_balanced", _args()) == ["algo.recap.positive_share=0.5"]
    assert _variant_overrides("recap_balanced_short", _args()) == ["algo.recap.positive_share=0.5",
                                                                    "algo.labels.n_step=3"]
    assert _variant_overrides("recap_balanced_top", _args(top_fraction=0.05)) == [
        "algo.recap.positive_share=0.5", "algo.labels.positive_fraction=0.05"]
    assert _variant_overrides("recap_balanced_smooth", _args()) == [
        "algo.recap.positive_share=0.5", "algo.labels.n_step=10", "algo.labels.smooth_window=31",
        "algo.labels.positive_fraction=0.1"]
    assert _variant_overrides("recap_balanced_episode", _args()) == [  # a window over any whole episode (M = 150)
        "algo.recap.positive_share=0.5", "algo.labels.n_step=10", "algo.labels.smooth_window=301",
        "algo.labels.positive_fraction=0.1"]


def test_a_relabelled_variant_is_judged_with_the_value_model_it_reused():
    """recap_balanced_top fits no value model of its own: its VOC goal is recap_balanced's (it used to be dropped)."""
    def row(success: float) -> dict[str, float]:
        return {"success_mean": success, "success_std": 0.0, "failure_mean": 1.0 - success}

    data = {"summary": {"bc": row(0.1), "recap_balanced_beta2.5": row(0.09), "recap_balanced_top_beta1.5": row(0.2)},
            "value_heldout_runs": {"recap_balanced_s0": {"voc": 0.7}, "recap_balanced_s1": {"voc": 0.9}}}
    goals = {g["name"]: g for g in _goals(data, [1.5, 2.5])}
    assert goals["recap_balanced_top_beta1.5_success_over_bc"]["value"] == 2.0
    assert goals["recap_balanced_top_beta1.5_success_over_bc"]["met"]
    assert goals["recap_balanced_top_beta1.5_failures_over_bc"]["value"] == round(0.8 / 0.9, 4)
    assert goals["value_voc_heldout_successes_recap_balanced"]["value"] == 0.8  # the mean over both seeds


def test_success_over_a_bc_that_never_succeeded_uses_the_rule_of_three():
    def row(success: float) -> dict[str, float]:
        return {"success_mean": success, "success_std": 0.0, "failure_mean": 1.0 - success}

    bc_evals = [{"num_episodes": 100, "success_rate": 0.0}] * 3  # 0 of 300: BC's rate < 3 / 300 = 0.01 at 95 %
    for recap, ratio, met in ((0.8, 80.0, True), (0.01, 1.0, False)):
        data = {"summary": {"bc": row(0.0), "recap_balanced_episode_beta2.5": row(recap)}, "eval": {"bc": bc_evals}}
        goals = {g["name"]: g for g in _goals(data, [2.5])}
        g = goals["recap_balanced_episode_beta2.5_success_over_bc_rule_of_three"]
        assert (g["value"], g["met"]) == (ratio, met)


def test_extending_from_a_later_seed_keeps_the_earlier_seeds_evaluations():
    def ev(seed: int) -> dict[str, float]:
        return {"seed": EVAL_SEED + 1000 * seed, "success_rate": 0.5}

    evals = {"bc": [ev(0), ev(1)], "recap_balanced_beta1.5": [ev(0), ev(1)], "recap_beta1.5": [ev(0), ev(1)],
             "bc_expert": [ev(0)]}
    drop_rerun_evals(evals, ["bc", "recap_balanced"], first_seed=1)
    assert evals == {"bc": [ev(0)], "recap_balanced_beta1.5": [ev(0)], "recap_beta1.5": [ev(0), ev(1)],
                     "bc_expert": [ev(0)]}  # recap_beta is another method than recap_balanced
    drop_rerun_evals(evals, ["bc"], first_seed=0)  # a whole re-run replaces everything of the method
    assert evals["bc"] == [] and evals["bc_expert"] == [ev(0)]


def test_label_quality_by_fifth_of_the_episode(tmp_path):
    """Episode 0 (the expert's, 5 frames, succeeds), episode 1 (degraded, 10 frames, succeeds), episode 2 (degraded, 5
    frames, fails): positive rates per fifth of each episode, counted by hand."""
    eps = np.repeat([0, 1, 2], [5, 10, 5])
    pos = np.array([1, 1, 0, 0, 0] + [0, 0, 0, 0, 0, 0, 1, 1, 0, 1] + [1, 1, 1, 1, 1], dtype=bool)
    target = np.r_[np.linspace(-0.04, 0.0, 5), np.linspace(-0.09, 0.0, 10), np.full(5, -1.0)].astype(np.float32)
    n = len(eps)
    lab = Labels(np.arange(n), eps, np.r_[np.arange(5), np.arange(10), np.arange(5)], np.zeros(n, dtype=int), target,
                 np.zeros(n, np.float32), -np.arange(n, dtype=np.float32) / 8, pos.astype(np.float32), pos,
                 np.zeros(n, bool),
                 {0: 0.5}, {0: 10})
    write_sidecar(lab, tmp_path, {})
    q = label_quality(tmp_path, n_expert=1)
    assert q["positive_rate_by_fifth_expert"] == [1.0, 1.0, 0.0, 0.0, 0.0]
    # episode 1's fifths are frame pairs (0,1) (2,3) (4,5) (6,7) (8,9); the failed episode 2 is left out
    assert q["positive_rate_by_fifth_degraded_successful"] == [0.0, 0.0, 0.0, 1.0, 0.5]
    assert q["expert_share_of_positives"] == 2 / 10
    # values -row / 8: the expert's fifths are its single frames 0..4; episode 1's are the means of row pairs
    assert q["mean_value_by_fifth_expert"] == [0.0, -0.125, -0.25, -0.375, -0.5]
    assert q["mean_value_by_fifth_degraded_successful"] == [-0.6875, -0.9375, -1.1875, -1.4375, -1.6875]
