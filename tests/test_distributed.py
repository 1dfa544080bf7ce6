"""Data-parallel training under torchrun (robot_rl/distributed.py): the collectives against one process's numbers
on the pooled data, and `robot-rl train` over two processes end to end (one run folder, every rank's envs in its
checkpoints, an exact resume, the refusals)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from robot_rl.checkpoint import flatten_tree, load_checkpoint
from robot_rl.cli.main import main
from tests._torchrun import torchrun

SMALL = ["task=so101_reach", "sim.num_envs=8", "sim.num_threads=1", "eval.enabled=false", "logger.progress=false",
         "logger.tensorboard=false", "checkpoint_every=2"]
ITERATION = 24 * 8 * 2  # env steps per iteration: T x envs per rank x ranks


def test_collectives_match_one_process_on_the_pooled_data():
    """Gradients, observation statistics and advantages averaged over two ranks equal one process's on both ranks'
    data; broadcast, gather and the divergence check (a one-ulp difference caught) do what they say."""
    out = torchrun("tests/_dist_worker.py")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "gradients", "ok", "normalizer", "ok", "advantages", "ok",
                                  "same_and_broadcast"]


def _algo_tensors(path: Path) -> dict[str, torch.Tensor]:
    return flatten_tree(load_checkpoint(path).state["algo"])[0]


def test_two_process_ppo_run_checkpoints_every_rank_and_resumes_exactly(tmp_path, capsys):
    whole, split = tmp_path / "whole", tmp_path / "split"
    train = ["-m", "robot_rl.cli.main", "train", *SMALL]
    out = torchrun(*train, f"total_steps={4 * ITERATION}", f"run_dir={whole}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"trained {4 * ITERATION} env steps" in out.stderr  # every rank's envs counted, reported once
    assert out.stderr.count("trained ") == 1
    ckpt = load_checkpoint(whole / "checkpoints" / "latest")
    assert ckpt.meta["env_steps"] == 4 * ITERATION and ckpt.meta["world_size"] == 2
    (other,) = ckpt.state["other_ranks"]  # rank 1's envs, observations, RNGs and counters
    # each rank keeps half of the 200-episode success window: pooled, the run's last 200 episodes
    assert len(ckpt.state["runner"]["stats"]["returns"]) == len(other["runner"]["stats"]["returns"]) == 100
    assert other["runner"]["iteration"] == ckpt.state["runner"]["iteration"] == 4
    assert not torch.equal(other["obs"]["policy"], ckpt.state["obs"]["policy"])  # its own envs (its own seed)
    assert not torch.equal(other["rng"]["torch"], ckpt.state["rng"]["torch"])

    first = torchrun(*train, f"total_steps={2 * ITERATION}", f"run_dir={split}")
    assert first.returncode == 0, first.stderr[-3000:]
    again = torchrun(*train, f"total_steps={4 * ITERATION}", f"resume={split}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"at iteration 2 ({2 * ITERATION} env steps)" in again.stderr
    a, b = _algo_tensors(whole / "checkpoints" / "latest"), _algo_tensors(split / "checkpoints" / "latest")
    # the actor's and critic's observation statistics hold every observation of both ranks
    assert a["/policy/processor.normalizers.policy.count"].item() == a["/critic/normalizer.count"].item() == (
        4 * ITERATION)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bitwise: the resume continued
    rank1 = [flatten_tree(load_checkpoint(d / "checkpoints" / "latest").state["other_ranks"])[0]
             for d in (whole, split)]
    assert all(torch.equal(rank1[0][k], rank1[1][k]) for k in rank1[0])  # and so did rank 1's envs

    # one process cannot continue two processes' envs: refused, naming the launch that can
    code = main(["train", *SMALL, f"total_steps={6 * ITERATION}", f"resume={whole}", f"run_dir={tmp_path / 'one'}"])
    err = capsys.readouterr().err
    assert code == 2 and "written by a run of 2 process(es)" in err and "--nproc-per-node 2" in err
    assert not (tmp_path / "one").exists()  # refused before anything was written


SAC = ["task=so101_reach", "algo=flashsac", "sim.num_envs=2", "sim.num_threads=1", "torch_threads=1",
       "algo.steps_per_iteration=8", "algo.learning_starts=24", "algo.batch_size=32", "algo.buffer_size=2000",
       "eval.enabled=false", "logger.progress=false", "logger.tensorboard=false", "checkpoint_every=2"]
SAC_ITERATION = 8 * 2 * 2  # vector steps x envs per rank x ranks


def test_two_process_flashsac_keeps_each_ranks_noise_and_resumes_exactly(tmp_path):
    """FlashSAC over two processes: the networks, optimizers and BatchNorm statistics agree at every checkpoint (the
    run would stop with RanksDivergedError otherwise), each rank's exploration noise and reward statistics stay its
    own and are checkpointed, and a 2 + 2-iteration resume equals 4 iterations straight, bitwise."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    train = ["-m", "robot_rl.cli.main", "train", *SAC]
    out = torchrun(*train, f"total_steps={4 * SAC_ITERATION}", f"run_dir={whole}")
    assert out.returncode == 0, out.stderr[-3000:]
    ckpt = load_checkpoint(whole / "checkpoints" / "latest")
    (other,) = ckpt.state["other_ranks"]
    assert set(other["algo"]) == {"noise", "return_scale"}  # rank 1's own part of the learner
    assert not torch.equal(other["algo"]["noise"]["noise"], ckpt.state["algo"]["noise"]["noise"])
    assert ckpt.state["algo"]["num_updates"] > 0
    first = torchrun(*train, f"total_steps={2 * SAC_ITERATION}", f"run_dir={split}")
    assert first.returncode == 0, first.stderr[-3000:]
    again = torchrun(*train, f"total_steps={4 * SAC_ITERATION}", f"resume={split}")
    assert again.returncode == 0, again.stderr[-3000:]
    a, b = _algo_tensors(whole / "checkpoints" / "latest"), _algo_tensors(split / "checkpoints" / "latest")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rank1 = [flatten_tree(load_checkpoint(d / "checkpoints" / "latest").state["other_ranks"])[0]
             for d in (whole, split)]
    assert all(torch.equal(rank1[0][k], rank1[1][k]) for k in rank1[0])


@pytest.mark.parametrize("var", ["RANK", "LOCAL_RANK"])
def test_incomplete_torchrun_variables_are_refused(monkeypatch, var):
    from robot_rl.distributed import from_environment

    monkeypatch.setenv("WORLD_SIZE", "2")
    for v in ("RANK", "LOCAL_RANK"):
        monkeypatch.setenv(v, "0")
    monkeypatch.delenv(var)
    with pytest.raises(ValueError, match=f"'{var}'.*torchrun"):
        from_environment()


def test_each_process_takes_its_own_gpu_where_the_run_asks_for_cuda():
    """Every process reads the same command line: ``device=cuda`` (or ``cuda:0``) means the process's own GPU,
    cuda:LOCAL_RANK, for the learner and the simulator alike; the CPU stays the CPU. (No GPU here: the mapping.)"""
    from robot_rl.distributed import ProcessGroup, rank_device

    group = ProcessGroup(rank=3, world_size=4, local_rank=1, device="cuda:1")
    assert rank_device("cuda", group) == rank_device("cuda:0", group) == torch.device("cuda", 1)
    assert rank_device("cpu", group) == torch.device("cpu")
    assert rank_device("cuda:2", None) == torch.device("cuda", 2)  # one process: as given
