"""gymnasium envs behind our VecEnv contract: batched torch, auto-reset with the true final observation."""

import torch

from policies import keys
from sim.gym_vec import GymVecEnv


def test_pendulum_time_limit_auto_resets_with_final_obs():
    env = GymVecEnv("Pendulum-v1", num_envs=2, seed=0)  # 200-step time limit, action bounds ±2
    assert env.obs_spec.shapes == {keys.POLICY: (3,), keys.CRITIC: (3,)} and env.action_dim == 1
    obs, _ = env.reset(seed=0)
    again, _ = GymVecEnv("Pendulum-v1", num_envs=2).reset(seed=0)
    assert torch.equal(obs[keys.POLICY], again[keys.POLICY])  # seeded
    total = torch.zeros(2)
    for t in range(200):
        obs, reward, terminated, truncated, info = env.step(torch.ones(2, 1))
        total += reward
        assert obs[keys.POLICY].dtype == torch.float32 and not bool(terminated.any())
        if t < 199:
            assert not bool(truncated.any())
    assert bool(truncated.all())
    final = info[keys.FINAL_OBS][keys.POLICY]
    assert not torch.equal(final, obs[keys.POLICY])  # obs is the new episode's first one
    torch.testing.assert_close(info[keys.EPISODE][keys.EP_RETURN], total)
    assert info[keys.EPISODE][keys.EP_LENGTH].tolist() == [200, 200]
    env.close()
