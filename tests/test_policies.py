"""Gaussian policy, empirical normalizer, and the exported policy loading without algorithm code."""

import subprocess
import sys
import textwrap

import torch
from torch import nn

from policies import GaussianPolicy, GaussianPolicyConfig, load_policy
from policies.gaussian import normal_entropy, normal_log_prob
from policies.normalizer import EmpiricalNormalizer


def test_normalizer_matches_batch_statistics_and_freezes():
    torch.manual_seed(0)
    norm = EmpiricalNormalizer(3)
    batches = [torch.randn(n, 3) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -1.0, 0.0])
               for n in (5, 17, 64)]
    for b in batches:
        norm.update(b)
    allx = torch.cat(batches)
    torch.testing.assert_close(norm.mean, allx.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.var, allx.var(0, unbiased=False), rtol=1e-4, atol=1e-5)
    assert norm.count.item() == len(allx)
    y = norm(allx)
    torch.testing.assert_close(y.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    # NaN rows are ignored; eval mode freezes the statistics.
    before = norm.mean.clone()
    norm.update(torch.full((4, 3), float("nan")))
    assert torch.equal(norm.mean, before)
    mixed = torch.tensor([[1.0, 2.0, 3.0], [float("nan"), 0.0, 0.0], [3.0, 4.0, float("inf")]])
    twin = EmpiricalNormalizer(3)
    twin.load_state_dict(norm.state_dict())
    norm.update(mixed)  # only the finite row counts
    twin.update(mixed[:1])
    assert torch.equal(norm.mean, twin.mean) and torch.equal(norm.var, twin.var)
    assert norm.count.item() == len(allx) + 1
    before = norm.mean.clone()
    norm.eval()
    norm.update(torch.randn(10, 3) + 100)
    assert torch.equal(norm.mean, before)


def test_policy_act_and_distribution_shapes():
    pol = GaussianPolicy(GaussianPolicyConfig(obs_dim=5, action_dim=2, hidden_dims=[16], init_std=0.5))
    obs = {"policy": torch.randn(7, 5)}
    assert pol.act(obs).shape == (7, 2)
    assert pol.act(obs).abs().max() <= 1.0
    dist = pol.distribution(obs)
    torch.testing.assert_close(dist.stddev, torch.full((7, 2), 0.5))
    torch.testing.assert_close(pol.act(obs, deterministic=True), pol(obs).clamp(-1, 1))


def test_normal_log_prob_and_entropy_by_hand():
    # x = [1, 0], μ = 0, σ = [2, 1]:  log p = (−1/8 − log 2 − ½ log 2π) + (−0 − 0 − ½ log 2π) = −2.6560242
    # entropy = (½ + ½ log 2π + log 2) + (½ + ½ log 2π) = 3.5310242
    x, mean, std = torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), torch.tensor([[2.0, 1.0]])
    torch.testing.assert_close(normal_log_prob(x, mean, std), torch.tensor([-2.6560242]))
    torch.testing.assert_close(normal_entropy(std), torch.tensor([3.5310242]))
    # bit for bit what torch.distributions.Normal gives (PPO's learning curves did not move when it switched)
    torch.manual_seed(0)
    x, mean, std = torch.randn(9, 4), torch.randn(9, 4), torch.rand(9, 4) + 0.1
    dist = torch.distributions.Normal(mean, std)
    assert torch.equal(normal_log_prob(x, mean, std), dist.log_prob(x).sum(-1))
    assert torch.equal(normal_entropy(std), dist.entropy().sum(-1))


