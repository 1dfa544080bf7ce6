"""RELIABILITY A10, the kill half: a process killed while it saves an arm's calibration leaves the old file or the new
one, whole (``real.calibration_file``, installed into LeRobot's own save by robot-rl's plugins)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from real import calibration_file
from real.safety import load_calibration_file
from tests.real._arm import CALIBRATION, follower

IDS = {m: c["id"] for m, c in CALIBRATION.items()}


def _calibrations():
    from lerobot.motors import MotorCalibration

    old = {m: MotorCalibration(**c) for m, c in CALIBRATION.items()}
    new = {m: MotorCalibration(**{**c, "range_max": c["range_max"] - 7, "homing_offset": -c["homing_offset"]})
           for m, c in CALIBRATION.items()}
    return old, new


def _leader(tmp_path):
    from lerobot.teleoperators.so_leader import SO101Leader, SO101LeaderConfig

    return SO101Leader(SO101LeaderConfig(port="/dev/sim-leader", id="arm", calibration_dir=tmp_path / "leader"))


def _kill_while_saving(device, kills: int, seed: int) -> list[str]:
    """Fork ``kills`` children that save ``device``'s calibration in a loop, alternating two versions, and SIGKILL each
    after a random 0-15 ms; after each kill the file must load (strictly) and be one of the two. Returns the versions
    found, in order."""
    old, new = _calibrations()
    texts = {calibration_file.calibration_json(c): name for c, name in ((old, "old"), (new, "new"))}
    rng = random.Random(seed)
    found = []
    for _ in range(kills):
        pid = os.fork()
        if pid == 0:  # the child: saves until killed, never returns into pytest
            try:
                i = 0
                while True:
                    device.calibration = new if i % 2 == 0 else old
                    device._save_calibration()
                    i += 1
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, 0.015))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        text = device.calibration_fpath.read_text()
        assert text in texts, f"after a kill the calibration file holds neither version: {text[:120]!r}"
        load_calibration_file(device.calibration_fpath, IDS)  # whole and valid
        found.append(texts[text])
    return found


@pytest.mark.parametrize("kind", ["follower", "leader"])
def test_a10_a_kill_during_calibration_save_leaves_the_old_or_the_new_file(tmp_path, kind):
    """100 kills at random instants of LeRobot's own save (SO-101 follower and leader, as robot-rl's plugins leave
    it): the file is always one version whole; both versions are seen (the kills land mid-loop); the temporaries
    the killed writers left go with the next save."""
    calibration_file.install()
    device = follower(tmp_path)[0] if kind == "follower" else _leader(tmp_path)
    old, _ = _calibrations()
    device.calibration = old
    device._save_calibration()
    found = _kill_while_saving(device, 100, seed=7)
    assert {"old", "new"} <= set(found)
    device.calibration = old
    device._save_calibration()
    folder = device.calibration_fpath.parent
    assert sorted(p.name for p in folder.iterdir()) == [device.calibration_fpath.name]


def test_the_atomic_save_writes_what_lerobot_writes(tmp_path):
    """Byte for byte LeRobot's own file, and LeRobot loads it back equal; a calibration that cannot be serialised
    raises before the old file is touched."""
    calibration_file.install()
    robot = follower(tmp_path)[0]
    _, new = _calibrations()
    robot.calibration = new
    lerobot_path = tmp_path / "lerobot.json"
    calibration_file.LEROBOT_SAVE["Robot"](robot, lerobot_path)
    robot._save_calibration()
    assert robot.calibration_fpath.read_bytes() == lerobot_path.read_bytes()
    robot.calibration = {}
    robot._load_calibration()
    assert robot.calibration == new
    before = robot.calibration_fpath.read_bytes()
    robot.calibration = {"shoulder_pan": object()}
    with pytest.raises(Exception):  # noqa: B017 (draccus's own error type)
        robot._save_calibration()
    assert robot.calibration_fpath.read_bytes() == before
    assert json.loads(before)["shoulder_pan"]["range_max"] == CALIBRATION["shoulder_pan"]["range_max"] - 7


def test_robot_rl_plugins_install_the_atomic_save():
    """Importing any one of robot-rl's LeRobot plugins (as LeRobot's CLIs do, lerobot-calibrate included) installs
    it: in a fresh interpreter, each plugin imported with LeRobot's own save restored."""
    code = """
import importlib
from lerobot.robots.robot import Robot
from lerobot.teleoperators.teleoperator import Teleoperator
from real import calibration_file
assert not calibration_file.installed()
originals = (Robot._save_calibration, Teleoperator._save_calibration)
for name in ("lerobot_robot_so101_sim", "lerobot_teleoperator_so101_sim_leader", "lerobot_policy_robot_rl"):
    Robot._save_calibration, Teleoperator._save_calibration = originals
    module = importlib.import_module(name)
    importlib.reload(module)
    assert calibration_file.installed(), name
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
