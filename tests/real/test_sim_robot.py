"""``so101_sim`` and ``so101_sim_leader``: LeRobot's Robot / Teleoperator interfaces on our MuJoCo SO-101, with the
follower's features and units, the follower's goal capping, scene resets, physical overrides and latency, and a
leader whose scripted expert solves the scene through LeRobot's units."""

from __future__ import annotations

import gc
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot.robots import make_robot_from_config
from lerobot.robots.so_follower import SO101Follower, SO101FollowerConfig
from lerobot.teleoperators import make_teleoperator_from_config
from lerobot.utils.errors import DeviceNotConnectedError

from real import features
from real.sim_robot import SO101SimRobot, SO101SimRobotConfig
from real.sim_teleop import SO101SimLeader, SO101SimLeaderConfig
from sim import so101


def _robot(tmp_path: Path, **kw) -> SO101SimRobot:
    kw.setdefault("camera_names", [])
    return SO101SimRobot(SO101SimRobotConfig(calibration_dir=tmp_path / "cal", **kw))


def _leader(tmp_path: Path, **kw) -> SO101SimLeader:
    return SO101SimLeader(SO101SimLeaderConfig(calibration_dir=tmp_path / "cal_leader", **kw))


@pytest.fixture(autouse=True)
def _no_robots_left():
    yield
    gc.collect()  # robots of one test must not be found by the next test's leader


def _sim_deg(robot: SO101SimRobot) -> np.ndarray:
    """The simulator's joint positions in degrees [6], read past the robot's API."""
    q = robot.view.arm.qpos(robot.view.env.physics.state.qpos)[0]
    return so101.rad_to_deg(q.double()).numpy()


def test_features_are_the_so101_followers_and_lerobot_builds_it_by_name(tmp_path):
    follower = SO101Follower(SO101FollowerConfig(port="/dev/null", calibration_dir=tmp_path / "f"))
    robot = make_robot_from_config(SO101SimRobotConfig(calibration_dir=tmp_path / "cal", image_height=24,
                                                       image_width=32))
    assert type(robot) is SO101SimRobot and robot.name == "so101_sim"
    assert robot.action_features == follower.action_features
    assert {k: v for k, v in robot.observation_features.items() if v is float} == follower.observation_features
    assert robot.observation_features["front"] == (24, 32, 3) and robot.observation_features["wrist"] == (24, 32, 3)
    assert not robot.is_connected and robot.is_calibrated


def test_observation_units_degrees_and_gripper_0_100_of_the_simulated_joints(tmp_path):
    robot = _robot(tmp_path, camera_names=["front", "wrist"], image_height=24, image_width=32)
    robot.connect()
    obs = robot.get_observation()
    q = _sim_deg(robot)
    body = np.array([obs[f] for f in features.POS_FEATURES[:5]])
    np.testing.assert_allclose(body, q[:5], atol=1e-4)
    # gripper: 0..100 over the model's range -10 deg .. 100 deg
    assert obs["gripper.pos"] == pytest.approx((q[5] + 10.0) / 110.0 * 100.0, abs=1e-3)
    assert 0.0 <= obs["gripper.pos"] <= 100.0
    for cam in ("front", "wrist"):
        img = obs[cam]
        assert img.shape == (24, 32, 3) and img.dtype == np.uint8 and img.std() > 1.0  # a rendered scene
    assert robot.instruction == "Pick up the red cube and lift it."
    robot.disconnect()
    assert not robot.is_connected
    with pytest.raises(DeviceNotConnectedError):
        robot.get_observation()


def test_connect_warms_up_the_renderer_and_a_step_and_leaves_the_scene_as_seeded(tmp_path, monkeypatch):
    """connect() renders once and steps once (their one-off set-up costs, ~0.5 s here, would otherwise fall in a
    control loop's first tick: the watchdog tripped and the first episode was flagged late), then resets with the
    seed: the first observation and the whole scene equal those of a robot that skipped the warm-up."""
    from sim.lerobot_view import LeRobotView

    calls = {"step": 0, "render_many": 0}
    for name in calls:
        method = getattr(LeRobotView, name)

        def counted(self, *a, _m=method, _n=name, **kw):
            calls[_n] += 1
            return _m(self, *a, **kw)

        monkeypatch.setattr(LeRobotView, name, counted)
    kw = {"camera_names": ["front", "wrist"], "image_height": 24, "image_width": 32, "task": "so101_lift", "seed": 3}
    warm = _robot(tmp_path / "a", **kw)
    warm.connect()
    warm_calls = dict(calls)
    calls.update(step=0, render_many=0)
    monkeypatch.setattr(SO101SimRobot, "_warm_up", lambda self, seed: None)
    cold = _robot(tmp_path / "b", **kw)
    cold.connect()
    assert warm_calls["step"] == calls["step"] + 1 and warm_calls["render_many"] > calls["render_many"]
    assert warm.scene_index == cold.scene_index == 0
    assert torch.equal(warm.view.env.physics.state.qpos, cold.view.env.physics.state.qpos)  # the cube's pose too
    a, b = warm.get_observation(), cold.get_observation()
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    warm.disconnect()
    cold.disconnect()


