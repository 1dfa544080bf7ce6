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


def _runner(tmp_path, total_updates: int, data: dict | None = None) -> OfflineRunner:
    torch.manual_seed(0)
    policy = GaussianPolicy(GaussianPolicyConfig(obs_dim=4, action_dim=2, hidden_dims=[32, 32], init_std=0.5))
    cfg = OfflineRunnerConfig(total_updates=total_updates, updates_per_iteration=20, checkpoint_every=1)
    return OfflineRunner(BC(policy, BCConfig()), TensorSampler(data or _data(), batch_size=64, seed=1), cfg,
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
