"""Our exported policies in LeRobot's deployment path (policy type ``robot_rl``, plugin ``lerobot_policy_robot_rl``):
the calls ``lerobot-rollout`` makes load a flow VLA trained by ``robot-rl offline`` and give our policy's actions in
the robot's units; ``lerobot-rollout`` itself runs it on ``so101_sim``; a proprio-only Gaussian policy maps its
[-1, 1] actions to joint targets; a policy reading privileged task state is refused."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.datasets import aggregate_pipeline_dataset_features, create_initial_features
from lerobot.policies import get_policy_class, make_pre_post_processors
from lerobot.processor import make_default_processors
from lerobot.rollout.inference.sync import SyncInferenceEngine
from lerobot.utils.constants import OBS_STR
from lerobot.utils.feature_utils import build_dataset_frame, combine_feature_dicts, hw_to_dataset_features

from policies import keys, load_policy
from policies.gaussian import GaussianPolicy, GaussianPolicyConfig, default_processor
from real import features
from real.lerobot_policy import export_for_lerobot
from real.lerobot_policy.modeling_robot_rl import RobotRLPolicy
from real.sim_robot import SO101SimRobot, SO101SimRobotConfig
from robot_rl.checkpoint import POLICY_DIR, load_checkpoint
from robot_rl.cli.main import main

TASK = "Pick up the red cube and lift it."
TINY_VLA = ["algo.policy.conv_channels=[8,8]", "algo.policy.conv_strides=[2,2]", "algo.policy.image_feature_dim=16",
            "algo.policy.hidden_dim=32", "algo.policy.num_blocks=1", "algo.policy.text_dim=8",
            "algo.policy.time_dim=8", "algo.policy.horizon=4", "algo.policy.executed_steps=2",
            "algo.policy.num_steps=2", "dataset.batch_size=8", "dataset.progress=false", "logger.progress=false",
            "logger.tensorboard=false"]


@pytest.fixture(scope="module")
def vla_export(tmp_path_factory) -> Path:
    """A tiny flow VLA exported by ``robot-rl offline`` from 2 scripted so101_lift episodes (32x32 cameras)."""
    tmp = tmp_path_factory.mktemp("vla")
    assert main(["collect", "task=so101_lift", "episodes=2", "sim.num_envs=2", "sim.num_threads=1",
                 "task.episode_length=20", "task.image_width=32", "task.image_height=32", "progress=false",
                 f"dataset.root={tmp / 'demos'}"]) == 0
    assert main(["offline", "algo=bc", f"dataset.root={tmp / 'demos'}", "steps=2", f"run_dir={tmp / 'run'}",
                 *TINY_VLA]) == 0
    return load_checkpoint(tmp / "run").path / POLICY_DIR


def _rollout_calls(path: Path, robot: SO101SimRobot) -> SyncInferenceEngine:
    """What ``lerobot-rollout`` builds from ``--policy.path`` (``rollout/context.py``): the config, the policy class
    by type, its saved pipelines with the rollout's overrides, the dataset features, the sync inference engine."""
    cfg = PreTrainedConfig.from_pretrained(path)
    cfg.pretrained_path = path
    policy = get_policy_class(cfg.type).from_pretrained(path, config=cfg)
    pre, post = make_pre_post_processors(cfg, pretrained_path=str(path), preprocessor_overrides={
        "device_processor": {"device": "cpu"}, "rename_observations_processor": {"rename_map": {}}})
    teleop_proc, _, obs_proc = make_default_processors()
    dataset_features = combine_feature_dicts(
        aggregate_pipeline_dataset_features(teleop_proc, create_initial_features(action=robot.action_features)),
        aggregate_pipeline_dataset_features(obs_proc, create_initial_features(observation=robot.observation_features)))
    return SyncInferenceEngine(policy, pre, post, dataset_features, list(robot.action_features), TASK, "cpu",
                               robot.name)


