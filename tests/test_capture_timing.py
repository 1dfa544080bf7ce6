"""Measured capture times of recorded episodes (RELIABILITY.md C4): the rule against hand-computed intervals, the
arm's loop recording them, and the loaders leaving flagged episodes out by default."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from policies import keys
from robot_rl.data.lerobot_format import DatasetError
from robot_rl.data.timing import TimingRule, episode_timing, timing_by_episode

NAMES = tuple(f"{m}.pos" for m in ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll",
                                   "gripper"))


# ------------------------------------------------------------------------------------------------ the rule
def test_episode_timing_against_hand_computed_intervals():
    # 10 fps: period 100 ms, late above 150 ms, a gap above 300 ms
    on_time = episode_timing(np.array([0.0, 0.1, 0.2, 0.3, 0.4]), 10)
    assert (on_time.ticks, on_time.late, on_time.flagged) == (4, 0, False)
    assert on_time.max_interval_s == pytest.approx(0.1)
    # intervals 100, 100, 160, 100 ms: one late tick of four
    one_late = episode_timing(np.array([0.0, 0.1, 0.2, 0.36, 0.46]), 10)
    assert (one_late.ticks, one_late.late, one_late.flagged) == (4, 1, True)
    assert one_late.reason.startswith("1 of 4 ticks late")
    assert not episode_timing(np.array([0.0, 0.1, 0.2, 0.36, 0.46]), 10, TimingRule(late_share=0.25)).flagged
    # 1 late tick of 101 is within 1 %, of 99 it is not
    assert not episode_timing(np.r_[np.arange(101) * 0.1, 10.0 + 0.16], 10).flagged
    assert episode_timing(np.r_[np.arange(99) * 0.1, 9.8 + 0.16], 10).flagged
    # a single interval of 350 ms (> 3 periods) flags the episode on its own
    gap = episode_timing(np.r_[np.arange(200) * 0.1, 19.9 + 0.35], 10)
    assert gap.late == 1 and gap.reason.startswith("a 350 ms gap at frame 200")
    assert not episode_timing(np.r_[np.arange(200) * 0.1, 19.9 + 0.29], 10, TimingRule(late_share=0.05)).flagged
    # not finite, or backwards
    assert episode_timing(np.array([0.0, np.nan, 0.2]), 10).reason == "capture_time is not finite"
    assert episode_timing(np.array([0.0, 0.1, 0.05]), 10).reason == "capture_time goes backwards at frame 2"
    assert not episode_timing(np.array([0.0]), 10).flagged


def test_timing_by_episode_splits_rows_by_episode():
    e = np.array([3, 3, 3, 5, 5, 8])
    t = np.array([0.0, 0.1, 0.2, 0.0, 0.5, 0.0])
    out = timing_by_episode(e, t, 10)
    assert sorted(out) == [3, 5, 8]
    assert not out[3].flagged and out[5].flagged and out[8].ticks == 0


def test_a_rule_that_cannot_hold_is_refused():
    with pytest.raises(ValueError, match="late_factor"):
        TimingRule(late_factor=1.0)
    with pytest.raises(ValueError, match="gap_factor"):
        TimingRule(late_factor=2.0, gap_factor=1.5)


# ------------------------------------------------------------------------------------------------ the arm's loop
class VirtualTime:
    """``time`` for ``real.robot_env``: perf_counter is a clock that only sleep (or a stall) moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += max(s, 0.0)