def test_send_action_caps_goals_like_the_follower_and_the_arm_reaches_them(tmp_path):
    robot = _robot(tmp_path, max_relative_target=5.0)
    robot.connect()
    obs = robot.get_observation()
    present = {k: obs[k] for k in features.POS_FEATURES}
    goal = dict(present, **{"shoulder_pan.pos": present["shoulder_pan.pos"] + 30.0})
    sent = robot.send_action(goal)
    assert sent["shoulder_pan.pos"] == pytest.approx(present["shoulder_pan.pos"] + 5.0)  # |goal - present| <= 5
    assert sent["elbow_flex.pos"] == pytest.approx(present["elbow_flex.pos"])
    robot.disconnect()

    robot = _robot(tmp_path)  # no cap: the servos move toward the goal at their own speed
    robot.connect()
    goal = {k: robot.get_observation()[k] for k in features.POS_FEATURES}
    start = goal["shoulder_pan.pos"]
    goal["shoulder_pan.pos"] = start + 20.0
    for _ in range(40):
        assert robot.send_action(goal)["shoulder_pan.pos"] == pytest.approx(start + 20.0)
    assert robot.get_observation()["shoulder_pan.pos"] == pytest.approx(start + 20.0, abs=1.0)
    assert robot.scene_step == 40


def test_missing_motors_hold_their_goal_and_bad_goals_write_nothing(tmp_path):
    robot = _robot(tmp_path)
    robot.connect()
    obs = robot.get_observation()
    sent = robot.send_action({"shoulder_pan.pos": obs["shoulder_pan.pos"] - 15.0, "not_a_motor": 1})
    assert list(sent) == ["shoulder_pan.pos"]
    for _ in range(30):
        robot.send_action({"shoulder_pan.pos": obs["shoulder_pan.pos"] - 15.0})
    after = robot.get_observation()
    assert after["shoulder_pan.pos"] == pytest.approx(obs["shoulder_pan.pos"] - 15.0, abs=1.0)
    assert after["elbow_flex.pos"] == pytest.approx(obs["elbow_flex.pos"], abs=1.0)  # held at its start goal
    steps = robot.scene_step
    with pytest.raises(ValueError, match="elbow_flex.pos"):
        robot.send_action({"shoulder_pan.pos": 0.0, "elbow_flex.pos": float("nan")})
    with pytest.raises(KeyError, match="elbow.pos"):
        robot.send_action({"elbow.pos": 0.0})
    assert robot.scene_step == steps  # nothing written, no step


def test_reset_scene_and_a_pause_start_new_scenes(tmp_path):
    robot = _robot(tmp_path, idle_reset_s=0.2, seed=3)
    robot.connect()
    first = _sim_deg(robot).copy()
    goal = robot.get_observation()
    goal = {k: goal[k] + (25.0 if k == "shoulder_pan.pos" else 0.0) for k in features.POS_FEATURES}
    for _ in range(10):
        robot.send_action(goal)
    assert robot.scene_index == 0 and abs(_sim_deg(robot)[0] - first[0]) > 10.0
    robot.get_observation()  # calls within idle_reset_s: the same scene
    time.sleep(0.3)  # a slow policy between reading and acting: the same scene
    robot.send_action(goal)
    robot.get_observation()
    assert robot.scene_index == 0
    time.sleep(0.3)
    robot.get_observation()  # a pause longer than idle_reset_s: a person reset the scene
    assert robot.scene_index == 1 and robot.scene_step == 0
    assert abs(_sim_deg(robot)[0] - first[0]) < 5.0  # home again (within the reset's joint noise)
    time.sleep(0.3)
    robot.get_observation()  # no step since the reset: nothing to reset
    assert robot.scene_index == 1
    robot.reset_scene(seed=3)
    np.testing.assert_allclose(_sim_deg(robot), first, atol=1e-9)  # the same seed, the same scene
    assert robot.scene_index == 2

    timed = _robot(tmp_path, time_limit_steps=3, idle_reset_s=None)
    timed.connect()
    for _ in range(3):
        timed.send_action(goal)
    assert timed.scene_index == 0 and timed.scene_step == 3
    timed.send_action(goal)  # the task timed out: this action lands in a new scene
    assert timed.scene_index == 1 and timed.scene_step == 1 and timed.total_steps == 4 and timed.scenes_solved == 0


