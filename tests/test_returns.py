"""GAE and time-out bootstrapping against numbers worked out by hand (γ = 0.9, λ = 0.5)."""

import pytest
import torch

from robot_rl import returns

GAMMA, LAM = 0.9, 0.5


def test_gae_by_hand():
    # Three envs, three steps: no end; terminated at t=1; truncated at t=1 with V(final_obs) = 4.
    reward = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [3.0, 3.0, 3.0]])
    value = torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [1.5, 1.5, 1.5]])
    terminated = torch.tensor([[False, False, False], [False, True, False], [False, False, False]])
    truncated = torch.tensor([[False, False, False], [False, False, True], [False, False, False]])
    final_value = torch.full((3, 3), 4.0)
    last_value = torch.tensor([2.0, 2.0, 2.0])

    r = returns.bootstrap_time_outs(reward, truncated, final_value, GAMMA)
    assert r[1].tolist() == pytest.approx([2.0, 2.0, 2.0 + 0.9 * 4.0])  # only the time-out gets γ·V(final)
    adv, ret = returns.gae(r, value, terminated | truncated, last_value, GAMMA, LAM)

    # δ2 = 3 + 0.9·2 − 1.5 = 3.3 (all envs: the last step bootstraps from last_value)
    # env 0: δ1 = 2 + 0.9·1.5 − 1 = 2.35, A1 = 2.35 + 0.45·3.3 = 3.835; δ0 = 1 + 0.9·1 − 0.5 = 1.4,
    #        A0 = 1.4 + 0.45·3.835 = 3.12575
    # env 1 (terminated at 1): δ1 = 2 − 1 = 1, A1 = 1; A0 = 1.4 + 0.45·1 = 1.85
    # env 2 (truncated at 1): δ1 = 5.6 − 1 = 4.6, A1 = 4.6; A0 = 1.4 + 0.45·4.6 = 3.47
    expected = torch.tensor([[3.12575, 1.85, 3.47], [3.835, 1.0, 4.6], [3.3, 3.3, 3.3]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + value)


def test_gae_limits():
    g = torch.Generator().manual_seed(0)
    reward, value = torch.randn(7, 4, generator=g), torch.randn(7, 4, generator=g)
    done = torch.rand(7, 4, generator=g) < 0.3
    last = torch.randn(4, generator=g)
    # λ = 1: returns are the bootstrapped discounted returns.
    _, ret = returns.gae(reward, value, done, last, GAMMA, 1.0)
    torch.testing.assert_close(ret, returns.discounted_returns(reward, done, last, GAMMA))
    # λ = 0: advantages are one-step TD errors.
    adv, _ = returns.gae(reward, value, done, last, GAMMA, 0.0)
    next_v = torch.cat([value[1:], last[None]])
    torch.testing.assert_close(adv, reward + GAMMA * next_v * (~done).float() - value)


def test_termination_is_not_bootstrapped():
    r = returns.bootstrap_time_outs(torch.ones(2), torch.tensor([False, True]), torch.tensor([100.0, 10.0]), 0.5)
    assert r.tolist() == [1.0, 6.0]
