"""benchmarks/vla_bc.py's choice of how chunks run (steps per chunk, queued or ensembled) from validation success, by
hand; its DART settings."""

import pytest

from benchmarks.vla_bc import Execution, choose_execution, parse_dart

Q3, Q4, Q8 = Execution(3), Execution(4), Execution(8)


def test_each_task_keeps_the_common_value_unless_another_is_strictly_better():
    # the validation of 2026-12-03 (40 episodes per task): means 0.375 / 0.419 / 0.436 -> 8 is the common value
    sweep = {Q3: {"reach": 0.400, "lift": 0.35, "push": 0.625, "pick": 0.125},
             Q4: {"reach": 0.475, "lift": 0.70, "push": 0.400, "pick": 0.100},
             Q8: {"reach": 0.275, "lift": 0.70, "push": 0.650, "pick": 0.125}}
    best, per = choose_execution(sweep)
    assert best == Q8
    # reach: 4 is strictly better; lift (4 = 8) and pick (3 = 8) tie with the common value and keep it
    assert per == {"reach": Q4, "lift": Q8, "push": Q8, "pick": Q8}


def test_ties_without_the_common_value_go_to_fewer_steps_then_to_the_queue():
    q2, q6 = Execution(2), Execution(6)
    sweep = {q2: {"a": 0.5, "b": 0.1}, Q4: {"a": 0.5, "b": 0.2}, q6: {"a": 0.1, "b": 0.9}}
    best, per = choose_execution(sweep)  # means 0.30 / 0.35 / 0.50
    assert best == q6 and per == {"a": q2, "b": q6}  # a: 2 and 4 tie above the common 6: the fewer steps
    assert choose_execution({q2: {"a": 0.1}, Q4: {"a": 0.6}, q6: {"a": 0.6}}) == (Q4, {"a": Q4})  # mean tie
    te2, te4 = Execution(2, 0.01), Execution(4, 0.01)
    assert choose_execution({te4: {"a": 0.6}, Q4: {"a": 0.6}, te2: {"a": 0.5}}) == (Q4, {"a": Q4})  # queue first


def test_ensembled_candidates_compete_per_task():
    # the validation of one training on 2026-12-04 (40 episodes per task; ensembled 2's lift moved from 0.90 to 0.925
    # to break the tie of the means): push is best ensembled every 2 steps, lift and pick queued every 3, reach
    # queued every step (tied with 4: the fewer steps)
    te1, te2, te4 = (Execution(k, 0.01) for k in (1, 2, 4))
    q1, q2 = Execution(1), Execution(2)
    sweep = {q1: {"reach": 0.95, "lift": 0.725, "push": 0.45, "pick": 0.30},
             q2: {"reach": 0.90, "lift": 0.825, "push": 0.525, "pick": 0.60},
             Q3: {"reach": 0.90, "lift": 0.975, "push": 0.55, "pick": 0.95},
             Q4: {"reach": 0.95, "lift": 0.925, "push": 0.525, "pick": 0.90},
             Q8: {"reach": 0.70, "lift": 0.85, "push": 0.80, "pick": 0.75},
             te1: {"reach": 0.85, "lift": 0.875, "push": 0.90, "pick": 0.575},
             te2: {"reach": 0.875, "lift": 0.925, "push": 0.975, "pick": 0.625},
             te4: {"reach": 0.80, "lift": 0.775, "push": 0.825, "pick": 0.625}}
    best, per = choose_execution(sweep)
    assert best == te2  # the best mean: 0.85 vs queued 3's 0.84
    assert per == {"reach": q1, "lift": Q3, "push": te2, "pick": Q3}
    assert te2.label == "2+te" and Q3.label == "3"


def test_dart_tasks_take_their_own_std_and_phases():
    got = parse_dart("0.3,3", "so101_reach,so101_push:0.1:episode,so101_pick:0.2", "approach")
    assert got == {"so101_reach": (0.3, 3, "approach"), "so101_push": (0.1, 3, "episode"),
                   "so101_pick": (0.2, 3, "approach")}
    for bad in ("so101_push:0.1:grasp", "so101_nope", "so101_push:0.1:episode:x"):
        with pytest.raises(ValueError, match="--dart-tasks"):
            parse_dart("0.3,3", bad, "approach")