def test_the_arms_loop_records_measured_capture_times_and_flags_a_stalled_episode(tmp_path, monkeypatch):
    """Three 30-tick episodes through RobotEnv and run_session on LeRobot's SO-101 follower (fault bus, no faults),
    paced by the ControlClock on a virtual clock; the policy stalls 200 ms on one tick of the second episode. The
    dataset's capture_time column holds the measured read times: 1/30 s apart, and the stall; only the second
    episode comes back flagged, and the loader leaves exactly it out."""
    from real import robot_env
    from real.robot_env import ControlClock, RobotEnv, safe_connect
    from real.safety import SafetyConfig, SafetyFilter, limits_from_robot
    from real.teleop import NeverHuman, PolicyDriver, run_session
    from robot_rl.data.lerobot_format import read_frames, read_meta
    from robot_rl.data.lerobot_loader import ChunkDatasetConfig, ChunkSampler
    from robot_rl.data.recorder import DatasetSpec, EpisodeRecorder, RecorderConfig
    from tests.real._arm import ScriptedPolicy, follower

    clock = VirtualTime()
    monkeypatch.setattr(robot_env, "time", clock)
    robot, _bus = follower(tmp_path, None)
    safety = SafetyFilter(SafetyConfig(), limits_from_robot(robot, 2.0))
    safe_connect(robot, safety)
    ticks = {"n": 0}

    def propose(state, calls):
        ticks["n"] += 1
        if ticks["n"] == 30 + 12:  # the 12th tick of the second episode: frame 12 is read 200 ms after frame 11
            clock.sleep(0.2)
        return state

    rec = EpisodeRecorder(RecorderConfig(root=str(tmp_path / "ds")), DatasetSpec(30, NAMES, {}, capture_time=True), 1,
                          30)
    written = []
    env = RobotEnv(robot, safety, None, max_episode_length=30, clock=ControlClock(30, sleep=True))
    res = run_session(env, PolicyDriver(ScriptedPolicy(propose), safety, robot, env), None, NeverHuman(), rec, None,
                      episodes=3, stop_on_success=False, on_written=written.append)
    rec.close()
    robot.disconnect()

    assert [w.timing.flagged for w in written] == [False, True, False] and res.late_episodes == 1
    assert written[1].timing.reason.startswith("a 200 ms gap at frame 12")
    meta = read_meta(tmp_path / "ds")
    assert meta.features[keys.CAPTURE_TIME_COL]["dtype"] == "float32"
    cols = read_frames(meta, np.arange(3), [keys.CAPTURE_TIME_COL]).columns
    t = cols[keys.CAPTURE_TIME_COL].reshape(3, 30)
    expect = np.arange(30) / 30
    assert np.allclose(t[0], expect, atol=1e-4) and np.allclose(t[2], expect, atol=1e-4)
    assert np.allclose(t[1, :12], expect[:12], atol=1e-4)
    assert t[1, 12] - t[1, 11] == pytest.approx(0.2, abs=1e-4)  # the stall (the tick's deadline long past: no wait)
    assert np.allclose(np.diff(t[1, 12:]), 1 / 30, atol=1e-4)
    # the loader: the stalled episode is left out by default, kept on request
    kept = ChunkSampler(ChunkDatasetConfig(root=str(tmp_path / "ds"), horizon=4, batch_size=8, progress=False))
    assert kept.num_episodes == 2 and kept.timing_dropped == 1
    assert set(kept.indices["episode_index"].tolist()) == {0, 2}
    every = ChunkSampler(ChunkDatasetConfig(root=str(tmp_path / "ds"), horizon=4, batch_size=8, progress=False,
                                            timing_check=False))
    assert every.num_episodes == 3 and every.timing_dropped == 0


# ------------------------------------------------------------------------------------------------ the loaders
def record(root, capture_times, vectors=None):
    """Episodes written through the recorder with the given capture times (one array per episode), no cameras."""
    from robot_rl.data.recorder import DatasetSpec, EpisodeRecorder, RecorderConfig

    spec = DatasetSpec(30, NAMES, {}, vectors=vectors or {}, capture_time=True)
    with EpisodeRecorder(RecorderConfig(root=str(root)), spec, 1, 64) as rec:
        for times in capture_times:
            for i, t in enumerate(times):
                frames = {keys.OBS_STATE: torch.full((1, 6), float(i)), keys.TASK: ["reach"],
                          keys.CAPTURE_TIME_COL: torch.tensor([t])}
                extras = {k: torch.zeros(1, d) for k, d in (vectors or {}).items()}
                rec.add(frames, torch.full((1, 6), float(i)), torch.zeros(1), torch.tensor([i == len(times) - 1]),
                        torch.tensor([i == len(times) - 1]), extras=extras)
    return root


