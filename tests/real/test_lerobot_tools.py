"""LeRobot's own CLIs drive the simulated SO-101 through the installed plugins (``make setup``), with no flags beyond
LeRobot's: ``lerobot-teleoperate`` steps ``so101_sim`` from ``so101_sim_leader``, and ``lerobot-record`` records
episodes that ``robot-rl offline`` trains on."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from policies import load_policy
from robot_rl.checkpoint import POLICY_DIR, load_checkpoint
from robot_rl.cli.main import main
from sim.so101 import LEROBOT_STATE_NAMES

BIN = Path(sys.executable).parent
TINY_VLA = ["algo.policy.conv_channels=[8,8]", "algo.policy.conv_strides=[2,2]", "algo.policy.image_feature_dim=16",
            "algo.policy.hidden_dim=32", "algo.policy.num_blocks=1", "algo.policy.text_dim=8",
            "algo.policy.time_dim=8", "algo.policy.horizon=4", "algo.policy.executed_steps=2",
            "algo.policy.num_steps=2", "dataset.batch_size=8", "dataset.progress=false", "logger.progress=false",
            "logger.tensorboard=false"]
PLUGINS = ("lerobot_robot_so101_sim", "lerobot_teleoperator_so101_sim_leader", "lerobot_policy_robot_rl")
DONE = re.compile(r"disconnected: (\d+) control steps in (\d+) scenes, (\d+) solved")


def _run(args: list[str], tmp_path: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_LEROBOT_HOME=str(tmp_path / "hf_lerobot"), PYTHONUNBUFFERED="1")
    return subprocess.run(args, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def _needs(tool: str) -> Path:
    """LeRobot's CLI ``tool``, with our plugin distributions installed (``make setup``)."""
    exe = BIN / tool
    if not exe.exists():
        pytest.fail(f"{exe} is missing: run `make setup` (LeRobot's CLIs and our plugins)")
    for dist in PLUGINS:
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"the LeRobot plugin {dist} is not installed: run `make setup` (pip install -e plugins/{dist})")
    return exe


def test_lerobot_teleoperate_drives_so101_sim_from_the_simulated_leader(tmp_path):
    proc = _run([str(_needs("lerobot-teleoperate")), "--robot.type=so101_sim", "--teleop.type=so101_sim_leader",
                 "--teleop_time_s=2"], tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    done = DONE.search(out)
    assert done, out[-3000:]
    assert int(done.group(1)) >= 5 and int(done.group(2)) == 1  # it stepped, in one scene
    assert out.count("Teleop loop time") >= 5


def test_lerobot_record_writes_episodes_robot_rl_offline_trains_on(tmp_path):
    root = tmp_path / "demos"
    proc = _run([str(_needs("lerobot-record")), "--robot.type=so101_sim", "--teleop.type=so101_sim_leader",
                 f"--dataset.root={root}", "--dataset.repo_id=local/so101_sim_demos",
                 "--dataset.single_task=Pick up the red cube and lift it.", "--dataset.num_episodes=2",
                 "--dataset.push_to_hub=false", "--dataset.episode_time_s=1.5", "--dataset.reset_time_s=0.3",
                 "--play_sounds=false", "--robot.idle_reset_s=0.1"], tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 2 and info["total_frames"] >= 10 and info["robot_type"] == "so101_sim"
    assert info["features"]["observation.state"]["names"] == list(LEROBOT_STATE_NAMES)
    assert info["features"]["action"]["names"] == list(LEROBOT_STATE_NAMES)
    assert info["features"]["observation.images.front"]["shape"][:2] == [96, 128]
    done = DONE.search(out)
    assert done and int(done.group(2)) >= 2, out[-3000:]  # the second episode began in a new scene

    run = tmp_path / "run"
    assert main(["offline", "algo=bc", f"dataset.root={root}", "steps=5", f"run_dir={run}", *TINY_VLA]) == 0
    ckpt = load_checkpoint(run)
    assert ckpt.meta["updates"] == 5
    policy = load_policy(ckpt.path / POLICY_DIR)
    assert policy.cfg.cameras == ["front", "wrist"] and list(policy.cfg.image_size) == [96, 128]
