"""The Isaac Lab adapter (sim/isaaclab.py).

The fast tests drive ``FakeIsaacLabEnv`` (tests/sim/_fake_isaaclab.py), a stand-in with Isaac Lab 3.0.0's
step/reset signatures and same-step auto-reset, so they run where Isaac Lab is not installed (it needs Python 3.12
and its own environment; this project's venv does not carry it).

The CLI tests (``robot-rl train sim=isaaclab task=isaaclab ...``) run ``make_isaaclab_env``'s own code with
STAND-INS for its three Isaac Lab imports (``make_stand_in_isaaclab``), so ``gymnasium.make`` builds a
``FakeIsaacLabEnv``.

``test_real_isaaclab_cartpole_*`` (slow, skipped without isaaclab) run Isaac Lab's own ``Isaac-Cartpole`` with
Newton / MuJoCo-Warp physics and no Isaac Sim, on the CPU when there is no GPU: through the adapter, and through
the CLI in a subprocess (one Isaac Lab simulation per process). Its robot and ground USD files normally come from
NVIDIA's asset server; where that is unreachable (as here) the tests write stand-ins
(tests/sim/_isaaclab_assets.py) and point ``ISAACSIM_ASSET_ROOT`` at them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch

from policies import keys
from sim.isaaclab import IsaacLabVecEnv, make_isaaclab_env
from tests.sim._fake_isaaclab import STAND_IN_ID, FakeEnvCfg, FakeIsaacLabEnv, make_stand_in_isaaclab

NO_ISAACLAB = "isaaclab is not installed (Python 3.12, its own environment: pip install isaaclab==3.0.0)"


def _adapter(num_envs: int = 4, **kwargs) -> tuple[IsaacLabVecEnv, FakeIsaacLabEnv]:
    fake = FakeIsaacLabEnv(num_envs, cfg=kwargs.pop("cfg", None), critic=kwargs.pop("critic", True),
                           action_space=kwargs.pop("action_space", None))
    return IsaacLabVecEnv(fake, **kwargs), fake


def test_groups_spec_and_same_step_reset_with_true_final_obs():
    env, fake = _adapter(num_envs=3)
    assert env.obs_spec.shapes == {keys.POLICY: (1,), keys.CRITIC: (2,)}
    assert (env.max_episode_length, env.control_dt, env.action_dim) == (40, 0.125, 1)
    obs, _ = env.reset(seed=0)
    fake.x[:] = torch.tensor([0.5, -0.5, 0.08])  # env 2 reaches |x| < 0.05 with a = -1
    obs, _, terminated, truncated, info = env.step(torch.tensor([[0.0], [0.0], [-1.0]]))
    assert terminated.tolist() == [False, False, True] and not truncated.any()
    final = info[keys.FINAL_OBS]
    assert final[keys.POLICY][2, 0].item() == pytest.approx(-0.02)  # before Isaac Lab's reset
    assert abs(obs[keys.POLICY][2, 0].item()) >= 0.3  # the new episode's first observation
    torch.testing.assert_close(final[keys.POLICY][:2], obs[keys.POLICY][:2])  # other rows equal obs
    torch.testing.assert_close(final[keys.CRITIC][2], torch.tensor([-0.02, 1 / 40]))
    ep = info[keys.EPISODE]
    assert ep[keys.EP_LENGTH][2] == 1 and ep[keys.EP_RETURN][2].item() == pytest.approx(-0.02)
    assert info[keys.SUCCESS].tolist() == [False] * 3  # no success signal configured
    assert info[keys.LOG]["isaaclab/Episode_Reward/distance"] == pytest.approx(-0.02 / 5.0)


def test_time_outs_are_truncations_unless_also_terminated():
    env, fake = _adapter(num_envs=2)
    env.reset(seed=0)
    fake.x[:] = torch.tensor([0.5, 0.1])
    fake.episode_length_buf[:] = 39  # the next step is the 40th: both time out, env 1 also succeeds
    _, _, terminated, truncated, info = env.step(torch.tensor([[0.0], [-1.0]]))
    assert terminated.tolist() == [False, True] and truncated.tolist() == [True, False]
    assert info[keys.EPISODE][keys.EP_LENGTH].tolist() == [1, 1]  # (the adapter counts from its own reset)
    torch.testing.assert_close(info[keys.FINAL_OBS][keys.POLICY][0], torch.tensor([0.5]))


def test_finite_horizon_time_outs_terminate():
    env, fake = _adapter(num_envs=1, cfg=FakeEnvCfg(is_finite_horizon=True))
    env.reset(seed=0)
    fake.episode_length_buf[:] = 39
    _, _, terminated, truncated, _ = env.step(torch.zeros(1, 1))
    assert terminated.tolist() == [True] and truncated.tolist() == [False]


def test_returned_tensors_are_not_rewritten_by_the_next_step():
    env, fake = _adapter(num_envs=2)
    env.reset(seed=0)
    _, reward, terminated, truncated, _ = env.step(torch.zeros(2, 1))
    saved = reward.clone(), terminated.clone(), truncated.clone()
    fake.x[:] = 0.01
    env.step(torch.zeros(2, 1))  # Isaac Lab rewrites reward_buf / reset_terminated in place
    for a, b in zip((reward, terminated, truncated), saved):
        assert torch.equal(a, b)


def test_nonfinite_observations_and_rewards_become_zero_and_are_counted():
    env, fake = _adapter(num_envs=2)
    env.reset(seed=0)
    fake.x[1] = float("nan")  # a diverged simulation
    obs, reward, _, _, info = env.step(torch.zeros(2, 1))
    assert all(torch.isfinite(v).all() for v in obs.values()) and reward[1] == 0.0
    assert info[keys.LOG]["sim/nonfinite_rewards"] == 1.0


def test_nonfinite_action_raises_before_the_simulator():
    env, fake = _adapter(num_envs=3)
    env.reset(seed=0)
    action = torch.zeros(3, 1)
    action[1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite action .* envs \[1\]; nothing was sent to the simulator"):
        env.step(action)
    assert fake.actions_received == []
    with pytest.raises(ValueError, match=r"expected \[num_envs, action_dim\] = \[3, 1\]"):
        env.step(torch.zeros(3, 2))
    with pytest.raises(RuntimeError, match="reset"):
        _adapter()[0].step(torch.zeros(4, 1))


def test_actions_map_onto_bounded_spaces_and_scale_unbounded_ones():
    env, fake = _adapter(num_envs=2, action_scale=3.0)  # Isaac Lab's Box(-inf, inf)
    env.reset(seed=0)
    env.step(torch.tensor([[0.5], [7.0]]))
    torch.testing.assert_close(fake.actions_received[-1], torch.tensor([[1.5], [3.0]]))  # clamped to [-1, 1] first
    env, fake = _adapter(num_envs=2, action_space=gymnasium.spaces.Box(0.0, 2.0, (1,)))
    env.reset(seed=0)
    env.step(torch.tensor([[-1.0], [0.5]]))
    torch.testing.assert_close(fake.actions_received[-1], torch.tensor([[0.0], [1.5]]))


def test_success_from_a_termination_term_or_a_function():
    env, fake = _adapter(num_envs=2, success="success")
    env.reset(seed=0)
    fake.x[:] = torch.tensor([0.5, 0.08])
    _, _, _, _, info = env.step(torch.tensor([[0.0], [-1.0]]))
    assert info[keys.SUCCESS].tolist() == [False, True]
    assert info[keys.EPISODE][keys.EP_SUCCESS].tolist() == [False, True]
    with pytest.raises(ValueError, match=r"not a termination term; the task has \['time_out', 'success'\]"):
        _adapter(success="reached")
    env, fake = _adapter(num_envs=2, success=lambda e: e.reset_terminated)
    env.reset(seed=0)
    fake.x[:] = torch.tensor([0.08, 0.5])
    assert env.step(torch.tensor([[-1.0], [0.0]]))[4][keys.SUCCESS].tolist() == [True, False]


def test_direct_env_without_critic_group_or_final_obs(caplog):
    env, fake = _adapter(num_envs=2, critic=False, cfg=FakeEnvCfg(compute_final_obs=False))
    assert env.obs_spec.shapes == {keys.POLICY: (1,), keys.CRITIC: (1,)}
    obs, _ = env.reset(seed=0)
    assert torch.equal(obs[keys.CRITIC], obs[keys.POLICY])
    fake.x[:] = torch.tensor([0.5, 0.08])
    with caplog.at_level(logging.WARNING, logger="sim.isaaclab"):
        _, _, _, _, info = env.step(torch.tensor([[0.0], [-1.0]]))
    assert "compute_final_obs" in caplog.text
    # Without Isaac Lab's final_obs an ended env's row is the observation its last action was taken in.
    torch.testing.assert_close(info[keys.FINAL_OBS][keys.POLICY][1], obs[keys.POLICY][1])


def test_wrapped_env_and_close():
    fake = FakeIsaacLabEnv(2)
    closed = []
    env = IsaacLabVecEnv(gymnasium.wrappers.OrderEnforcing(fake), instruction="go", on_close=lambda: closed.append(1))
    env.reset(seed=1)
    env.step(torch.zeros(2, 1))
    assert not env.resumable and env.state_dict() == {}
    with pytest.raises(NotImplementedError, match="not resumable"):
        env.load_state_dict(env.state_dict())
    env.close()
    env.close()
    assert fake.closed and closed == [1] and env.instructions == ["go", "go"]


def test_bad_spaces_are_clear_errors():
    fake = FakeIsaacLabEnv(2)
    fake.single_observation_space = gymnasium.spaces.Dict(
        {"policy": gymnasium.spaces.Dict({"x": gymnasium.spaces.Box(-1, 1, (1,))})})
    with pytest.raises(TypeError, match="concatenate_terms=True"):
        IsaacLabVecEnv(fake)
    fake = FakeIsaacLabEnv(2, action_space=gymnasium.spaces.Box(-1, 1, (1,)))
    fake.single_action_space = gymnasium.spaces.Discrete(3)
    with pytest.raises(TypeError, match="flat Box action space"):
        IsaacLabVecEnv(fake)


def test_ppo_trains_through_the_adapter(tmp_path):
    from policies import GaussianPolicy, GaussianPolicyConfig
    from robot_rl.algos.ppo import PPO, PPOConfig
    from robot_rl.checkpoint import CheckpointManager
    from robot_rl.evaluation import evaluate
    from robot_rl.logging import LoggerConfig, RunLogger
    from robot_rl.models.critics import CriticConfig, MLPCritic
    from robot_rl.runners.on_policy import OnPolicyRunner, OnPolicyRunnerConfig

    torch.manual_seed(0)
    env = IsaacLabVecEnv(FakeIsaacLabEnv(64), success="success")
    policy = GaussianPolicy(GaussianPolicyConfig(obs_dim=1, action_dim=1, hidden_dims=[32, 32], init_std=0.5))
    algo = PPO(policy, MLPCritic(CriticConfig(obs_dim=2, hidden_dims=[32, 32])), PPOConfig(), device="cpu")
    cfg = OnPolicyRunnerConfig(num_steps=16, total_steps=64 * 16 * 25, checkpoint_every=1000, success_window=64)
    runner = OnPolicyRunner(env, algo, cfg, RunLogger(tmp_path, LoggerConfig(progress=False, tensorboard=False)),
                            CheckpointManager(tmp_path / "ckpt"), {})
    scalars = runner.learn()
    assert runner.checkpoints.latest() is not None  # a checkpoint without env state (not resumable)
    assert "isaaclab/Episode_Reward/distance" in scalars and "reward/total" in scalars
    algo.eval_mode()
    result = evaluate(IsaacLabVecEnv(FakeIsaacLabEnv(32), success="success"), lambda o: algo.policy.act(o), 64,
                      seed=123)
    assert result.success_rate >= 0.9 and result.mean_length < 15, result


def test_factory_without_isaaclab_is_a_clear_error():
    if importlib.util.find_spec("isaaclab") is not None:
        pytest.skip("Isaac Lab is installed here")
    with pytest.raises(ImportError, match="make_isaaclab_env needs Isaac Lab"):
        make_isaaclab_env("Isaac-Cartpole", num_envs=2, device="cpu")


# ------------------------------------------------------------------------------ the CLI, on the stand-in
@pytest.fixture
def stand_in_isaaclab(monkeypatch) -> dict[str, list]:
    """``make_isaaclab_env``'s Isaac Lab imports replaced by STAND-INS building ``FakeIsaacLabEnv``; their calls."""
    modules, spec, calls = make_stand_in_isaaclab()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(gymnasium.registry, spec.id, spec)
    return calls


