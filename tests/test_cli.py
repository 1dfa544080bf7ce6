"""The ``robot-rl`` command line: train/eval artifacts, clear config errors, resume guard, kill-and-resume."""

import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from robot_rl.checkpoint import LATEST, flatten_tree, load_checkpoint
from robot_rl.cli.main import main
from robot_rl.logging import read_curve

ROBOT_RL = Path(sys.executable).parent / "robot-rl"
CLI = [str(ROBOT_RL)] if ROBOT_RL.exists() else [sys.executable, "-m", "robot_rl.cli.main"]
TINY = ["sim.num_envs=8", "algo.num_steps=8", "algo.policy.hidden_dims=[32,32]", "algo.critic.hidden_dims=[32,32]",
        "logger.progress=false"]
# Bitwise-reproducible runs for the resume tests: deterministic torch, a checkpoint every iteration.
DETERMINISTIC = [*TINY, "deterministic=true", "checkpoint_every=1", "checkpoint.keep_last=2", "eval.enabled=false",
                 "logger.tensorboard=false"]


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """One tiny training run with the end-of-run evaluation, video and curve."""
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    out = _run(["train", *TINY, "total_steps=512", f"run_dir={run_dir}", "checkpoint_every=4", "eval.num_episodes=8",
                "eval.num_envs=8", "eval.video_episodes=1", "eval.width=64", "eval.height=48"])
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


def test_train_writes_checkpoints_eval_video_curve_and_tensorboard(trained_run):
    r = trained_run
    for f in ("eval.json", "policy.mp4", "learning_curve.png", "curve.jsonl", "config.yaml"):
        assert (r / f).is_file() and (r / f).stat().st_size > 0, f
    assert list((r / "tb").glob("events.out.tfevents.*"))
    result = json.loads((r / "eval.json").read_text())
    assert result["eval"]["num_episodes"] == 8 and 0.0 <= result["eval"]["success_rate"] <= 1.0
    assert (r / "checkpoints" / LATEST).read_text() == "iter_00000008"
    ckpt = load_checkpoint(r)
    assert ckpt.meta["env_steps"] == 512 and ckpt.meta["task"] == "so101_reach"
    # the curve splits the wall-clock: the simulator's share grows every iteration and stays below the total
    pts = read_curve(r)
    assert [p["env_steps"] for p in pts] == [64 * i for i in range(1, 9)]
    sims = [p["sim_s"] for p in pts]
    assert all(0.0 < a < b for a, b in itertools.pairwise(sims))
    assert all(p["sim_s"] < p["wall_s"] for p in pts)


def test_eval_command(trained_run, tmp_path, capsys):
    out_dir = tmp_path / "eval"
    assert main(["eval", f"checkpoint={trained_run}", "num_episodes=4", "num_envs=4", "video_episodes=1",
                 "width=64", "height=48", f"out_dir={out_dir}"]) == 0
    result = json.loads((out_dir / "eval.json").read_text())
    assert result["eval"]["num_episodes"] == 4 and result["iteration"] == 8
    assert (out_dir / "policy.mp4").stat().st_size > 0 and (out_dir / "learning_curve.png").is_file()


@pytest.mark.parametrize("override,expected", [
    ("algo.gamma=abc", "algo.gamma"),
    ("algo.schedule=cosine", "algo.schedule must be one of"),
    ("algo.policy.activation=swish", "unknown activation 'swish'"),
    ("+algo.bogus=1", "algo.bogus"),
    ("task=no_such_task", "no_such_task"),
    ("device=tpu", "device='tpu'"),
    ("sim.num_envs=0", "sim.num_envs must be >= 1"),
    ("total_steps=null", "stopping rule"),
    ("sim.randomization.friction=[1.3,0.7]", "randomization.friction must be [low, high]"),
    ("update_threads=0", "update_threads must be >= 1"),
])
def test_bad_config_is_a_clear_error(override, expected, capsys, tmp_path):
    assert main(["train", override, f"run_dir={tmp_path}", "logger.progress=false"]) == 2
    err = capsys.readouterr().err
    assert "error" in err and expected in err, err


