"""benchmarks/dense_rewards.py's summary and goals, by hand: a run that never reached 90 % counts as slower than
every run that did, and a sparse arm past the budget is compared at the budget."""

from __future__ import annotations

from benchmarks.dense_rewards import goals, summary


def runs(*steps):
    return [{"env_steps_to_90": s} for s in steps]


def test_summary_counts_a_miss_as_the_slowest_run():
    assert summary(runs(173_568, None, 231_936)) == {
        "reached_90": "2/3", "env_steps_to_90": [173_568, None, 231_936], "median_env_steps_to_90": 231_936}
    assert summary(runs(10, None, None))["median_env_steps_to_90"] is None  # the median run never got there
    assert summary(runs(5, 1, 3))["median_env_steps_to_90"] == 3


def test_goals_compare_the_medians_and_fall_back_to_the_budget():
    out = {"progress_model": {"held_out_voc": 0.79}, "max_env_steps": 100_000,
           "summary": {"progress": summary(runs(46_080)), "sparse": summary(runs(230_400))}}
    voc, ratio = goals(out)
    assert (voc["value"], voc["met"]) == (0.79, False)
    assert (ratio["value"], ratio["met"]) == (0.2, True)
    out["summary"]["sparse"] = summary(runs(None))
    assert goals(out)[1]["value"] == 0.4608  # 46,080 / the 100 k budget
