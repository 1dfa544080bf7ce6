"""PPO's optional value-target normalisation: the critic learns (R − μ_R) / σ_R, values come back in return units,
and the learner is unchanged by the scale of the rewards."""

import torch

from tests._toy_envs import PointMassEnv
from tests.test_ppo import _filled_buffer, make_ppo


class _Scaled(PointMassEnv):
    """The point mass with rewards × ``scale`` (so101_lift's returns are in the hundreds, the point mass's ~ −5)."""

    def __init__(self, scale: float, **kw) -> None:
        super().__init__(**kw)
        self.scale = scale

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward * self.scale, terminated, truncated, info


def test_values_are_denormalised_with_the_return_statistics():
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=8)
    algo = make_ppo(env, normalize_value=True, num_epochs=1, num_minibatches=2)
    buf = _filled_buffer(env, algo, 16)
    algo.update(buf)
    rets = buf.returns.flatten().double()
    norm = algo.return_norm
    assert torch.allclose(norm.mean.double(), rets.mean(), atol=1e-5)
    assert torch.allclose(norm.var.double(), rets.var(unbiased=False), atol=1e-4)
    obs, _ = env.reset(seed=1)
    raw = algo.critic(obs)
    assert torch.allclose(algo.value(obs), raw * torch.sqrt(norm.var + norm.eps) + norm.mean)


def _actor_after(scale: float, normalize_value: bool) -> tuple[torch.Tensor, float]:
    torch.manual_seed(0)
    env = _Scaled(scale, num_envs=8)
    algo = make_ppo(env, normalize_value=normalize_value, num_epochs=2, num_minibatches=2, schedule="fixed")
    for _ in range(3):
        stats = algo.update(_filled_buffer(env, algo, 16))
    return algo.policy.mean_net[0].weight.detach().clone(), stats["loss/value"]


def test_the_value_loss_is_in_sigma_units_whatever_the_reward_scale():
    """The same seed on rewards ×1 and ×100: normalised, the value loss (and so the value clip, 0.2) is in σ units
    and about equal for both; unnormalised, it grows with the square of the scale."""
    (w1, l1), (w100, l100) = _actor_after(1.0, True), _actor_after(100.0, True)
    _, raw100 = _actor_after(100.0, False)
    assert abs(l1 - l100) < 0.05 * max(1.0, abs(l1)), (l1, l100)
    assert raw100 > 100 * l100, (raw100, l100)
    assert (w1 - w100).abs().max() < 2e-3  # the actor barely notices the scale
