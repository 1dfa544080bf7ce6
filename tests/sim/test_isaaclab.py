"""The Isaac Lab adapter (sim/isaaclab.py).

The fast tests drive ``FakeIsaacLabEnv`` (tests/sim/_fake_isaaclab.py), a stand-in with Isaac Lab 3.0.0's
step/reset signatures and same-step auto-reset, so they run where Isaac Lab is not installed (it needs Python 3.12
and its own environment; this project's venv does not carry it).

``test_real_isaaclab_cartpole_trains_through_the_adapter`` (slow, skipped without isaaclab) runs Isaac Lab's own
``Isaac-Cartpole`` with Newton / MuJoCo-Warp physics and no Isaac Sim, on the CPU when there is no GPU. Its robot
and ground USD files normally come from NVIDIA's asset server; where that is unreachable (as here) the test writes
stand-ins (tests/sim/_isaaclab_assets.py) and points ``ISAACSIM_ASSET_ROOT`` at them.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import gymnasium
import numpy as np
import pytest
import torch

from robot_rl import keys
from sim.isaaclab import IsaacLabVecEnv, make_isaaclab_env
from tests.sim._fake_isaaclab import FakeEnvCfg, FakeIsaacLabEnv


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
    with pytest.raises(ValueError, match=r"non-finite action .* envs \[1\]; nothing was sent to Isaac Lab"):
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
    with pytest.raises(NotImplementedError, match="cannot be restored"):
        env.load_state_dict(env.state_dict())
    env.close()
    env.close()
    assert fake.closed and closed == [1] and env.instruction == "go"


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
    from robot_rl.critics import CriticConfig, MLPCritic
    from robot_rl.evaluation import evaluate
    from robot_rl.logging import LoggerConfig, RunLogger
    from robot_rl.runners.on_policy import OnPolicyRunner, OnPolicyRunnerConfig

    torch.manual_seed(0)
    env = IsaacLabVecEnv(FakeIsaacLabEnv(64), success="success")
    policy = GaussianPolicy(GaussianPolicyConfig(obs_dim=1, action_dim=1, hidden_dims=[32, 32], init_std=0.5))
    algo = PPO(policy, MLPCritic(CriticConfig(obs_dim=2, hidden_dims=[32, 32])), PPOConfig(), device="cpu")
    cfg = OnPolicyRunnerConfig(num_steps=16, total_steps=64 * 16 * 25, checkpoint_every=1000, success_window=64)
    runner = OnPolicyRunner(env, algo, cfg, RunLogger(tmp_path, LoggerConfig(progress=False, tensorboard=False)),
                            CheckpointManager(tmp_path / "ckpt"), {})
    scalars = runner.learn()
    assert runner.checkpoints.latest() is not None  # the final checkpoint was written through env.state_dict()
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


@pytest.mark.slow  # minutes on a CPU: Warp compiles Newton's kernels on first use
@pytest.mark.skipif(importlib.util.find_spec("isaaclab") is None,
                    reason="isaaclab is not installed (Python 3.12, its own environment: pip install isaaclab==3.0.0)")
def test_real_isaaclab_cartpole_trains_through_the_adapter(tmp_path, monkeypatch):
    """Isaac Lab's own ``Isaac-Cartpole`` (ManagerBasedRLEnv, Newton / MuJoCo-Warp physics, no Isaac Sim)."""
    from policies import GaussianPolicy, GaussianPolicyConfig
    from robot_rl.algos.ppo import PPO, PPOConfig
    from robot_rl.checkpoint import CheckpointManager
    from robot_rl.critics import CriticConfig, MLPCritic
    from robot_rl.logging import LoggerConfig, RunLogger
    from robot_rl.runners.on_policy import OnPolicyRunner, OnPolicyRunnerConfig

    if "ISAACSIM_ASSET_ROOT" not in os.environ:  # NVIDIA's asset server: unreachable here, so local stand-ins
        from tests.sim._isaaclab_assets import write_cartpole_assets

        monkeypatch.setenv("ISAACSIM_ASSET_ROOT", str(write_cartpole_assets(tmp_path / "assets")))
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
        with pytest.raises(ValueError, match=r"envs \[3\]; nothing was sent to Isaac Lab"):
            env.step(action)