@pytest.mark.parametrize("sim", ["mujoco", "mjx", "warp"])
def test_randomization_overrides_reach_the_sim_config(sim):
    """Every field of RandomizationConfig is in the composed config, so plain ``sim.randomization.<field>=`` works."""
    import dataclasses

    from omegaconf import OmegaConf

    from robot_rl.cli.build import compose
    from sim.randomization import RandomizationConfig
    from sim.registry import sim_config_from_dict

    cfg = compose("train", [f"sim={sim}", "sim.randomization.friction=[0.7,1.3]",
                            "sim.randomization.color_scale=[0.5,1.0]"])
    assert set(cfg.sim.randomization) == {f.name for f in dataclasses.fields(RandomizationConfig)}
    dr = sim_config_from_dict(OmegaConf.to_container(cfg.sim, resolve=True)).randomization
    assert dr.friction == [0.7, 1.3] and dr.color_scale == [0.5, 1.0] and dr.mass == [1.0, 1.0]


def test_every_task_option_is_in_its_config():
    """Each task's yaml lists every field of its config dataclass: ``task.<field>=`` works without Hydra's '+'."""
    import dataclasses

    from robot_rl.cli.build import compose
    from sim.registry import _tasks

    for name, (_, cfg_cls) in _tasks().items():
        composed = set(compose("train", [f"task={name}"]).task) - {"name"}
        assert composed == {f.name for f in dataclasses.fields(cfg_cls)}, name


@pytest.mark.parametrize("algo", ["ppo", "flashsac", "flashsac_gpu"])
def test_algo_defaults_come_from_the_dataclasses(algo):
    """An algo yaml holds only overrides: every learner, network and runner field is in the composed config with its
    dataclass default (so ``algo.<field>=`` works without '+'), and a misspelled key is refused, naming it."""
    from hydra.errors import ConfigCompositionException

    from robot_rl.cli.build import CONFIG_DIR, compose
    from robot_rl.cli.schemas import algo_schemas

    name = "flashsac" if algo.startswith("flashsac") else algo
    schema = algo_schemas()[name]
    composed = compose("train", [f"algo={algo}", "task=so101_push"]).algo  # a task without its own recipe (algo_task)
    assert not list((CONFIG_DIR / "algo_task").glob("*_so101_push.yaml"))
    assert set(composed) == set(schema)
    for group in ("policy", "critic", "actor"):
        if group in schema:
            assert set(composed[group]) == set(schema[group]), group
    if algo == "ppo":  # the measured recipe is the default: orthogonal init (faster on so101_reach)
        assert composed.policy.init == "orthogonal" and composed == schema
    for key in [k for k, v in schema.items() if isinstance(v, float)][:3]:
        assert compose("train", [f"algo={algo}", f"algo.{key}=0.5"]).algo[key] == 0.5
    with pytest.raises(ConfigCompositionException, match="algo.entropy_cof"):
        compose("train", [f"algo={algo}", "algo.entropy_cof=0.1"])


def test_a_task_recipe_overrides_the_algorithm_defaults_and_the_command_line_overrides_it():
    """configs/algo_task/<algo>_<task>.yaml applies to that pair only; every such file names a real pair and keys
    the algorithm has (a typo would be refused), and its values are what the pair composes to."""
    import yaml

    from robot_rl.cli.build import CONFIG_DIR, compose
    from robot_rl.cli.schemas import algo_schemas
    from sim.registry import _tasks

    files = sorted((CONFIG_DIR / "algo_task").glob("*.yaml"))
    assert files
    algos = {f.stem for f in (CONFIG_DIR / "algo").glob("*.yaml")}
    for f in files:
        algo, task = next((a, f.stem[len(a) + 1:]) for a in sorted(algos, key=len, reverse=True)
                          if f.stem.startswith(a + "_"))
        assert task in _tasks(), f.name
        composed = compose("train", [f"algo={algo}", f"task={task}"])
        schema = algo_schemas()["flashsac" if algo.startswith("flashsac") else algo]
        raw = yaml.safe_load(f.read_text())
        assert set(raw) <= {"algo", "task"}, f.name  # a recipe sets the learner and, where it must, the task
        for key, value in raw.get("algo", {}).items():
            assert key in schema, (f.name, key)  # the learner's config would refuse it; say which file
            assert composed.algo[key] == value, (f.name, key)
        for key, value in raw.get("task", {}).items():
            assert key in composed.task, (f.name, key)
            if isinstance(value, dict):  # e.g. reward_weights: the recipe's entries, the task's others kept
                assert {**composed.task[key], **value} == dict(composed.task[key]), (f.name, key)
            else:
                assert composed.task[key] == value, (f.name, key)
    assert compose("train", ["task=so101_lift"]).algo.use_clipped_value_loss is False
    assert compose("train", ["task=so101_reach"]).algo.use_clipped_value_loss is False
    assert compose("train", ["task=so101_reach"]).algo.schedule == "fixed"
    assert compose("train", ["task=so101_lift"]).algo.schedule == "fixed"
    assert compose("train", ["task=humanoid_walk"]).algo.schedule == "adaptive"  # rsl_rl's default
    assert compose("train", ["task=humanoid_walk"]).algo.use_clipped_value_loss is True  # rsl_rl's default
    assert compose("train", ["task=so101_lift", "algo.use_clipped_value_loss=true"]).algo.use_clipped_value_loss
    # PPO's lift recipe shapes the reward with the pads' contacts; the task itself, and FlashSAC's lift, do not
    assert compose("train", ["task=so101_lift"]).task.reward_weights.pads == 0.5
    assert compose("train", ["task=so101_lift", "algo=flashsac"]).task.reward_weights.pads == 0.0
    assert compose("train", ["task=so101_lift", "task.reward_weights.pads=0"]).task.reward_weights.pads == 0.0
    # ... and PPO's lift gives the gripper an opening as its action and pulls harder near the cube; FlashSAC's does not
    lift = compose("train", ["task=so101_lift"]).task
    assert (lift.action_mode, lift.reward_weights.near) == ("delta_absolute_gripper", 1.0)
    lift = compose("train", ["task=so101_lift", "algo=flashsac"]).task
    assert (lift.action_mode, lift.reward_weights.near) == ("delta", 0.0)
    # FlashSAC's recipe runs torch on 2 threads (flashsac_threads.json); PPO collects on 1; the command line wins
    assert compose("train", ["algo=flashsac"]).torch_threads == 2
    assert compose("train", ["algo=ppo"]).torch_threads == 1
    assert compose("train", ["algo=flashsac", "torch_threads=1"]).torch_threads == 1


