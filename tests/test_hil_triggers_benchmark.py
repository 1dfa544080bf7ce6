"""benchmarks/hil_triggers.py's per-episode table, counted by hand on a LeRobot dataset written with LeRobot's API."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.hil_triggers import episode_table
from tests.test_lerobot_loader import make_dataset


def test_the_episode_table_counts_takeovers_successes_and_misses(tmp_path):
    # three episodes of 12, 20 and 15 frames: next.success on each last frame; intervention on odd frames (6, 10 and
    # 7 of them), so the take-over starts at frame 1 of each and no episode is left to the policy
    root = make_dataset(tmp_path / "ds", use_videos=False)
    t = episode_table(root)
    assert [r["takeover_step"] for r in t["per_episode"]] == [1, 1, 1]
    assert t["success_rate"] == 1.0 and t["takeover_rate"] == 1.0 and t["missed_failures"] == 0
    assert t["human_frames"] == 6 + 10 + 7 and t["human_frames_per_episode"] == pytest.approx(23 / 3)
    assert t["robot_frames_per_success"] == pytest.approx(47 / 3) and t["left_to_policy_success_rate"] is None
    assert np.isclose(t["human_frame_share"], 23 / 47)


def test_the_episode_table_tells_recoveries_from_the_person(tmp_path):
    """With an actor column (robot-rl's recordings): the person's frames are the human ones, a recovery's are counted
    apart (runs of recovery frames), and an episode won after a recovery with nobody called in counts as such."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from policies import keys

    features = {keys.OBS_STATE: {"dtype": "float32", "shape": (6,), "names": None},
                keys.ACTION_COL: {"dtype": "float32", "shape": (6,), "names": None},
                keys.SUCCESS_COL: {"dtype": "bool", "shape": (1,), "names": None},
                keys.ACTOR_COL: {"dtype": "int64", "shape": (1,), "names": None}}
    root = tmp_path / "ds"
    ds = LeRobotDataset.create("local/ds", fps=30, features=features, root=root, use_videos=False)
    episodes = [([0, 0, 2, 2, 0, 1, 1, 1, 1, 1], True),  # a recovery, then the person from frame 5: won
                ([0, 2, 2, 0, 2, 0, 0, 0], False),  # two recoveries, lost
                ([0, 2, 2, 0, 0], True)]  # a recovery, then won by the policy alone
    for actors, won in episodes:
        for i, a in enumerate(actors):
            ds.add_frame({keys.OBS_STATE: np.zeros(6, np.float32), keys.ACTION_COL: np.zeros(6, np.float32),
                          keys.SUCCESS_COL: np.array([won and i == len(actors) - 1]),
                          keys.ACTOR_COL: np.array([a]), "task": "lift the cube"})
        ds.save_episode()
    ds.finalize()
    t = episode_table(root)
    assert [r["takeover_step"] for r in t["per_episode"]] == [5, None, None]
    assert [r["recoveries"] for r in t["per_episode"]] == [1, 2, 1]
    assert t["recoveries"] == 4 and t["recovered_episodes"] == 3 and t["human_frames"] == 5
    assert t["recovered_success_alone_rate"] == pytest.approx(1 / 3) and t["missed_failures"] == 1
    assert t["recovery_frame_share"] == pytest.approx(7 / 23) and t["takeovers_per_success"] == 0.5