def test_latency_and_physical_overrides_change_the_arm(tmp_path):
    def pan_after(steps: int, **kw) -> float:
        robot = _robot(tmp_path, idle_reset_s=None, **kw)
        robot.connect()
        obs = robot.get_observation()
        goal = {k: obs[k] + (20.0 if k == "shoulder_pan.pos" else 0.0) for k in features.POS_FEATURES}
        for _ in range(steps):
            robot.send_action(goal)
        moved = robot.get_observation()["shoulder_pan.pos"] - obs["shoulder_pan.pos"]
        robot.disconnect()
        return moved

    assert pan_after(2) > 2.0  # the servo starts toward the goal on the first step
    assert abs(pan_after(2, action_latency_steps=2)) < 0.5  # the goal reaches the servos two steps late
    assert pan_after(3, actuator_gain_scale=0.05) < 0.5 * pan_after(3)  # a weak servo lags


def test_the_leader_attaches_to_the_robot_and_its_expert_solves_the_scene(tmp_path):
    with pytest.raises(ConnectionError, match="no so101_sim robot"):
        _leader(tmp_path).connect()
    robot = make_robot_from_config(SO101SimRobotConfig(calibration_dir=tmp_path / "cal", camera_names=[], id="a"))
    leader = make_teleoperator_from_config(SO101SimLeaderConfig(calibration_dir=tmp_path / "l"))
    assert type(leader) is SO101SimLeader and leader.action_features == robot.action_features
    leader.connect()  # before the robot connects, as LeRobot's scripts do
    with pytest.raises(DeviceNotConnectedError, match="not connected"):
        leader.get_action()
    robot.connect()
    assert (robot.total_steps, robot.scenes_solved) == (0, 0)
    success_at = None
    for step in range(120):
        robot.get_observation()
        action = leader.get_action()
        assert set(action) == set(features.POS_FEATURES) and 0.0 <= action["gripper.pos"] <= 100.0 + 1e-6
        robot.send_action(action)
        if robot.task_success():
            success_at = step
            break
    assert success_at is not None, "the scripted expert lifts the cube through LeRobot's units"
    assert robot.scenes_solved == 1 and robot.total_steps == robot.scene_step == success_at + 1
    for _ in range(3):  # still solved: the same scene counts once
        robot.get_observation()
        robot.send_action(leader.get_action())
    assert robot.task_success() and robot.scenes_solved == 1 and robot.total_steps == success_at + 4
    robot.reset_scene()
    for _ in range(120):
        robot.get_observation()
        robot.send_action(leader.get_action())
        if robot.task_success():
            break
    assert robot.scenes_solved == 2 and robot.scene_index == 1
    assert robot.total_steps == success_at + 4 + robot.scene_step  # counted across scenes
    other = _robot(tmp_path, id="b")
    with pytest.raises(ConnectionError, match="robot_id"):
        _leader(tmp_path).connect()
    chosen = _leader(tmp_path, robot_id="b")
    chosen.connect()
    assert chosen.robot is other
    del other


def test_gripper_conversion_round_trips_and_matches_lerobot_degrees_mode():
    g = features.GripperRange(-10.0, 100.0)
    pct = torch.tensor([0.0, 50.0, 100.0])
    np.testing.assert_allclose(g.to_deg(pct).numpy(), [-10.0, 45.0, 100.0])
    np.testing.assert_allclose(g.to_pct(g.to_deg(pct)).numpy(), pct.numpy(), atol=1e-5)
    real = features.GripperRange.from_calibration(2000, 3400)  # ticks; mid 2700, 360/4095 deg per tick
    assert real.low_deg == pytest.approx(-700 * 360 / 4095) and real.high_deg == pytest.approx(700 * 360 / 4095)
    sim = features.sim_gripper_range()
    assert sim.low_deg == pytest.approx(math.degrees(-0.174533), abs=1e-3)
    assert sim.high_deg == pytest.approx(math.degrees(1.74533), abs=1e-3)
    with pytest.raises(KeyError, match="gripper.pos"):
        features.vector_from_dict({f: 0.0 for f in features.POS_FEATURES[:5]})
    for low, high in ((10.0, 10.0), (20.0, 10.0), (math.nan, 10.0), (0.0, math.inf)):
        with pytest.raises(ValueError, match="GripperRange needs finite low_deg < high_deg"):
            features.GripperRange(low, high)
    with pytest.raises(ValueError, match="range_min < range_max"):
        features.GripperRange.from_calibration(2000, 2000)


def test_camera_images_of_another_shape_or_type_are_refused_naming_the_camera():
    good = np.zeros((4, 5, 3), dtype=np.uint8)
    out = features.images_from_robot({"front": good}, ["front"])
    assert out["observation.images.front"].shape == (1, 3, 4, 5)
    for bad in (np.zeros((4, 5, 4), np.uint8), np.zeros((4, 5), np.uint8), np.zeros((4, 5, 3), np.float32)):
        with pytest.raises(ValueError, match="camera 'front': expected an \\(H, W, 3\\) uint8 image"):
            features.images_from_robot({"front": bad}, ["front"])