@pytest.mark.parametrize("overrides,expected", [
    (["totl_steps=10"], "unknown config key 'totl_steps' (did you mean 'total_steps'?)"),
    (["+totl_steps=10"], "(did you mean 'total_steps'?)"),  # past Hydra, refused by the schema: the same hint
    (["algo.entropy_cof=0.1"], "unknown config key 'algo.entropy_cof' (did you mean 'algo.entropy_coef'?)"),
    (["task=so101_lift", "task.reward_weights.pad=0.5"], "(did you mean 'task.reward_weights.pads'?)"),
    (["algo.policy.xyz=1"], "the keys under algo.policy are ['hidden_dims',"),  # nothing alike: what stands there
    (["num_envs=3"], "(did you mean 'eval.num_envs' or 'sim.num_envs'"),  # nothing alike here: the key elsewhere
])
def test_a_misspelled_key_is_an_error_naming_it_and_the_key_meant(overrides, expected, capsys):
    """Not Hydra's "use +key=..." (which the schema would refuse next): the key, the one meant, or the keys there."""
    assert main(["train", *overrides]) == 2
    err = capsys.readouterr().err
    assert expected in err and "To append" not in err, err


def test_a_key_of_another_commands_layout_points_to_where_it_stands(capsys):
    """`robot-rl eval` takes its settings at the top level: eval.episodes (train's layout) names num_episodes."""
    assert main(["eval", "checkpoint=x", "eval.episodes=4"]) == 2
    assert "unknown config key 'eval.episodes' (did you mean 'num_episodes'" in capsys.readouterr().err


def test_an_unknown_choice_names_the_real_choices_and_a_missing_setting_is_named(capsys):
    """algo=ppoo: the algo choices, not Hydra's listing with the *_schema entries and its search path; a setting
    without a default (collect's dataset.root) is named with how to give it."""
    assert main(["train", "algo=ppoo"]) == 2
    err = capsys.readouterr().err
    assert "unknown algo 'ppoo' (did you mean 'ppo'?)" in err and "_schema" not in err
    assert "Config search path" not in err and "'bc'" not in err  # train's choices only, not offline's
    assert main(["offline", "algo=bcc", "dataset.root=x"]) == 2
    assert "the algo choices are ['awr', 'bc', 'recap']" in capsys.readouterr().err
    assert main(["collect", "task=so101_lift", "episodes=1"]) == 2
    assert "dataset.root is required" in capsys.readouterr().err


