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
