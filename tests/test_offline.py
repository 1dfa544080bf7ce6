"""The offline loop: gradient steps on logged data with no env, checkpoints that resume exactly, and a resume
that refuses other data (the dataset fingerprint stands where a task would)."""

from __future__ import annotations

import pytest
import torch

from policies import GaussianPolicy, GaussianPolicyConfig
from robot_rl.algos.bc import BC, BCConfig
from robot_rl.checkpoint import CheckpointManager, ResumeMismatchError, check_resume_compatible, load_checkpoint
from robot_rl.data.sampler import TensorSampler
from robot_rl.logging import LoggerConfig, RunLogger
from robot_rl.runners.offline import OfflineRunner, OfflineRunnerConfig

QUIET = LoggerConfig(progress=False, tensorboard=False)


def _data(seed: int = 0, n: int = 512) -> dict:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 4, generator=g)
    w = torch.tensor([[0.5, -0.3], [0.2, 0.4], [-0.6, 0.1], [0.3, 0.3]])
    return {"obs": {"policy": obs}, "action": torch.tanh(obs @ w)}


def _runner(tmp_path, total_updates: int, data: dict | None = None, bc: BCConfig | None = None) -> OfflineRunner:
    torch.manual_seed(0)
    policy = GaussianPolicy(GaussianPolicyConfig(obs_dim=4, action_dim=2, hidden_dims=[32, 32], init_std=0.5))
    cfg = OfflineRunnerConfig(total_updates=total_updates, updates_per_iteration=20, checkpoint_every=1)
    return OfflineRunner(BC(policy, bc or BCConfig()), TensorSampler(data or _data(), batch_size=64, seed=1), cfg,
                         RunLogger(tmp_path, QUIET), CheckpointManager(tmp_path / "ckpt"), {"algo": "bc"})


def test_bc_learns_on_the_offline_runner(tmp_path):
    runner = _runner(tmp_path, 600)
    runner.learn()
    data = _data(seed=5)
    runner.algo.policy.eval()
    err = (runner.algo.policy.act(data["obs"]) - data["action"]).abs().mean()
    assert runner.updates == 600 and err < 0.05, err


def test_offline_resume_is_exact_and_refuses_other_data(tmp_path):
    straight = _runner(tmp_path / "a", 200)
    straight.learn()
    first = _runner(tmp_path / "b", 100)
    first.learn()
    ckpt = load_checkpoint(tmp_path / "b" / "ckpt")
    assert ckpt.meta["updates"] == 100 and ckpt.meta["dataset"] == straight.meta["dataset"]
    resumed = _runner(tmp_path / "b", 200)
    resumed.restore(ckpt)
    assert resumed.updates == 100 and resumed.iteration == 5  # continues, does not start over
    resumed.learn()
    assert resumed.iteration == 10
    for a, b in zip(straight.algo.policy.state_dict().values(), resumed.algo.policy.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)
    other = _runner(tmp_path / "c", 100, data=_data(seed=9))
    with pytest.raises(ResumeMismatchError, match="dataset"):
        check_resume_compatible(ckpt.meta, other.meta)
    # a run naming its dataset folder: the message names both folders, not only the fingerprints
    with pytest.raises(ResumeMismatchError, match="dataset folders: the checkpoint's '/data/a', this run's '/data/b'"):
        check_resume_compatible({**ckpt.meta, "dataset_root": "/data/a"}, {**other.meta, "dataset_root": "/data/b"})


