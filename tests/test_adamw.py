"""robot_rl.algos.optim.adamw and adam: fused on the CPU, and the same steps as torch's reference loops."""

import pytest
import torch

from robot_rl.algos.optim import adam, adamw


@pytest.mark.parametrize("kind", ["adamw", "adam"])  # the offline learners' and PPO's / FlashSAC's
def test_cpu_adam_is_fused_and_matches_the_reference_loop(kind) -> None:
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    start = [p.detach().clone() for p in a]
    if kind == "adamw":
        fused = adamw(a, 1e-2, 0.1, torch.device("cpu"))
        reference = torch.optim.AdamW(b, lr=1e-2, weight_decay=0.1, foreach=False)
    else:
        fused = adam(a, 1e-2, torch.device("cpu"))
        reference = torch.optim.Adam(b, lr=1e-2, foreach=False)
    assert fused.defaults["fused"] is True
    for step in range(20):
        g = [torch.randn_like(p) * (step + 1) for p in a]
        for p, q, gi in zip(a, b, g, strict=True):
            p.grad, q.grad = gi.clone(), gi.clone()
        fused.step()
        reference.step()
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert all((p - s).abs().max() > 0.01 for p, s in zip(a, start, strict=True))  # the steps moved them
