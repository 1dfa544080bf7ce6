"""benchmarks/vla_bc.py's choice of executed steps per chunk from validation success, by hand; its DART settings."""

import pytest

from benchmarks.vla_bc import choose_executed_steps, parse_dart


def test_each_task_keeps_the_common_value_unless_another_is_strictly_better():
    # the validation of 2026-12-03 (40 episodes per task): means 0.375 / 0.419 / 0.436 -> 8 is the common value
    sweep = {3: {"reach": 0.400, "lift": 0.35, "push": 0.625, "pick": 0.125},
             4: {"reach": 0.475, "lift": 0.70, "push": 0.400, "pick": 0.100},
             8: {"reach": 0.275, "lift": 0.70, "push": 0.650, "pick": 0.125}}
    best, per = choose_executed_steps(sweep)
    assert best == 8
    # reach: 4 is strictly better; lift (4 = 8) and pick (3 = 8) tie with the common value and keep it
    assert per == {"reach": 4, "lift": 8, "push": 8, "pick": 8}


def test_ties_without_the_common_value_go_to_fewer_steps():
    sweep = {2: {"a": 0.5, "b": 0.1}, 4: {"a": 0.5, "b": 0.2}, 6: {"a": 0.1, "b": 0.9}}
    best, per = choose_executed_steps(sweep)  # means 0.30 / 0.35 / 0.50
    assert best == 6 and per == {"a": 2, "b": 6}  # a: 2 and 4 tie above the common 6: the fewer steps
    sweep = {2: {"a": 0.1}, 4: {"a": 0.6}, 6: {"a": 0.6}}
    assert choose_executed_steps(sweep) == (4, {"a": 4})  # mean tie 4 = 6: fewer steps


def test_dart_tasks_take_their_own_std_and_phases():
    got = parse_dart("0.3,3", "so101_reach,so101_push:0.1:episode,so101_pick:0.2", "approach")
    assert got == {"so101_reach": (0.3, 3, "approach"), "so101_push": (0.1, 3, "episode"),
                   "so101_pick": (0.2, 3, "approach")}
    for bad in ("so101_push:0.1:grasp", "so101_nope", "so101_push:0.1:episode:x"):
        with pytest.raises(ValueError, match="--dart-tasks"):
            parse_dart("0.3,3", bad, "approach")
