"""benchmarks/vla_bc.py's choice of executed steps per chunk from validation success, by hand."""

from benchmarks.vla_bc import choose_executed_steps


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
