"""n-step targets and the C51 projection against numbers worked out by hand (γ = 0.9)."""

import pytest
import torch

from robot_rl import returns

GAMMA = 0.9
F, T = False, True


def test_nstep_targets_by_hand():
    # Four windows of n = 3 steps, rewards 1, 2, 4 each:
    #   0: no end               G = 1 + 0.9·2 + 0.81·4 = 6.04, discount 0.9³ = 0.729, bootstrap from step 2
    #   1: terminated at step 1 G = 1 + 0.9·2 = 2.8,            discount 0 (a true end),  last step 1
    #   2: truncated at step 1  G = 2.8,                         discount 0.9² = 0.81 (a time-out bootstraps from
    #                           the final observation stored with step 1), last step 1
    #   3: step 2 not written   G = 2.8,                         discount 0.81, last step 1
    reward = torch.tensor([[1.0, 2.0, 4.0]] * 4)
    terminated = torch.tensor([[F, F, F], [F, T, F], [F, F, F], [F, F, F]])
    truncated = torch.tensor([[F, F, F], [F, F, T], [F, T, F], [F, F, F]])
    valid = torch.tensor([[T, T, T], [T, T, T], [T, T, T], [T, T, F]])
    ret, discount, last = returns.nstep_targets(reward, terminated, truncated, valid, GAMMA)
    torch.testing.assert_close(ret, torch.tensor([6.04, 2.8, 2.8, 2.8]))
    torch.testing.assert_close(discount, torch.tensor([0.729, 0.0, 0.81, 0.81]))
    assert last.tolist() == [2, 1, 1, 1]


def test_nstep_one_step_is_the_td_target():
    reward = torch.tensor([[3.0], [3.0], [3.0]])
    terminated = torch.tensor([[F], [T], [F]])
    truncated = torch.tensor([[F], [F], [T]])
    ret, discount, last = returns.nstep_targets(reward, terminated, truncated, torch.ones(3, 1, dtype=torch.bool),
                                                GAMMA)
    torch.testing.assert_close(ret, torch.tensor([3.0, 3.0, 3.0]))
    torch.testing.assert_close(discount, torch.tensor([0.9, 0.0, 0.9]))  # the time-out keeps its bootstrap
    assert last.tolist() == [0, 0, 0]


def test_categorical_projection_by_hand():
    # Support z = [-1, 0, 1] (Δz = 1), all mass on z = 1 or spread; α = 0.5, log π' = −1 (adds +0.5·d to each atom).
    support = torch.tensor([-1.0, 0.0, 1.0])
    next_probs = torch.tensor([[0.0, 0.0, 1.0],   # r = −0.5, d = 0.5: Tz = −0.5 + 0.5·(1 + 0.5) = 0.25 -> 0.75 / 0.25
                               [0.2, 0.3, 0.5],   # terminated (d = 0): everything lands on r = 0.3 -> 0.7 / 0.3
                               [0.5, 0.0, 0.5]])  # r = 2, d = 0.9: clipped to the top atom
    reward = torch.tensor([-0.5, 0.3, 2.0])
    discount = torch.tensor([0.5, 0.0, 0.9])
    log_prob = torch.tensor([-1.0, -1.0, -1.0])
    out = returns.categorical_projection(next_probs, reward, discount, support, log_prob, alpha=0.5)
    # row 2: Tz(−1) = 2 + 0.9·(−1 + 0.5) = 1.55 -> 1;  Tz(1) = 2 + 0.9·1.5 = 3.35 -> 1
    expected = torch.tensor([[0.0, 0.75, 0.25], [0.0, 0.7, 0.3], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(out, expected)
    # log π' = −2 (a log-probability other than −1 tells α·log π' from α / log π'): Tz(1) = −0.5 + 0.5·(1 + 1) = 0.5
    # -> half on z = 0, half on z = 1
    out = returns.categorical_projection(next_probs[:1], reward[:1], discount[:1], support, torch.tensor([-2.0]),
                                         alpha=0.5)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.5, 0.5]]))
    # α defaults to 0: a log-probability alone shifts nothing
    torch.testing.assert_close(returns.categorical_projection(next_probs, reward, discount, support, log_prob),
                               returns.categorical_projection(next_probs, reward, discount, support))


def test_categorical_projection_exact_atoms_and_mass():
    support = torch.linspace(-5, 5, 101)
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(64, 101, generator=g), -1)
    # Zero reward, discount 1, no entropy: atoms land exactly on themselves -> identity.
    same = returns.categorical_projection(probs, torch.zeros(64), torch.ones(64), support)
    torch.testing.assert_close(same, probs)
    # Any target keeps total mass 1 and its mean equals the clipped mean of the shifted atoms.
    reward, discount = torch.randn(64, generator=g), torch.rand(64, generator=g)
    out = returns.categorical_projection(probs, reward, discount, support)
    torch.testing.assert_close(out.sum(-1), torch.ones(64))
    tz = (reward[:, None] + discount[:, None] * support).clamp(-5, 5)
    torch.testing.assert_close((out * support).sum(-1), (probs * tz).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("r", [0.0, 0.05, -4.95])
def test_categorical_projection_of_a_point_mass_reward(r):
    support = torch.linspace(-5, 5, 101)
    probs = torch.softmax(torch.zeros(1, 101), -1)
    out = returns.categorical_projection(probs, torch.tensor([r]), torch.zeros(1), support)
    assert (out * support).sum().item() == pytest.approx(r, abs=1e-5)
    assert (out > 0).sum().item() <= 2