def test_lr_schedule_warmup_then_cosine_matches_hand_numbers():
    from robot_rl.algos.bc import lr_factor

    cfg = BCConfig(warmup_updates=4, lr_schedule="cosine", total_updates=14, lr_min_ratio=0.2)
    # warm-up: (u + 1) / 4; then 0.2 + 0.8 * (1 + cos(pi * (u - 4) / 10)) / 2
    assert [lr_factor(cfg, u) for u in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(cfg, 4) == pytest.approx(1.0)
    assert lr_factor(cfg, 9) == pytest.approx(0.6)  # half way: 0.2 + 0.8 * 0.5
    assert lr_factor(cfg, 14) == pytest.approx(0.2) and lr_factor(cfg, 100) == pytest.approx(0.2)
    assert lr_factor(BCConfig(), 123) == 1.0
    with pytest.raises(ValueError, match="total_updates"):
        BCConfig(lr_schedule="cosine")


def test_bc_trains_a_policy_on_its_own_loss():
    class Linear(torch.nn.Module):  # the smallest policy that defines loss(batch), like the flow VLA
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2))

        def loss(self, batch):
            err = ((batch["x"] * self.w).sum(-1) - batch["y"]).pow(2).mean()
            return err, {"mse": err.item()}

    policy = Linear()
    algo = BC(policy, BCConfig(learning_rate=0.05))
    x = torch.randn(256, 2, generator=torch.Generator().manual_seed(0))
    batch = {"x": x, "y": x @ torch.tensor([1.5, -2.0])}
    for _ in range(400):
        out = algo.update(batch)
    assert out["train/mse"] < 1e-4 and torch.allclose(policy.w, torch.tensor([1.5, -2.0]), atol=1e-2)


def test_weight_ema_matches_hand_numbers_is_exported_and_resumes_exactly(tmp_path):
    """EMA decay min(d, (1 + t) / (10 + t)) at update t: with a policy whose weight moves by a known step, the average
    is the hand-computed one; the run exports the average, and a resumed run ends with the same average."""
    class Scalar(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def loss(self, batch):  # d loss / d w = -1: plain SGD moves w by +lr each update
            return -self.w.sum(), {}

    algo = BC(Scalar(), BCConfig(learning_rate=1.0, max_grad_norm=10.0, ema_decay=0.5))
    algo.optimizer = torch.optim.SGD(algo.policy.parameters(), lr=1.0)
    ema, w = 0.0, 0.0
    for t in range(4):
        algo.update({})
        w += 1.0
        d = min(0.5, (1 + t) / (10 + t))  # 0.1, 2/11, 0.25, 4/13: the warm-up, then capped at 0.5 from t = 8
        ema = d * ema + (1 - d) * w
        assert algo.ema.w.item() == pytest.approx(ema, rel=1e-6)
    assert algo.policy.w.item() == 4.0 and algo.export_policy is algo.ema
    assert BC(Scalar(), BCConfig()).export_policy is not None and BC(Scalar(), BCConfig()).ema is None
    with pytest.raises(ValueError, match="ema_decay"):
        BCConfig(ema_decay=1.0)

    bc = BCConfig(ema_decay=0.9)
    straight = _runner(tmp_path / "a", 200, bc=bc)
    straight.learn()
    exported = load_checkpoint(tmp_path / "a" / "ckpt").path / "policy"
    from policies import load_policy
    saved = load_policy(exported).state_dict()
    avg, trained = straight.algo.ema.state_dict(), straight.algo.policy.state_dict()
    assert all(torch.equal(saved[k], avg[k]) for k in avg)
    assert any(not torch.equal(avg[k], trained[k]) for k in avg)  # the average, not the last weights
    _runner(tmp_path / "b", 100, bc=bc).learn()
    resumed = _runner(tmp_path / "b", 200, bc=bc)
    resumed.restore(load_checkpoint(tmp_path / "b" / "ckpt"))
    resumed.learn()
    assert all(torch.equal(a, b) for a, b in zip(avg.values(), resumed.algo.ema.state_dict().values(), strict=True))
    without = {k: v for k, v in straight.algo.state_dict().items() if k != "ema"}  # a run trained without one
    with pytest.raises(ValueError, match="ema_decay"):
        _runner(tmp_path / "c", 20, bc=bc).algo.load_state_dict(without)