def test_lerobots_deployment_calls_give_our_vla_actions_in_robot_units(vla_export, tmp_path):
    out = export_for_lerobot(vla_export, tmp_path / "lerobot_policy")
    assert json.loads((out / "config.json").read_text())["type"] == "robot_rl"
    robot = SO101SimRobot(SO101SimRobotConfig(calibration_dir=tmp_path / "cal", image_height=32, image_width=32))
    robot.connect()
    engine = _rollout_calls(out, robot)
    assert isinstance(engine._policy, RobotRLPolicy) and engine._policy.kind == "frame"
    engine.reset()
    obs = robot.get_observation()
    hw = hw_to_dataset_features(robot.observation_features, OBS_STR)
    got = [engine.get_action(build_dataset_frame(hw, obs, prefix=OBS_STR)) for _ in range(3)]

    inner = load_policy(vla_export)  # the same observation through our policy, converted by hand
    g = features.sim_gripper_range()
    state = torch.tensor([[obs[f] for f in features.POS_FEATURES]])
    state[0, 5] = g.low_deg + state[0, 5] / 100.0 * (g.high_deg - g.low_deg)
    frame = {keys.OBS_STATE: state, keys.TASK: [TASK],
             **{keys.lerobot_image_key(c): torch.from_numpy(obs[c]).permute(2, 0, 1)[None] for c in ("front", "wrist")}}
    chunk = inner.act(frame)[0]  # [H, 6] degrees
    expected = chunk.clone()
    expected[:, 5] = (chunk[:, 5] - g.low_deg) / (g.high_deg - g.low_deg) * 100.0
    torch.testing.assert_close(got[0], expected[0], atol=1e-3, rtol=0)
    torch.testing.assert_close(got[1], expected[1], atol=1e-3, rtol=0)  # executed_steps=2: the chunk's next step
    torch.testing.assert_close(got[2], expected[0], atol=1e-3, rtol=0)  # then a new chunk (same observation)

    big = SO101SimRobot(SO101SimRobotConfig(calibration_dir=tmp_path / "cal", image_height=48, image_width=64))
    big.connect()  # another camera size: the images are resized to the policy's
    action = _rollout_calls(out, big).get_action(build_dataset_frame(
        hw_to_dataset_features(big.observation_features, OBS_STR), big.get_observation(), prefix=OBS_STR))
    assert action.shape == (6,) and torch.isfinite(action).all()


def test_lerobots_deployment_queues_the_policys_executed_steps_for_the_task(vla_export, tmp_path):
    import shutil
    inner_dir = tmp_path / "per_task"
    shutil.copytree(vla_export, inner_dir)
    cfg_file = inner_dir / "config.json"
    raw = json.loads(cfg_file.read_text())
    raw["executed_steps_by_task"] = {TASK: 1}  # this task: one step per chunk (executed_steps stays 2)
    cfg_file.write_text(json.dumps(raw))
    out = export_for_lerobot(inner_dir, tmp_path / "lerobot_policy")
    robot = SO101SimRobot(SO101SimRobotConfig(calibration_dir=tmp_path / "cal", image_height=32, image_width=32))
    robot.connect()
    engine = _rollout_calls(out, robot)
    engine.reset()
    frame = build_dataset_frame(hw_to_dataset_features(robot.observation_features, OBS_STR),
                                robot.get_observation(), prefix=OBS_STR)
    got = [engine.get_action(frame) for _ in range(2)]
    torch.testing.assert_close(got[1], got[0], atol=1e-3, rtol=0)  # a new chunk's first step, not the next step
    assert engine._policy.n_action_steps == 2 and not engine._policy._pending  # 1 queued from each chunk, used


def _export_with(vla_export: Path, tmp_path: Path, name: str, **cfg_keys) -> Path:
    """The tiny VLA's export with these config keys changed, exported for LeRobot."""
    import shutil
    inner_dir = tmp_path / name
    shutil.copytree(vla_export, inner_dir)
    cfg_file = inner_dir / "config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), **cfg_keys}))
    return export_for_lerobot(inner_dir, tmp_path / f"lerobot_{name}")


def test_lerobots_deployment_blends_chunks_where_the_policy_ensembles(vla_export, tmp_path):
    robot = SO101SimRobot(SO101SimRobotConfig(calibration_dir=tmp_path / "cal", image_height=32, image_width=32))
    robot.connect()
    frame = build_dataset_frame(hw_to_dataset_features(robot.observation_features, OBS_STR),
                                robot.get_observation(), prefix=OBS_STR)
    actions = {}
    for name, keys_ in (("ensembled", {"temporal_ensemble_by_task": {TASK: 0.5}}),  # a chunk every 2 steps, blended
                        ("whole", {"executed_steps_by_task": {TASK: 4}})):  # one chunk's 4 steps, queued
        engine = _rollout_calls(_export_with(vla_export, tmp_path, name, **keys_), robot)
        engine.reset()
        actions[name] = [engine.get_action(frame) for _ in range(3)]
    assert engine._policy._ensembler is None  # the queue ran "whole"
    # The same observation gives the same chunk c each time: steps 0 and 1 are chunk 0's alone; step 2 blends
    # chunk 0's step 2 (weight 1) with chunk 1's step 0 (weight e^-0.5), where a queue of 2 steps would give c[0].
    c, e = actions["whole"], math.exp(-0.5)
    got = actions["ensembled"]
    torch.testing.assert_close(got[0], c[0], atol=1e-3, rtol=0)
    torch.testing.assert_close(got[1], c[1], atol=1e-3, rtol=0)
    torch.testing.assert_close(got[2], (c[2] + e * c[0]) / (1 + e), atol=1e-3, rtol=0)
    assert not torch.allclose(got[2], c[0], atol=1e-2) and not torch.allclose(got[2], c[2], atol=1e-2)