STAND_IN_CLI = ["sim=isaaclab", "task=isaaclab", f"task.id={STAND_IN_ID}", "task.success=success",
                "task.overrides=['episode_length_s=5']", "sim.device=cpu", "logger.progress=false"]


def _tb_tags(run_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    return set(EventAccumulator(str(run_dir / "tb")).Reload().Tags()["scalars"])


def test_cli_trains_ppo_on_the_stand_in_then_evaluates_and_refuses_resume(stand_in_isaaclab, tmp_path, capsys):
    from robot_rl.checkpoint import LATEST, load_checkpoint
    from robot_rl.cli.main import main

    calls, run = stand_in_isaaclab, tmp_path / "run"
    assert main(["train", *STAND_IN_CLI, "algo=ppo", "sim.num_envs=16", "algo.num_steps=8", "total_steps=512",
                 "algo.policy.hidden_dims=[32,32]", "algo.critic.hidden_dims=[32,32]", "checkpoint_every=2",
                 f"run_dir={run}", "eval.num_episodes=8"]) == 0
    err = capsys.readouterr().err
    # One simulation, built as Isaac Lab's scripts build it, trained on, evaluated on, then shut down once.
    assert calls["parse_env_cfg"] == [(STAND_IN_ID, "cpu", 16, ["episode_length_s=5"])]
    assert calls["launch"] == [{"headless": True}] and calls["shutdown"] == [True]
    assert len(calls["make"]) == 1 and calls["make"][0].compute_final_obs and calls["make"][0].seed == 0
    assert (run / "checkpoints" / LATEST).read_text() == "iter_00000004"  # 512 / (16 envs * 8 steps)
    meta = load_checkpoint(run).meta
    assert meta["task"] == "isaaclab" and meta["task_config"]["id"] == STAND_IN_ID and meta["env_steps"] == 512
    result = json.loads((run / "eval.json").read_text())
    assert result["eval"]["num_episodes"] == 8 and result["video"] is None and "no video" in err
    assert (run / "learning_curve.png").is_file()
    assert {"isaaclab/Episode_Reward/distance", "reward/total", "loss/value"} <= _tb_tags(run)

    # robot-rl eval: a fresh env of num_envs in this (one-simulation) process, through the same adapter.
    assert main(["eval", f"checkpoint={run}", "num_envs=4", "num_episodes=4", f"out_dir={tmp_path / 'eval'}"]) == 0
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["eval"]["num_episodes"] == 4
    assert calls["make"][-1].num_envs == 4 and len(calls["shutdown"]) == 2

    assert main(["train", *STAND_IN_CLI, f"resume={run}"]) == 2
    err = capsys.readouterr().err
    assert "robot-rl train: error: cannot resume a sim=isaaclab run" in err, err
    assert len(calls["make"]) == 2  # refused before any simulation was built


def test_cli_trains_flashsac_on_the_stand_in(stand_in_isaaclab, tmp_path):
    from robot_rl.checkpoint import LATEST
    from robot_rl.cli.main import main

    run = tmp_path / "run"
    assert main(["train", *STAND_IN_CLI, "algo=flashsac", "sim.num_envs=8", "algo.steps_per_iteration=8",
                 "algo.learning_starts=64", "algo.batch_size=32", "algo.buffer_size=1024", "algo.actor.hidden_dim=16",
                 "algo.critic.hidden_dim=16", "total_steps=256", "checkpoint_every=2", f"run_dir={run}",
                 "eval.num_episodes=4", "eval.video=false", "logger.tensorboard=false"]) == 0
    assert (run / "checkpoints" / LATEST).read_text() == "iter_00000004"  # 256 / (8 envs * 8 steps)
    assert json.loads((run / "eval.json").read_text())["eval"]["num_episodes"] == 4
    assert len(stand_in_isaaclab["make"]) == 1 and stand_in_isaaclab["shutdown"] == [True]


@pytest.mark.parametrize("overrides,expected", [
    (["sim=isaaclab"], "task=so101_reach with sim=isaaclab: Isaac Lab tasks need sim=isaaclab"),
    (["task=isaaclab", f"task.id={STAND_IN_ID}"], "task=isaaclab with sim=mujoco"),
    (["sim=isaaclab", "task=isaaclab"], "task=isaaclab needs task.id="),
    (["sim=isaaclab", "task=isaaclab", "task.id=X", "+task.bogus=1"], "bogus"),
    (["sim=isaaclab", "task=isaaclab", "task.id=X", "sim.on_nonfinite_action=reset"], "must be 'raise'"),
])
def test_cli_isaaclab_config_errors(overrides, expected, stand_in_isaaclab, tmp_path, capsys):
    from robot_rl.cli.main import main

    assert main(["train", *overrides, f"run_dir={tmp_path}", "logger.progress=false"]) == 2
    err = capsys.readouterr().err
    assert "robot-rl train: error:" in err and expected in err, err
    assert not stand_in_isaaclab["make"]


# ------------------------------------------------------------------------------ the real Isaac Lab (slow)
@pytest.fixture
def cartpole_assets(tmp_path, monkeypatch) -> None:
    """``ISAACSIM_ASSET_ROOT``: NVIDIA's asset server is unreachable here, so local stand-ins unless it is set."""
    if "ISAACSIM_ASSET_ROOT" not in os.environ:
        from tests.sim._isaaclab_assets import write_cartpole_assets

        monkeypatch.setenv("ISAACSIM_ASSET_ROOT", str(write_cartpole_assets(tmp_path / "assets")))


@pytest.mark.slow  # minutes on a CPU: Warp compiles Newton's kernels on first use
@pytest.mark.skipif(importlib.util.find_spec("isaaclab") is None, reason=NO_ISAACLAB)
def test_real_isaaclab_cartpole_trains_through_the_adapter(tmp_path, cartpole_assets):
    """Isaac Lab's own ``Isaac-Cartpole`` (ManagerBasedRLEnv, Newton / MuJoCo-Warp physics, no Isaac Sim)."""
    from policies import GaussianPolicy, GaussianPolicyConfig
    from robot_rl.algos.ppo import PPO, PPOConfig
    from robot_rl.checkpoint import CheckpointManager
    from robot_rl.logging import LoggerConfig, RunLogger
    from robot_rl.models.critics import CriticConfig, MLPCritic
    from robot_rl.runners.on_policy import OnPolicyRunner, OnPolicyRunnerConfig

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with make_isaaclab_env("Isaac-Cartpole", num_envs=4, device=device, seed=0) as env:
        assert type(env.base).__name__ == "ManagerBasedRLEnv" and env.max_episode_length == 300
        assert env.obs_spec.shapes == {keys.POLICY: (4,), keys.CRITIC: (4,)} and env.action_dim == 1
        policy = GaussianPolicy(GaussianPolicyConfig(obs_dim=4, action_dim=1, hidden_dims=[16], init_std=0.5))
        algo = PPO(policy, MLPCritic(CriticConfig(obs_dim=4, hidden_dims=[16])), PPOConfig(), device="cpu")
        cfg = OnPolicyRunnerConfig(num_steps=16, total_steps=4 * 16 * 20, checkpoint_every=1000, success_window=4)
        runner = OnPolicyRunner(env, algo, cfg, RunLogger(tmp_path, LoggerConfig(progress=False, tensorboard=False)),
                                CheckpointManager(tmp_path / "ckpt"), {})
        scalars = runner.learn()  # 320 steps per env: every env ends at least one episode (time-out at 300)
        assert runner.stats.count >= 4 and 0 < runner.stats.lengths.min() <= runner.stats.lengths.max() <= 300
        assert "isaaclab/Episode_Reward/alive" in scalars and np.isfinite(scalars["loss/value"])
        action = torch.zeros(4, 1)
        action[3] = float("inf")
        with pytest.raises(ValueError, match=r"envs \[3\]; nothing was sent to the simulator"):
            env.step(action)


@pytest.mark.slow  # minutes on a CPU, twice: training and `robot-rl eval` each build the task in a new process
@pytest.mark.skipif(importlib.util.find_spec("isaaclab") is None, reason=NO_ISAACLAB)
def test_real_isaaclab_cartpole_trains_through_the_cli(tmp_path, cartpole_assets):
    """``robot-rl train sim=isaaclab task=isaaclab task.id=Isaac-Cartpole algo=ppo``, then ``robot-rl eval``."""
    from robot_rl.checkpoint import LATEST, load_checkpoint

    def cli(*args: str) -> subprocess.CompletedProcess:  # a process each: Isaac Lab runs one simulation per process
        out = subprocess.run([sys.executable, "-m", "robot_rl.cli.main", *args], capture_output=True, text=True,
                             timeout=1800, check=False)
        assert out.returncode == 0, out.stderr[-4000:]
        return out

    run, device = tmp_path / "run", "cuda:0" if torch.cuda.is_available() else "cpu"
    out = cli("train", "sim=isaaclab", "task=isaaclab", "task.id=Isaac-Cartpole", "algo=ppo", f"sim.device={device}",
              "sim.num_envs=4", "algo.num_steps=16", "algo.policy.hidden_dims=[16]", "algo.critic.hidden_dims=[16]",
              "total_steps=1280", "checkpoint_every=10", f"run_dir={run}", "eval.num_episodes=4",
              "logger.progress=false")  # 320 steps per env: every env ends an episode (time-out at 300)
    assert "no video" in out.stderr
    assert (run / "checkpoints" / LATEST).read_text() == "iter_00000020"
    meta = load_checkpoint(run).meta
    assert meta["obs_spec"] == {g: {"shape": [4], "dtype": "torch.float32"} for g in (keys.POLICY, keys.CRITIC)}
    assert meta["action_dim"] == 1 and meta["task_config"]["id"] == "Isaac-Cartpole"
    result = json.loads((run / "eval.json").read_text())["eval"]
    assert result["num_episodes"] == 4 and 0 < result["mean_length"] <= 300 and np.isfinite(result["mean_return"])
    assert "isaaclab/Episode_Reward/alive" in _tb_tags(run)
    cli("eval", f"checkpoint={run}", "num_envs=2", "num_episodes=2", f"out_dir={tmp_path / 'eval'}")
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["eval"]["num_episodes"] == 2
