"""Soak (RELIABILITY D4, nightly: ``pytest -m slow tests/sim/test_soak.py``, ~20 min on 2 cores): long runs must
not leak memory or file descriptors, nor slow down.

- The CPU simulator stepped 10 M env steps under uniform random actions (5 M so101_lift at N = 1024, whose episodes
  time out, and 5 M humanoid_walk at N = 256, whose episodes end in falls): resets, episode bookkeeping, the
  action sanitiser and the NaN guards run millions of times.
- ``robot-rl train`` (PPO so101_reach, 2 M env steps) as a user runs it, watched from outside: the runner, its
  logger, TensorBoard writer and checkpoints (every 50 iterations, the last 3 kept).

Criteria (D4): resident memory at the end within 5 % of a baseline taken after a warm-up (a tenth of the run), the
same number of open file descriptors, and no slowdown over 10 % (medians of the last three tenths against the
first three after the warm-up). Slowdown is measured against a reference inside the same moment, not the wall clock
alone: on this shared 2-core machine the same process's wall-clock speed drifted by 10-30 % within minutes (one
2 M-step run's env.step went from 103 to 134 us per env step and back, its CPU time with it), which would fail or
hide a slowdown of our own.
- The simulator: each tenth ends with a timed block of the soaked env's steps, then the same block length of a
  second env of the same task replaying the same state and actions every time (identical work): the soaked env's
  time over the reference's.
- ``robot-rl train``: its time outside env.step over its time inside, by the run's own clocks (the curve's wall_s
  and sim_s); a runner, logger or learner that slows adds to the first. The subnormal gradients of
  benchmarks/subnormal.py showed here (the ratio rose from 0.86 to 0.97 over 2 M env steps before the fix).
Wall-clock rates are printed beside.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sim.config import SimConfig
from sim.registry import make_env, task_config

SEGMENTS = 10  # the run in tenths: the first is the warm-up, the second the baseline


def rss_mib(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise ProcessLookupError(f"process {pid} has ended (no VmRSS)")


def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def check(label: str, rss: list[float], fds: list[int], slowness: list[float], wall_rates: list[float]) -> None:
    """D4's criteria on per-tenth samples (rss, fds: index 0 is the end of the warm-up; slowness, wall_rates: one per
    tenth after it)."""
    report = (f"{label}: RSS {[round(r) for r in rss]} MiB, fds {fds}, relative time per env step "
              f"{[round(r, 3) for r in slowness]}, env steps per wall-clock second {[round(r) for r in wall_rates]}")
    print(report)
    assert rss[-1] <= 1.05 * rss[0], f"resident memory grew by over 5 %: {report}"
    assert fds[-1] == fds[0], f"file descriptors leak: {report}"
    first, last = statistics.median(slowness[:3]), statistics.median(slowness[-3:])
    assert last <= 1.1 * first, f"slowed by over 10 %: {report}"


def timed_steps(env, steps: int, gen: torch.Generator) -> tuple[float, int]:
    """Seconds for ``steps`` steps of uniform random actions, and the episodes that ended."""
    done, start = 0, time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(torch.rand(env.num_envs, env.action_dim, generator=gen) * 2 - 1)
        done += int((terminated | truncated).sum())
    return time.perf_counter() - start, done


@pytest.mark.slow
@pytest.mark.parametrize(("task", "num_envs"), [("so101_lift", 1024), ("humanoid_walk", 256)])
def test_the_simulator_stepped_5m_times_keeps_its_memory_fds_and_speed(task, num_envs):
    steps = 5_000_000
    per_segment = steps // SEGMENTS // num_envs
    probe = per_segment // 8  # the timed block at the end of each tenth
    env, reference = (make_env(task, SimConfig(num_envs=num_envs, num_threads=2, seed=0), task_config(task, {}))
                      for _ in range(2))
    env.reset(seed=0)
    reference.reset(seed=1)
    timed_steps(reference, probe, torch.Generator().manual_seed(1))  # mid-episode, as the soaked env will be
    snapshot = reference.state_dict()
    gen = torch.Generator().manual_seed(0)
    rss, fds, slowness, wall_rates, done = [], [], [], [], 0
    for segment in range(SEGMENTS):
        start = time.perf_counter()
        done += timed_steps(env, per_segment - probe, gen)[1]
        soaked_s, ended = timed_steps(env, probe, gen)
        wall_s, done = time.perf_counter() - start, done + ended
        reference.load_state_dict(snapshot)
        reference_s = timed_steps(reference, probe, torch.Generator().manual_seed(2))[0]
        if segment:  # the first tenth warms up (allocator pools, lazily built buffers)
            slowness.append(soaked_s / reference_s)
            wall_rates.append(per_segment * num_envs / wall_s)
        rss.append(rss_mib())
        fds.append(open_fds())
    env.close()
    reference.close()
    assert done > 1000  # episodes ended and reset all along
    check(f"{task} N={num_envs}", rss, fds, slowness, wall_rates)


@pytest.mark.slow
def test_robot_rl_train_for_2m_env_steps_keeps_its_memory_fds_and_speed(tmp_path):
    total = 2_000_000
    cmd = [str(Path(sys.executable).with_name("robot-rl")), "train", "task=so101_reach", "algo=ppo",
           f"total_steps={total}", f"run_dir={tmp_path / 'run'}", "eval.enabled=false", "logger.progress=false"]
    log = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log,
                            env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
    curve = tmp_path / "run" / "curve.jsonl"
    samples = []  # (env steps so far, RSS, fds), every second
    while proc.poll() is None:
        time.sleep(1.0)
        try:
            lines = curve.read_text().splitlines() if curve.exists() else []
            steps = json.loads(lines[-1])["env_steps"] if lines else 0
            samples.append((steps, rss_mib(proc.pid), open_fds(proc.pid)))
        except (FileNotFoundError, ProcessLookupError, json.JSONDecodeError):  # the run ended, or a line half-written
            continue
    log.close()
    assert proc.returncode == 0, (tmp_path / "stderr.txt").read_text()[-2000:]
    rows = [json.loads(line) for line in curve.read_text().splitlines()]
    assert rows[-1]["env_steps"] >= total
    # per tenth of the run after the first: the peak RSS and the fewest open fds (a checkpoint being written holds
    # a few for a moment; a leak raises the floor), and by the curve's own clocks its time outside env.step over
    # its time inside, and its env steps per second
    rss, fds, slowness, wall_rates = [], [], [], []
    edges = [total * k / SEGMENTS for k in range(SEGMENTS + 1)]
    for k in range(1, SEGMENTS):
        inside = [s for s in samples if edges[k] <= s[0] < edges[k + 1]]
        assert inside, f"no sample between {edges[k]:.0f} and {edges[k + 1]:.0f} env steps"
        rss.append(max(s[1] for s in inside))
        fds.append(min(s[2] for s in inside))
    for k in range(1, SEGMENTS):
        a = next(r for r in rows if r["env_steps"] >= edges[k])
        b = next((r for r in rows if r["env_steps"] >= edges[k + 1]), rows[-1])
        wall, sim = b["wall_s"] - a["wall_s"], b["sim_s"] - a["sim_s"]
        slowness.append((wall - sim) / sim)
        wall_rates.append((b["env_steps"] - a["env_steps"]) / wall)
    check("robot-rl train PPO so101_reach", rss, fds, slowness, wall_rates)