def test_exported_policy_loads_without_algorithm_code(tmp_path):
    torch.manual_seed(0)
    pol = GaussianPolicy(GaussianPolicyConfig(obs_dim=4, action_dim=3, hidden_dims=[8, 8]))
    pol.update_normalizer(torch.randn(50, 4) * 3 + 1)  # statistics travel with the weights
    pol.save(tmp_path / "policy")
    x = torch.randn(6, 4)
    expected = pol.eval().act(x)
    loaded = load_policy(tmp_path / "policy")
    assert torch.equal(loaded.act(x), expected)
    assert not loaded.training

    torch.save(x, tmp_path / "x.pt")  # test data only (written and read with weights_only)
    torch.save(expected, tmp_path / "expected.pt")
    code = textwrap.dedent(f"""
        import sys, torch
        import policies
        p = policies.load_policy({str(tmp_path / 'policy')!r})
        x = torch.load({str(tmp_path / 'x.pt')!r}, weights_only=True)
        want = torch.load({str(tmp_path / 'expected.pt')!r}, weights_only=True)
        assert torch.equal(p.act(x), want)
        bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sim', 'real', 'mujoco', 'lerobot')
                     or m.startswith('robot_rl.algos') or m.startswith('robot_rl.runners')
                     or m in ('robot_rl.checkpoint', 'robot_rl.models.critics', 'hydra'))
        assert not bad, bad
        print('ok')
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_orthogonal_init_gains_and_refusal():
    import math

    import pytest

    from policies.mlp import mlp

    net = mlp(8, [16, 4], 3, "elu", init="orthogonal", output_gain=0.01)
    lins = [m for m in net if isinstance(m, torch.nn.Linear)]
    # rows of a gain-g orthogonal [out, in] matrix with out <= in are orthogonal with norm g
    w1 = lins[1].weight  # [4, 16]
    torch.testing.assert_close(w1 @ w1.T, 2.0 * torch.eye(4), atol=1e-5, rtol=0)
    # [16, 8] (out > in): the columns are orthonormal times the gain instead
    w0 = lins[0].weight
    torch.testing.assert_close(w0.T @ w0, 2.0 * torch.eye(8), atol=1e-5, rtol=0)
    torch.testing.assert_close(lins[2].weight @ lins[2].weight.T, 1e-4 * torch.eye(3), atol=1e-8, rtol=0)
    assert all(float(lin.bias.abs().max()) == 0.0 for lin in lins)
    assert math.isclose(float(lins[2].weight.norm(dim=1).max()), 0.01, rel_tol=1e-4)
    policy = GaussianPolicy(GaussianPolicyConfig(obs_dim=8, action_dim=3, init="orthogonal"))
    assert float(policy(torch.randn(32, 8)).abs().max()) < 0.2  # a 0.01-gain head: mean actions start near 0
    with pytest.raises(ValueError, match="unknown init"):
        mlp(8, [16], 3, init="xavier")


def test_mlp_output_layer_stays_float32_under_bf16_autocast():
    from policies.mlp import OutputLinear, mlp

    torch.manual_seed(0)
    net = mlp(8, [16], 3)
    x = torch.randn(5, 8)
    head = net[-1]
    assert isinstance(head, OutputLinear)
    plain = nn.functional.linear(net[:-1](x), head.weight, head.bias)
    assert torch.equal(net(x), plain)  # outside autocast: a Linear
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden, out = net[:-1](x), net(x)
    assert hidden.dtype == torch.bfloat16 and out.dtype == torch.float32
    # the head's product in float32 from the bf16 features: not the bf16 product
    assert torch.equal(out, nn.functional.linear(hidden.float(), head.weight, head.bias))
    assert not torch.equal(out, nn.functional.linear(hidden, head.weight.bfloat16(), head.bias.bfloat16()).float())


def test_elu_mlp_backward_makes_no_subnormal_gradients():
    """Units far below 0 (x < -87, as in a trained network) give the out-of-place ELU's backward subnormal gradients
    (exp(x)), which slow CPU matrix products 100-200x (benchmarks/results/subnormal.json); ours reads its output
    instead, whose gradient there is exactly 0. Forward values are the same."""
    from policies.mlp import mlp

    net = mlp(3, [8], 1, "elu")
    ref = nn.Sequential(nn.Linear(3, 8), nn.ELU(), nn.Linear(8, 1))
    with torch.no_grad():
        net[0].weight.zero_()
        net[0].bias.copy_(torch.cat([torch.linspace(-100.0, -88.0, 7), torch.tensor([2.0])]))  # seven units at exp(x) < 1.2e-38
    ref.load_state_dict(net.state_dict())
    x = torch.randn(5, 3)
    assert torch.equal(net(x), ref(x))
    tiny = torch.finfo(torch.float32).tiny

    def subnormal(model: nn.Module) -> int:
        model.zero_grad()
        model(x).sum().backward()
        return sum(int(((p.grad != 0) & (p.grad.abs() < tiny)).sum()) for p in model.parameters())

    assert subnormal(ref) > 0  # the case is real: torch's own ELU makes them
    assert subnormal(net) == 0
    assert net[0].bias.grad[:7].eq(0).all() and net[0].bias.grad[7] != 0
