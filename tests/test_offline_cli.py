"""``robot-rl offline`` end to end: a dataset written by LeRobot's own ``LeRobotDataset.create`` (SO-101 names, video
cameras) trains the flow VLA, checkpoints resume exactly, the export loads without training code, and bad input
exits 2 with one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from policies import keys, load_policy
from robot_rl.checkpoint import POLICY_DIR, load_checkpoint
from robot_rl.cli.main import main
from tests.test_lerobot_loader import make_dataset

TINY = ["algo.policy.conv_channels=[8,8]", "algo.policy.conv_strides=[2,2]", "algo.policy.image_feature_dim=16",
        "algo.policy.hidden_dim=32", "algo.policy.num_blocks=1", "algo.policy.text_dim=8", "algo.policy.time_dim=8",
        "algo.policy.horizon=4", "algo.policy.executed_steps=2", "algo.policy.num_steps=2", "dataset.batch_size=8",
        "dataset.progress=false", "logger.progress=false", "logger.tensorboard=false", "updates_per_iteration=3"]


@pytest.fixture(scope="module")
def lerobot_dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("lerobot") / "so101_demo")


def _offline(root: Path, run_dir: Path, *extra: str) -> int:
    return main(["offline", f"dataset.root={root}", f"run_dir={run_dir}", *TINY, *extra])


def test_a_lerobot_dataset_trains_through_robot_rl_offline_and_the_export_acts(lerobot_dataset, tmp_path):
    assert _offline(lerobot_dataset, tmp_path / "run", "steps=6",
                    "algo.policy.executed_steps_by_task={pick up the cube:3}") == 0  # the Hydra form of a map
    ckpt = load_checkpoint(tmp_path / "run")
    assert ckpt.meta["updates"] == 6 and ckpt.meta["dataset"]  # the data's fingerprint, checked on resume
    policy = load_policy(ckpt.path / POLICY_DIR)  # no training code needed
    assert policy.type_name == "flow_vla" and policy.cfg.cameras == ["front", "wrist"]
    assert policy.executed_steps_for("Pick up the cube.") == 3 and policy.executed_steps_for("other") == 2
    frame = {keys.OBS_STATE: torch.zeros(3, 6), keys.TASK: ["pick up the cube"] * 3,
             **{keys.lerobot_image_key(c): torch.zeros(3, 3, 32, 32, dtype=torch.uint8) for c in ("front", "wrist")}}
    chunk = policy.act(frame)
    assert chunk.shape == (3, 4, 6) and torch.isfinite(chunk).all()


def test_resumed_offline_run_equals_an_uninterrupted_one(lerobot_dataset, tmp_path):
    assert _offline(lerobot_dataset, tmp_path / "straight", "steps=6", "checkpoint_every=1") == 0
    assert _offline(lerobot_dataset, tmp_path / "split", "steps=3", "checkpoint_every=1") == 0
    # resume=RUN alone: the run's own dataset (no dataset.root to repeat)
    assert main(["offline", f"resume={tmp_path / 'split'}", *TINY, "steps=6", "checkpoint_every=1"]) == 0
    a, b = load_checkpoint(tmp_path / "straight"), load_checkpoint(tmp_path / "split")
    assert a.meta["updates"] == b.meta["updates"] == 6
    wa, wb = a.state["algo"]["policy"], b.state["algo"]["policy"]
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_new_run_in_a_folder_holding_a_run_is_refused_and_the_old_run_kept(lerobot_dataset, tmp_path, capsys):
    import hashlib

    from robot_rl.logging import read_curve

    run = tmp_path / "run"
    assert _offline(lerobot_dataset, run, "steps=6", "checkpoint_every=1") == 0
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert _offline(lerobot_dataset, run, "steps=3") == 2  # no resume=: it would mix its curve into the old one's
    err = capsys.readouterr().err
    assert f"run_dir={run} already holds a run" in err and f"resume={run}" in err, err
    assert before == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.rglob("*")) if p.is_file()}
    # a run that stopped before its first checkpoint leaves only a curve: the next run starts its own
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "curve.jsonl").write_text('{"iteration": 7, "updates": 21, "wall_s": 1.0, "loss": 9.0}\n')
    assert _offline(lerobot_dataset, stopped, "steps=3") == 0
    assert [p["iteration"] for p in read_curve(stopped)] == [1]


@pytest.mark.parametrize("overrides, message", [
    ([*TINY, "algo.policy.hiden_dim=3"], "hiden_dim"),
    ([*TINY, "dataset.root=/nonexistent/dataset"], "/nonexistent/dataset"),
    (["algo=ppo"], "algo='ppo'"),
])
def test_bad_input_exits_2_naming_it(lerobot_dataset, tmp_path, capsys, overrides, message):
    code = main(["offline", f"dataset.root={lerobot_dataset}", f"run_dir={tmp_path / 'run'}", "steps=1", *overrides])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


def test_robot_rl_eval_runs_an_offline_policy_on_a_task_it_names(lerobot_dataset, tmp_path, capsys):
    import json

    assert _offline(lerobot_dataset, tmp_path / "run", "steps=3") == 0
    assert main(["eval", f"checkpoint={tmp_path / 'run'}"]) == 2  # trained offline: which task is not known
    assert "task=" in capsys.readouterr().err
    out = tmp_path / "eval"
    code = main(["eval", f"checkpoint={tmp_path / 'run'}", "task=so101_pick", "task.episode_length=6",
                 "num_episodes=2", "num_envs=2", "video=false", f"out_dir={out}",
                 "randomization.light_scale=[0.6,1.2]", "executed_steps=4", "temporal_ensemble=0.01",
                 "mean_of_samples=2", "sample_reduction=medoid", "median_actions=[wrist_roll.pos,gripper.pos]"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "eval.json").read_text())
    result = report["eval"]
    assert result["num_episodes"] == 2 and result["mean_length"] <= 6
    assert report["executed_steps"] == 4  # the policy was trained with 2; this evaluation asked for 4
    assert report["temporal_ensemble"] == 0.01 and report["mean_of_samples"] == 2
    assert report["sample_reduction"] == "medoid"
    assert report["median_actions"] == ["wrist_roll.pos", "gripper.pos"]
    assert report["task"] == "so101_pick" and report["randomization"] == {"light_scale": [0.6, 1.2]}
    # without out_dir: one folder per task; a task of another robot is one line naming why
    assert main(["eval", f"checkpoint={tmp_path / 'run'}", "task=so101_lift", "task.episode_length=4",
                 "num_episodes=1", "num_envs=1", "video=false"]) == 0
    (lift_eval,) = (tmp_path / "run").glob("eval_*_so101_lift")
    assert json.loads((lift_eval / "eval.json").read_text())["task"] == "so101_lift"
    before = (lift_eval / "eval.json").read_bytes()  # another evaluation of it goes next door, overwriting nothing
    assert main(["eval", f"checkpoint={tmp_path / 'run'}", "task=so101_lift", "task.episode_length=4",
                 "num_episodes=1", "num_envs=1", "video=false", "executed_steps=1"]) == 0
    assert (lift_eval / "eval.json").read_bytes() == before
    assert json.loads((lift_eval.with_name(lift_eval.name + "_2") / "eval.json").read_text())["executed_steps"] == 1
    capsys.readouterr()
    assert main(["eval", f"checkpoint={tmp_path / 'run'}", "task=humanoid_walk", "num_episodes=1", "num_envs=1",
                 "video=false"]) == 2
    assert "only the SO-101 tasks give" in capsys.readouterr().err
    assert main(["eval", f"checkpoint={tmp_path / 'run'}", "task=so101_pick", "median_actions=[wrist.pos]"]) == 2
    assert "median_actions names ['wrist.pos']" in capsys.readouterr().err
    assert main(["eval", f"checkpoint={tmp_path / 'run'}", "task=so101_pick", "sample_reduction=mode"]) == 2
    assert "sample_reduction must be one of" in capsys.readouterr().err
    assert main(["eval", f"checkpoint={tmp_path / 'run'}", "task=so101_pick", "mean_of_samples=0"]) == 2
    assert "mean_of_samples=0 must be an int >= 1" in capsys.readouterr().err
    assert main(["eval", f"checkpoint={tmp_path / 'run'}", "task=so101_pick", "executed_steps=5"]) == 2
    assert "executed_steps=5 must be in [1, horizon 4]" in capsys.readouterr().err


def test_eval_executed_steps_replaces_the_policys_own_for_every_task(lerobot_dataset, tmp_path):
    import dataclasses

    from policies.execution import set_executed_steps
    from policies.gaussian import GaussianPolicy, GaussianPolicyConfig

    assert _offline(lerobot_dataset, tmp_path / "run", "steps=1",
                    "algo.policy.executed_steps_by_task={pick up the cube:1}") == 0
    policy = load_policy(load_checkpoint(tmp_path / "run").path / POLICY_DIR)
    assert policy.executed_steps_for("pick up the cube") == 1 and policy.executed_steps_for("other") == 2
    set_executed_steps(policy, 3)
    assert policy.executed_steps_for("pick up the cube") == 3 and policy.executed_steps_for("other") == 3
    assert dataclasses.asdict(policy.cfg)["executed_steps_by_task"] == {}
    with pytest.raises(ValueError, match="for chunking policies"):
        set_executed_steps(GaussianPolicy(GaussianPolicyConfig(obs_dim=3, action_dim=2)), 2)


def test_offline_training_killed_inside_checkpoint_writes_resumes_to_the_same_bits(lerobot_dataset, tmp_path):
    """SIGKILL while a checkpoint is being written (twice), then ``resume=RUN``: each process says where it resumed
    (an update > 0, the last whole checkpoint's), no temporary folder is left, and the final state (weights,
    optimizer moments, the sampler's position) equals an uninterrupted run's bit for bit (RELIABILITY B1)."""
    import re
    import signal
    import subprocess
    import time

    from robot_rl.checkpoint import flatten_tree
    from tests.test_cli import CLI, _latest, _slow_fsync_env

    args = [f"dataset.root={lerobot_dataset}", *TINY, "steps=30", "checkpoint_every=1", "checkpoint.keep_last=2"]
    assert main(["offline", *args, f"run_dir={tmp_path / 'straight'}"]) == 0
    run, env, resumed_at = tmp_path / "killed", _slow_fsync_env(tmp_path), []
    ckpts = run / "checkpoints"
    for attempt in range(3):
        where = [f"resume={run}"] if attempt else [f"run_dir={run}"]
        proc = subprocess.Popen([*CLI, "offline", *args, *where], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        if attempt < 2:  # a new checkpoint of this process first, then kill the moment the next one's write began
            before, deadline = _latest(run), time.monotonic() + 240
            while proc.poll() is None and time.monotonic() < deadline and _latest(run) == before:
                time.sleep(0.001)
            while proc.poll() is None and time.monotonic() < deadline and not any(ckpts.glob(".tmp-iter_*")):
                time.sleep(0.001)
            assert proc.poll() is None, "the run ended before a kill could land in a checkpoint write"
            assert any(ckpts.glob(".tmp-iter_*")), "no checkpoint write began within the deadline"
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
        if attempt:
            said = re.search(r"resumed from (\S+) at update (\d+)", err)
            assert said and int(said[2]) > 0, err[-2000:]
            resumed_at.append(int(said[2]))
    assert proc.returncode == 0, err[-2000:]
    assert not list(ckpts.glob(".tmp-*"))
    a, b = load_checkpoint(tmp_path / "straight"), load_checkpoint(run)
    assert a.meta["updates"] == b.meta["updates"] == 30 and a.path.name == b.path.name
    ta, _ = flatten_tree(a.state)
    tb, _ = flatten_tree(b.state)
    assert ta.keys() == tb.keys()
    assert not [k for k in ta if not torch.equal(ta[k], tb[k])]
    assert any("optimizer" in k for k in ta) and any("policy" in k for k in ta)
