"""The README's real-arm improvement loop, end to end through the CLI on the simulated SO-101 (``so101_sim`` and its
leader stand in for the arms): teleoperated demos whose successes the person marks, a BC policy trained on them,
a deploy of it with a take-over and a marked success, recorded, then RECAP on the demos and the take-overs mixed
in place. What must hold: the two recordings mix (our recorder writes one schema for record and deploy), the person's
ticks are the corrections, the marks are the outcomes, and neither dataset is written."""

from __future__ import annotations

import numpy as np

from robot_rl.data.labels import read_sidecar
from tests.real.test_deploy_cli import run_main
from tests.test_lerobot_loader import tree_hash
from tests.test_offline_cli import TINY
from tests.test_recap_cli import TINY_VALUE

# watchdog at 3 s: a late tick in a full `make test` process (tests/real/test_deploy_cli.py says why)
SIM = ["robot=so101_sim", "robot.task=so101_lift", "robot.image_height=32", "robot.image_width=32",
       "safety.watchdog_s=3.0", "realtime=false", "stop_on_success=false", "episode_s=1"]


def test_record_bc_deploy_with_takeovers_then_recap_on_the_mix(tmp_path):
    demos, takeovers = tmp_path / "demos", tmp_path / "takeovers"
    # 3 demos of 30 ticks at most; the person marks success at session tick 20: demo 0 ends at its 21st tick
    assert run_main(["record", *SIM, "teleop=so101_sim_leader", f"dataset.root={demos}", "episodes=3",
                     "success_schedule=[20]"]) == 0
    assert run_main(["offline", f"dataset.root={demos}", f"run_dir={tmp_path / 'bc'}", "steps=3", *TINY]) == 0
    # the BC policy drives; the person takes over ticks 10..19 of episode 0; success marked at session tick 45
    # (episode 1's 16th tick)
    assert run_main(["deploy", *SIM, f"checkpoint={tmp_path / 'bc'}", "teleop=so101_sim_leader", "takeover=schedule",
                     "takeover_schedule=[10,20]", f"dataset.root={takeovers}", "episodes=2",
                     "success_schedule=[45]"]) == 0
    before = {p: tree_hash(p) for p in (demos, takeovers)}
    run = tmp_path / "recap"
    assert run_main(["offline", "algo=recap", f"dataset.root={demos}", f"dataset.mix=[{takeovers}]",
                     f"run_dir={run}", "steps=3", *TINY, *TINY_VALUE]) == 0
    assert {p: tree_hash(p) for p in (demos, takeovers)} == before
    labels, _ = read_sidecar(run / "labels")
    eps = labels.episode_index
    lengths = [int((eps == e).sum()) for e in range(5)]
    assert lengths == [21, 30, 30, 30, 16]  # demos 0-2, then the take-overs numbered 3 and 4
    # outcomes: demo 0 and take-over 4 were marked (value 0 on their last frame); the untrained policy's take-over 3
    # was not and failed (-1). (so101_sim also reports its own successes, which a real arm would not: the scripted
    # leader solves demos 1 and 2 by itself, so they are not asserted here.)
    last = np.cumsum(lengths) - 1
    np.testing.assert_array_equal(labels.value_target[last[[0, 3, 4]]], [0.0, -1.0, 0.0])
    # corrections: the person's ticks inside the policy's episode (take-over 3, ticks 10..19), not the demos
    corrections = np.flatnonzero(labels.intervention)
    np.testing.assert_array_equal(corrections, sum(lengths[:3]) + np.arange(10, 20))
