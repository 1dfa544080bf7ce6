"""Learning checks (``make test-slow``): the README's headline results, reproduced through the CLI on the CPU.

Each trains with ``robot-rl train`` (``robot_rl.cli.main.main``) until the rolling training success reaches the
stop rate or the step budget runs out, then reads the seeded evaluation (100 episodes) from the run's eval.json.
"""

import json
from pathlib import Path

import pytest

from robot_rl.cli.main import main

pytestmark = pytest.mark.slow


def _train(run_dir: Path, args: list[str]) -> dict:
    assert main(["train", *args, f"run_dir={run_dir}", "logger.progress=false", "logger.tensorboard=false",
                 "eval.video=false"]) == 0
    return json.loads((run_dir / "eval.json").read_text())


@pytest.mark.timeout(1800)
def test_ppo_solves_so101_reach(tmp_path):
    """The main job (``make train``: PPO's defaults, 300 k env steps): the README has 90 % training success after
    41.5 k env steps and a seeded evaluation of 100/100; here >= 90 % within 100 k env steps, and >= 90 % evaluated.
    (Stopped at 95 % training success, at 55 k env steps, the evaluation gave only 73 %: the budget is the job's.)"""
    result = _train(tmp_path / "run", ["task=so101_reach", "algo=ppo"])
    hit = result["time_to_success_90"]
    assert hit is not None and hit["env_steps"] <= 100_000, hit
    assert result["eval"]["success_rate"] >= 0.9, result["eval"]


@pytest.mark.timeout(1800)
def test_data_parallel_ppo_solves_so101_reach(tmp_path):
    """The main job split over two torchrun processes of 32 envs each (the same 64 envs and global minibatch):
    ``benchmarks/data_parallel.py`` has it at 90 % training success within the env steps below; here >= 90 % within
    150 k env steps, and >= 90 % evaluated (100 seeded episodes, by rank 0)."""
    from tests._torchrun import torchrun

    run = tmp_path / "run"
    out = torchrun("-m", "robot_rl.cli.main", "train", "task=so101_reach", "algo=ppo", "sim.num_envs=32",
                   "sim.num_threads=1", f"run_dir={run}", "logger.progress=false", "logger.tensorboard=false",
                   "eval.video=false", timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((run / "eval.json").read_text())
    hit = result["time_to_success_90"]
    assert hit is not None and hit["env_steps"] <= 150_000, hit
    assert result["eval"]["success_rate"] >= 0.9, result["eval"]


@pytest.mark.timeout(1800)
def test_flashsac_solves_so101_lift(tmp_path):
    """FlashSAC's CLI defaults on so101_lift: the README has 90 % training success at ~170 k env steps (~9 min)
    and a seeded evaluation of 97/100; here training stops at 90 % (at most 300 k env steps), >= 80 % evaluated."""
    result = _train(tmp_path / "run", ["task=so101_lift", "algo=flashsac", "stop_success_rate=0.9",
                                       "total_steps=300000"])
    assert result["time_to_success_90"] is not None, "training success never reached 90 % in 300 k env steps"
    assert result["eval"]["success_rate"] >= 0.8, result["eval"]
