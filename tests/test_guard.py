"""guarded_step: the shared backward / clip / step of BC and the value learner, skipped on a non-finite loss."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from robot_rl.algos.guard import NonFiniteError, NonFiniteGuard, guarded_step


def test_a_finite_loss_steps_and_a_non_finite_one_leaves_weights_and_optimizer_untouched():
    torch.manual_seed(0)
    net = nn.Linear(3, 1)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    guard = NonFiniteGuard(max_consecutive=1)
    x = torch.randn(4, 3)
    before = [p.detach().clone() for p in net.parameters()]
    norm = guarded_step(opt, net.parameters(), net(x).pow(2).mean(), 1e-3, guard)
    assert norm is not None and float(norm) > 1e-3  # the pre-clip norm, above the clip
    assert any(not torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))
    weights = [p.detach().clone() for p in net.parameters()]
    state = {k: {n: t.clone() for n, t in v.items() if torch.is_tensor(t)} for k, v in opt.state.items()}
    assert guarded_step(opt, net.parameters(), net(x).sum() * float("nan"), 1.0, guard) is None
    assert all(torch.equal(a, p) for a, p in zip(weights, net.parameters(), strict=True))
    assert all(p.grad is None for p in net.parameters())
    assert all(torch.equal(state[k][n], opt.state[k][n]) for k in state for n in state[k])
    assert guard.skipped == 1
    with pytest.raises(NonFiniteError):  # a second skip in a row is past max_consecutive=1
        guarded_step(opt, net.parameters(), net(x).sum() * float("inf"), 1.0, guard)
