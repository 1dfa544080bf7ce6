"""The learner on a GPU without code changes (skipped where CUDA is absent, as in CI)."""

import pytest
import torch

from robot_rl.checkpoint import CheckpointManager, load_checkpoint
from robot_rl.evaluation import evaluate
from robot_rl.logging import LoggerConfig, RunLogger
from robot_rl.runners.on_policy import OnPolicyRunner, OnPolicyRunnerConfig
from tests._toy_envs import PointMassEnv
from tests.test_ppo import make_ppo

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
QUIET = LoggerConfig(progress=False, tensorboard=False)


def _runner(env, tmp_path, total_steps):
    torch.manual_seed(0)
    algo = make_ppo(env, device="cuda")
    cfg = OnPolicyRunnerConfig(num_steps=16, total_steps=total_steps, checkpoint_every=1, success_window=64)
    return OnPolicyRunner(env, algo, cfg, RunLogger(tmp_path, QUIET), CheckpointManager(tmp_path / "ckpt"), {})


@pytest.mark.parametrize("env_device", ["cuda", "cpu"])
def test_ppo_learns_with_the_learner_on_cuda(env_device, tmp_path):
    runner = _runner(PointMassEnv(num_envs=64, device=env_device), tmp_path, 64 * 16 * 25)
    runner.learn()
    assert runner.buffer.action.device.type == "cuda"
    policy = runner.algo.policy.eval()
    result = evaluate(PointMassEnv(num_envs=32, seed=1, device=env_device),
                      lambda o: policy.act({k: v.cuda() for k, v in o.items()}), 64, seed=123)
    assert result.success_rate >= 0.9, result


def test_resume_on_cuda_matches(tmp_path):
    full = _runner(PointMassEnv(num_envs=64, device="cuda"), tmp_path / "a", 64 * 16 * 6)
    full.learn()
    part = _runner(PointMassEnv(num_envs=64, device="cuda"), tmp_path / "b", 64 * 16 * 3)
    part.learn()
    resumed = _runner(PointMassEnv(num_envs=64, device="cuda"), tmp_path / "b", 64 * 16 * 6)
    resumed.restore(load_checkpoint(tmp_path / "b" / "ckpt"))
    resumed.learn()
    for (name, a), b in zip(full.algo.policy.state_dict().items(), resumed.algo.policy.state_dict().values(),
                            strict=True):
        assert a.device.type == "cuda"
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)