def test_loaders_leave_out_late_episodes_and_say_which(tmp_path, caplog):
    from robot_rl.data.demo_buffer import EpisodeEnds, read_transitions
    from robot_rl.data.lerobot_loader import ChunkDatasetConfig, ChunkSampler

    good = np.arange(20) / 30
    late = good.copy()
    late[10:] += 0.05  # one 83 ms interval: 2.5 periods, late but no gap; 1 of 19 ticks
    vectors = {keys.ENV_STATE_COL: 3, keys.ENV_ACTION_COL: 2}
    root = record(tmp_path / "ds", [good, late, good], vectors)
    with caplog.at_level(logging.WARNING, logger="robot_rl.data.timing"):
        s = ChunkSampler(ChunkDatasetConfig(root=str(root), horizon=2, batch_size=4, progress=False))
    assert s.num_episodes == 2 and set(s.indices["episode_index"].tolist()) == {0, 2}
    assert "leaving out 1 of 3 episodes" in caplog.text and "episode 1: 1 of 19 ticks late" in caplog.text
    assert "dataset.timing_check=false" in caplog.text
    # the state-based demo buffer (FlashSAC's demo_dataset) too
    ends = EpisodeEnds(max_episode_length=100, terminate_on_success=True)
    tr = read_transitions(root, {"policy": 3}, 2, ends)
    assert tr.num_episodes == 2
    assert read_transitions(root, {"policy": 3}, 2, ends, timing_check=False).num_episodes == 3


def test_a_dataset_whose_every_episode_is_late_is_refused_naming_the_switch(tmp_path):
    from robot_rl.data.lerobot_loader import ChunkDatasetConfig, ChunkSampler

    stalled = np.r_[np.arange(10) / 30, 1.0]
    root = record(tmp_path / "ds", [stalled, stalled])
    with pytest.raises(DatasetError, match=r"all 2 episodes were recorded with late ticks.*dataset.timing_check=false"):
        ChunkSampler(ChunkDatasetConfig(root=str(root), horizon=2, batch_size=4, progress=False))
    s = ChunkSampler(ChunkDatasetConfig(root=str(root), horizon=2, batch_size=4, progress=False, timing_check=False))
    assert s.num_episodes == 2


def test_recording_capture_times_needs_them_in_every_frame(tmp_path):
    from robot_rl.data.recorder import DatasetSpec, EpisodeRecorder, RecorderConfig

    rec = EpisodeRecorder(RecorderConfig(root=str(tmp_path / "ds")), DatasetSpec(30, NAMES, {}, capture_time=True), 1)
    frames = {keys.OBS_STATE: torch.zeros(1, 6), keys.TASK: ["reach"]}
    with pytest.raises(ValueError, match="frames lack 'capture_time', which this dataset records"):
        rec.add(frames, torch.zeros(1, 6), torch.zeros(1), torch.tensor([False]), torch.tensor([False]))
    with pytest.raises(ValueError, match="capture_time is not finite"):
        rec.add({**frames, keys.CAPTURE_TIME_COL: torch.tensor([float("nan")])}, torch.zeros(1, 6), torch.zeros(1),
                torch.tensor([False]), torch.tensor([False]))
    rec.close()


def test_appending_to_a_recording_made_without_capture_times_goes_on_without_them(tmp_path, caplog):
    """A dataset recorded before capture times were kept still takes appended episodes from robot-rl deploy: they
    are written in its schema (no capture_time), with a warning, instead of the append being refused."""
    from robot_rl.data.lerobot_format import read_meta
    from robot_rl.data.recorder import DatasetSpec, EpisodeRecorder, RecorderConfig

    root = tmp_path / "ds"

    def one_episode(spec, append):
        with EpisodeRecorder(RecorderConfig(root=str(root), append=append), spec, 1, 8) as rec:
            for i in range(4):
                frames = {keys.OBS_STATE: torch.zeros(1, 6), keys.TASK: ["reach"],
                          keys.CAPTURE_TIME_COL: torch.tensor([i / 30])}
                rec.add(frames, torch.zeros(1, 6), torch.zeros(1), torch.tensor([False]), torch.tensor([i == 3]))

    one_episode(DatasetSpec(30, NAMES, {}), append=False)
    with caplog.at_level(logging.WARNING, logger="robot_rl.data.recorder"):
        one_episode(DatasetSpec(30, NAMES, {}, capture_time=True), append=True)
    assert "recorded without capture_time" in caplog.text
    meta = read_meta(root)
    assert len(meta.episodes["episode_index"]) == 2 and keys.CAPTURE_TIME_COL not in meta.features