def test_did_you_mean():
    from robot_rl.cli.config import did_you_mean

    assert did_you_mean("gama", ["gamma", "lam"], "algo.") == " (did you mean 'algo.gamma'?)"
    assert did_you_mean("zzz", ["gamma", "lam"]) == ""


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_a_commands_help_prints_its_usage_and_its_composed_config(flag, capsys):
    """``robot-rl train --help`` (what a new user types) shows the command's usage and every key it takes, composed
    with the other overrides given; before, Hydra's override grammar refused ``--help``."""
    assert main(["train", "task=so101_lift", flag, "algo.entropy_coef=0.02"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: robot-rl train")
    assert "algo=ppo|flashsac" in out and "robot-rl collect" not in out  # train's usage lines only
    assert "name: so101_lift" in out and "entropy_coef: 0.02" in out and "total_steps:" in out
    assert main(["eval", flag]) == 0
    assert "robot-rl eval checkpoint=PATH" in capsys.readouterr().out
    assert main(["train", flag, "totl_steps=1"]) == 2  # a misspelled key stays an error
    assert "did you mean 'total_steps'" in capsys.readouterr().err
    assert main(["train", "--hlep"]) == 2  # a mistyped flag: named, not Hydra's grammar error
    assert "unknown flag '--hlep': settings are key=value, and --help lists them" in capsys.readouterr().err


def test_resume_refuses_a_different_task(trained_run, capsys):
    assert main(["train", "task=so101_lift", f"resume={trained_run}", "logger.progress=false"]) == 2
    err = capsys.readouterr().err
    assert "cannot resume" in err and "so101_lift" in err and "obs_spec" in err, err


def test_a_new_run_into_a_finished_runs_folder_is_refused_before_anything_is_written(trained_run, capsys):
    before = {p: p.stat().st_mtime_ns for p in trained_run.rglob("*")}
    assert main(["train", *TINY, f"run_dir={trained_run}", "logger.progress=false"]) == 2
    err = capsys.readouterr().err
    assert f"run_dir={trained_run} already holds a run" in err and f"resume={trained_run}" in err, err
    assert before == {p: p.stat().st_mtime_ns for p in trained_run.rglob("*")}


def test_resume_refuses_a_pickle(tmp_path, capsys):
    (tmp_path / "model.pt").write_bytes(b"\x80\x04K\x01.")
    assert main(["train", f"resume={tmp_path / 'model.pt'}", "logger.progress=false"]) == 2
    assert "only safetensors + JSON" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- kill and resume (B1)
def _latest(run_dir: Path) -> str | None:
    try:
        return (run_dir / "checkpoints" / LATEST).read_text()
    except OSError:
        return None


def _slow_fsync_env(tmp_path: Path) -> dict[str, str]:
    """A sitecustomize that makes every fsync sleep, so kills often land inside checkpoint writes."""
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(
        "import os, time\n_fsync = os.fsync\n"
        "def _slow(fd):\n    time.sleep(0.02)\n    return _fsync(fd)\nos.fsync = _slow\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]))


def _train_with_kills(run_dir: Path, args: list[str], kills: int, seed: int, env: dict[str, str],
                      in_write: bool = False) -> tuple[int, int]:
    """Run to completion, SIGKILLing it ``kills`` times at random moments after some progress (``in_write``: the
    moment the next checkpoint write has started), resuming each time with ``resume=RUN`` alone (the run folder
    comes from the checkpoint). Returns (kills done, kills that hit an unfinished checkpoint write).

    Each resumed process must say it resumed from the latest checkpoint at that checkpoint's iteration (> 0), keep
    the learning curve up to it untouched and append only the iterations after it: a run that silently started
    over would end in the same bits (seeded runs overwrite the same checkpoints), but not pass these."""
    rng = random.Random(seed)
    done = inside = 0
    cwd = run_dir.parent / "cwd"  # resumed runs must not create a new run folder here
    cwd.mkdir(exist_ok=True)
    while True:
        before = _latest(run_dir)
        where = [f"resume={run_dir}"] if before is not None else [f"run_dir={run_dir}"]
        kept = [p for p in read_curve(run_dir) if before is not None and p["iteration"] <= int(before[5:])]
        proc = subprocess.Popen([*CLI, "train", *args, *where], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        killed = False
        if done < kills:
            while proc.poll() is None and _latest(run_dir) == before:  # at least one new checkpoint
                time.sleep(0.005)
            if in_write:  # the next checkpoint's temporary folder appears: kill inside its write
                while proc.poll() is None and not any((run_dir / "checkpoints").glob(".tmp-iter_*")):
                    time.sleep(0.001)
            else:
                time.sleep(rng.uniform(0.0, 0.6))
            if proc.poll() is None:
                inside += any((run_dir / "checkpoints").glob(".tmp-iter_*"))
                proc.send_signal(signal.SIGKILL)
                killed = True
        _, err = proc.communicate(timeout=600)
        if not killed:
            assert proc.returncode == 0, err[-3000:]
        if before is not None:
            _assert_resumed_at(run_dir, before, kept, err)
        if killed:
            done += 1
            continue
        assert not any(cwd.iterdir()), list(cwd.iterdir())
        iterations = [p["iteration"] for p in read_curve(run_dir)]
        assert iterations == list(range(1, len(iterations) + 1)) and f"iter_{iterations[-1]:08d}" == _latest(run_dir)
        return done, inside


def _assert_resumed_at(run_dir: Path, checkpoint: str, kept: list[dict], err: str) -> None:
    """The process started from ``checkpoint`` (``iter_N``, N > 0) and ran iterations N+1, N+2, ... only."""
    n = int(checkpoint[5:])
    said = re.search(r"resumed from (\S+) at iteration (\d+) \((\d+) env steps\)", err)
    assert said, f"no 'resumed from' line: {err[-3000:]}"
    assert Path(said[1]).name == checkpoint and int(said[2]) == n > 0, said[0]
    assert int(said[3]) == 8 * 8 * n, said[0]
    pts = read_curve(run_dir)
    assert pts[:n] == kept and len(kept) == n, "the curve up to the restored iteration was rewritten"
    assert [p["iteration"] for p in pts[n:]] == list(range(n + 1, n + 1 + len(pts) - n)), "an iteration was redone"
    assert len(pts) > n, "no iteration ran after the resume"


def _assert_same_final_state(a: Path, b: Path) -> None:
    ca, cb = load_checkpoint(a), load_checkpoint(b)
    assert ca.path.name == cb.path.name
    ta, _ = flatten_tree(ca.state)
    tb, _ = flatten_tree(cb.state)
    assert ta.keys() == tb.keys()
    differ = [k for k in ta if not (ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]))]
    assert not differ, f"not bitwise equal after resume: {differ[:10]}"
    # Network weights and optimizer moments are among the compared tensors.
    assert any(k.startswith(("/algo/policy/", "/algo/actor/")) for k in ta)
    assert any(k.startswith(("/algo/optimizer/state", "/algo/critic_opt/state")) for k in ta)


def _kill_resume_case(tmp_path: Path, kills: int, iterations: int, seed: int,
                      args: list[str] | None = None, in_write: bool = False) -> None:
    """``iterations`` iterations of 8 envs x 8 steps, straight vs SIGKILLed ``kills`` times and resumed."""
    args = [*(DETERMINISTIC if args is None else args), f"total_steps={8 * 8 * iterations}"]
    reference = tmp_path / "reference"
    out = _run(["train", *args, f"run_dir={reference}"])
    assert out.returncode == 0, out.stderr[-3000:]
    done, inside = _train_with_kills(tmp_path / "killed", args, kills, seed, _slow_fsync_env(tmp_path), in_write)
    print(f"{done} kills, {inside} inside a checkpoint write")
    assert done == kills
    if in_write:
        assert inside == kills  # every kill tore a checkpoint write, and the run still ends bitwise equal
    _assert_same_final_state(reference, tmp_path / "killed")
    assert not list((tmp_path / "killed" / "checkpoints").glob(".tmp-*"))


def test_kill_and_resume_is_bitwise_equal(tmp_path):
    _kill_resume_case(tmp_path, kills=3, iterations=16, seed=0)


def test_kills_inside_checkpoint_writes_resume_bitwise_equal(tmp_path):
    """Each kill lands while a checkpoint is being written (its temporary folder on disk): the torn write is
    discarded, the run resumes from the checkpoint before it and ends in the same bits (RELIABILITY B1)."""
    _kill_resume_case(tmp_path, kills=3, iterations=16, seed=3, in_write=True)


# FlashSAC through the same CLI: the replay buffer, critics, targets, temperature and noise state resume too.
FLASHSAC_DETERMINISTIC = ["algo=flashsac", "sim.num_envs=8", "algo.steps_per_iteration=8", "algo.batch_size=32",
                          "algo.learning_starts=64", "algo.actor.hidden_dim=16", "algo.critic.hidden_dim=16",
                          "logger.progress=false", "deterministic=true", "checkpoint_every=1",
                          "checkpoint.keep_last=2", "eval.enabled=false", "logger.tensorboard=false"]


def test_kill_and_resume_flashsac_is_bitwise_equal(tmp_path):
    _kill_resume_case(tmp_path, kills=3, iterations=12, seed=2, args=FLASHSAC_DETERMINISTIC)


@pytest.mark.slow
def test_kill_and_resume_is_bitwise_equal_20_kills(tmp_path):
    _kill_resume_case(tmp_path, kills=20, iterations=60, seed=1)


def test_training_without_autoreset_still_evaluates(tmp_path):
    """sim.autoreset=false is for training (the runner resets ended envs); the final evaluation and video run on
    envs that reset themselves, so the run ends with its report (it stopped with a RuntimeError before)."""
    run = tmp_path / "run"
    assert main(["train", *TINY, "sim.num_envs=4", "total_steps=256", "sim.autoreset=false", "eval.num_episodes=4",
                 "eval.num_envs=2", "eval.video_episodes=1", f"run_dir={run}"]) == 0
    result = json.loads((run / "eval.json").read_text())
    assert result["eval"]["num_episodes"] == 4 and (run / "policy.mp4").is_file()


def test_a_backend_that_is_not_installed_is_one_line_naming_the_install(capsys):
    """Isaac Lab absent (as here): exit 2 and the pip line, not an ImportError traceback."""
    import importlib.util

    if importlib.util.find_spec("isaaclab_tasks") is not None:
        pytest.skip("Isaac Lab is installed here: this checks the machines without it")
    assert main(["train", "sim=isaaclab", "task=isaaclab", "task.id=Isaac-Cartpole", "algo=ppo"]) == 2
    err = capsys.readouterr().err
    assert "error: make_isaaclab_env needs Isaac Lab (`pip install isaaclab`" in err and "Traceback" not in err


def test_a_resume_that_cannot_continue_the_run_is_refused_before_anything_is_written(tmp_path, capsys):
    """Another sim.num_envs (the checkpoint holds each env's state) or, in the run's own folder, a checkpoint that is
    not its latest (that would rewind the run in place): exit 2 naming what to do; branching an earlier checkpoint
    into a new folder works."""
    run = tmp_path / "run"
    base = [*TINY, "checkpoint_every=2", "checkpoint.keep_last=3", "eval.enabled=false", "logger.tensorboard=false"]
    assert main(["train", *base, "total_steps=512", f"run_dir={run}"]) == 0  # 8 iterations: 4, 6, 8 kept
    curve = (run / "curve.jsonl").read_text()
    assert main(["train", *base, "sim.num_envs=4", "total_steps=1024", f"resume={run}"]) == 2
    assert "has sim.num_envs=8; this resume asks 4: give sim.num_envs=8" in capsys.readouterr().err
    earlier = run / "checkpoints" / "iter_00000004"
    assert main(["train", *base, "total_steps=1024", f"resume={earlier}"]) == 2
    assert "iter_00000004 is not the latest checkpoint" in capsys.readouterr().err
    assert (run / "curve.jsonl").read_text() == curve and earlier.is_dir()  # nothing rewound
    assert main(["train", *base, "total_steps=1024", f"resume={earlier}", f"run_dir={tmp_path / 'branch'}"]) == 0
    assert "resumed from" in capsys.readouterr().err and (tmp_path / "branch" / "checkpoints" / "latest").is_file()


def test_cameras_the_learner_does_not_read_are_named(tmp_path, capsys):
    """task.cameras with a state learner: every step pays the rendering for nothing; the run says so."""
    assert main(["train", *TINY, "total_steps=64", "task.cameras=[front]", "eval.enabled=false",
                 f"run_dir={tmp_path / 'run'}"]) == 0
    assert "task.cameras renders ['image.front'] every step, which ppo does not read" in capsys.readouterr().err


def test_a_task_without_a_success_event_says_so_in_its_report(tmp_path, capsys):
    """humanoid_walk has no success event: the report says so (and the mean episode length) instead of a success
    rate of 0.000 that reads as a failure; eval.json marks it."""
    run = tmp_path / "run"
    assert main(["train", "task=humanoid_walk", "algo=ppo", "sim.num_envs=4", "algo.num_steps=4", "total_steps=32",
                 "task.episode_length=10", "algo.policy.hidden_dims=[8]", "algo.critic.hidden_dims=[8]",
                 "logger.progress=false", "eval.num_episodes=2", "eval.num_envs=2", "eval.video=false",
                 f"run_dir={run}"]) == 0
    assert "eval: no success event in humanoid_walk (mean length" in capsys.readouterr().err
    assert json.loads((run / "eval.json").read_text())["task_has_success"] is False
