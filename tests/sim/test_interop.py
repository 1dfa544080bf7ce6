"""Gymnasium and Stable-Baselines3 use our tasks through their real APIs."""

import warnings

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import sim  # noqa: F401  (registers the gymnasium ids)
from policies import keys
from sim.config import SimConfig
from sim.gym import GYM_IDS, sb3_vec_env
from sim.registry import make_env


@pytest.mark.parametrize("env_id", sorted(GYM_IDS))
def test_gymnasium_env_checker_passes(env_id):
    env = gymnasium.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    obs, r, _term, _trunc, info = env.step(env.action_space.sample())
    assert np.isfinite(obs).all() and isinstance(r, float) and "is_success" in info
    env.close()


def test_gymnasium_episode_ends_with_truncation_and_renders():
    env = gymnasium.make("robot_rl/SO101Reach-v0", episode_length=3, render_mode="rgb_array")
    env.reset(seed=0)
    for _ in range(3):
        _, _, term, trunc, _ = env.step(np.zeros(6, dtype=np.float32))
    assert trunc and not term
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3 and frame.std() > 5
    env.close()


def test_gymnasium_image_observations_are_a_dict():
    env = gymnasium.make("robot_rl/SO101Lift-v0", cameras=["wrist"], image_width=32, image_height=32)
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"state", "wrist"} and obs["wrist"].shape == (3, 32, 32)
    assert env.observation_space.contains(obs)
    env.close()


def test_sb3_ppo_trains_a_few_hundred_steps_on_our_batched_env():
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv as SB3VecEnv

    venv = sb3_vec_env(make_env("so101_reach", SimConfig(num_envs=8)))
    assert isinstance(venv, SB3VecEnv)
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.set_logger(Logger(None, []))  # SB3's default logger leaves an empty /tmp/SB3-<date> folder per run
    model.learn(total_timesteps=512)
    assert model.num_timesteps >= 512
    obs = venv.reset()
    action, _ = model.predict(obs, deterministic=True)
    obs, rew, _done, infos = venv.step(action)
    assert obs.shape == (8, 27) and rew.shape == (8,) and len(infos) == 8
    venv.close()


def test_sb3_adapter_reports_terminal_observation_and_timeouts():
    """At a time-out SB3 gets the episode's true last observation in ``terminal_observation`` (what it bootstraps
    from) and the first observation of the next episode as the step's observation: compared with our env run
    alongside on the same seed and actions."""
    ours = make_env("so101_reach", SimConfig(num_envs=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SB3 warns when it cannot read a render_mode
        venv = sb3_vec_env(make_env("so101_reach", SimConfig(num_envs=2), None))
    ours.max_episode_length = venv.venv.max_episode_length = 2
    ours.reset(seed=0)
    venv.seed(0)
    venv.reset()
    actions = [np.full((2, 6), 0.5, dtype=np.float32), np.array([[0.8, -0.6, 0.4, 0.2, -0.3, 0.1]] * 2, np.float32)]
    for a in actions:
        o_ours, _, _, trunc, info_ours = ours.step(torch.as_tensor(a))
        obs, _rew, done, infos = venv.step(a)
    assert done.all() and trunc.all()
    final = info_ours[keys.FINAL_OBS][keys.POLICY].numpy()
    np.testing.assert_array_equal(obs, o_ours[keys.POLICY].numpy())  # the next episode's first observation
    for i, info in enumerate(infos):
        assert info["TimeLimit.truncated"] and "episode" in info
        np.testing.assert_array_equal(info["terminal_observation"], final[i])
        assert np.abs(info["terminal_observation"] - obs[i]).max() > 1e-3  # not the reset observation
    venv.close()


def test_sb3_vec_env_matches_our_env_step_for_step():
    ours = make_env("so101_push", SimConfig(num_envs=2))
    theirs = sb3_vec_env(make_env("so101_push", SimConfig(num_envs=2)))
    o1, _ = ours.reset(seed=4)
    theirs.seed(4)
    o2 = theirs.reset()
    np.testing.assert_array_equal(o1["policy"].numpy(), o2)
    a = np.full((2, 6), 0.3, dtype=np.float32)
    o1, r1, *_ = ours.step(torch.as_tensor(a))
    o2, r2, *_ = theirs.step(a)
    np.testing.assert_array_equal(o1["policy"].numpy(), o2)
    np.testing.assert_allclose(r1.numpy(), r2)


def test_gymnasium_episode_end_reports_the_episode_outcome():
    """``is_success`` at an episode's end is whether the episode succeeded (as sb3_vec_env and our runners count),
    not whether its last step did: reach the target, then leave it before the time limit."""
    from sim.experts import make_expert

    env = gymnasium.make("robot_rl/SO101Reach-v0", episode_length=80, terminate_on_success=False)
    expert = make_expert(env.unwrapped.venv)
    obs, _ = env.reset(seed=0)
    info = {"is_success": False}
    while not info["is_success"]:  # the expert reads the policy observation the gymnasium env returns
        obs, _, _, trunc, info = env.step(expert.act({keys.POLICY: torch.as_tensor(obs)[None]})[0].numpy())
        assert not trunc, "the expert did not reach the target in 80 steps"
    away, trunc = [], False
    while not trunc:
        _, _, _, trunc, info = env.step(np.array([1.0, -1.0, 1.0, 0.0, 0.0, 0.0], dtype=np.float32))
        away.append(info["is_success"])
    assert len(away) > 5 and not any(away[-5:-1]), "driving away kept the tool at the target"
    assert away[-1], "the final step reported its own state, not the episode's success"
    env.close()
