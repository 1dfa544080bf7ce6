"""benchmarks/data_parallel.py's summary and launch commands, by hand (no training)."""

from pathlib import Path

from benchmarks.data_parallel import command, median_or_budget


def test_a_run_that_never_reached_90_counts_at_the_budget():
    runs = [{"env_steps_to_90": 40_000}, {"env_steps_to_90": None}, {"env_steps_to_90": 50_000}]
    assert median_or_budget(runs, "env_steps_to_90", 300_000) == 50_000
    runs.append({"env_steps_to_90": None})  # two misses of four: the median is between 50 k and the budget
    assert median_or_budget(runs, "env_steps_to_90", 300_000) == 175_000


def test_arms_launch_one_process_or_torchrun_with_a_thread_each():
    one = command("1x64", 3, Path("/tmp/r"))
    assert "torch.distributed.run" not in one and "sim.num_envs=64" in one and "seed=3" in one
    two = command("2x32", 3, Path("/tmp/r"))
    assert "--nproc-per-node=2" in two and "sim.num_envs=32" in two and two[-1] == "sim.num_threads=1"
    sac_one, sac_two = command("1x16", 0, Path("/tmp/r"), "flashsac"), command("2x8", 0, Path("/tmp/r"), "flashsac")
    assert "algo=flashsac" in sac_one and "torch_threads=1" not in sac_one  # its recipe's 2 threads in one process
    assert "torch_threads=1" in sac_two and "total_steps=200000" in sac_two  # a core each, FlashSAC's budget