def test_lerobot_rollout_runs_our_vla_on_so101_sim(vla_export, tmp_path):
    out = export_for_lerobot(vla_export, tmp_path / "lerobot_policy")
    root = tmp_path / "rollout"
    env = dict(os.environ, HF_LEROBOT_HOME=str(tmp_path / "hf_lerobot"))
    proc = subprocess.run([str(Path(sys.executable).parent / "lerobot-rollout"), "--strategy.type=episodic",
                           f"--policy.path={out}", "--robot.type=so101_sim", "--robot.image_height=32",
                           "--robot.image_width=32", "--dataset.repo_id=local/rollout_vla", f"--dataset.root={root}",
                           f"--dataset.single_task={TASK}", "--dataset.num_episodes=1", "--dataset.episode_time_s=1.5",
                           "--dataset.reset_time_s=0", "--dataset.push_to_hub=false", "--play_sounds=false",
                           "--return_to_initial_position=false"],
                          check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "Policy loaded: type=robot_rl" in log
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 1 and info["total_frames"] >= 5
    import pyarrow.parquet as pq

    table = pq.read_table(next((root / "data").rglob("*.parquet")))
    actions = np.stack(table.column("action").to_numpy(zero_copy_only=False))
    assert np.isfinite(actions).all() and actions.shape[1] == 6


def test_a_proprio_gaussian_policy_maps_its_actions_through_the_arms_action_mapping(tmp_path):
    torch.manual_seed(0)
    cfg = GaussianPolicyConfig(obs_dim=6, action_dim=6, hidden_dims=[16], obs_key=keys.PROPRIO, normalize_obs=False,
                               output_gain=3.0)
    GaussianPolicy(cfg, default_processor(keys.PROPRIO, 6, 6, False)).save(tmp_path / "gauss")
    out = export_for_lerobot(tmp_path / "gauss", tmp_path / "lerobot_gauss")
    cfg_lr = PreTrainedConfig.from_pretrained(out)
    policy = get_policy_class(cfg_lr.type).from_pretrained(out, config=cfg_lr)
    assert policy.kind == "proprio"
    state = torch.tensor([[10.0, -20.0, 15.0, 30.0, 5.0, 40.0]])  # body degrees, gripper 0..100
    action = policy.select_action({"observation.state": state, "task": ""})
    # by hand: gripper 40 % of [-10, 100] deg = 34 deg; a in [-1, 1] moves each joint by a * 0.08 rad (4.5837 deg),
    # the gripper by a * 0.15 rad (8.5944 deg), from where it is; then the gripper back to 0..100
    q_deg = torch.tensor([10.0, -20.0, 15.0, 30.0, 5.0, 34.0])
    a = load_policy(tmp_path / "gauss").act({keys.PROPRIO: torch.deg2rad(q_deg)[None]})[0].clamp(-1, 1)
    assert a.abs().max() > 0.05  # the policy really moves the arm
    step = torch.tensor([math.degrees(0.08)] * 5 + [math.degrees(0.15)])
    target = q_deg + a * step
    target[5] = (target[5] + 10.0) / 110.0 * 100.0
    torch.testing.assert_close(action[0], target, atol=2e-3, rtol=0)


def test_a_policy_reading_privileged_task_state_is_refused_naming_it(tmp_path):
    cfg = GaussianPolicyConfig(obs_dim=31, action_dim=6, hidden_dims=[8])
    GaussianPolicy(cfg).save(tmp_path / "state_policy")
    with pytest.raises(ValueError, match="'policy'.*privileged"):
        export_for_lerobot(tmp_path / "state_policy", tmp_path / "out")
