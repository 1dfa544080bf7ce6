"""The end of ``MujocoFamilyEnv.step`` on the CPU as one compiled pass: faults, terminations, episode bookkeeping.

After the physics and the task's reward terms, ``step`` combines a handful of [N] tensors: the fault masks, the
terminations (faults, falls, success), the reward's sanitising, the episode tracker's sums, time-outs and the
episodes that ended. As torch ops that is ~15 dispatches of ~3 us each on N = 64 bools and floats, ~40 us of
humanoid_walk's env step at N = 64 (its physics ~1.75 ms): the share of the step outside the physics call that
``benchmarks/sim_throughput.py`` measures. ``end_of_step_cpu`` is one loop over the envs; ``end_of_step_torch``
stays the reference (what runs on MJX and Warp devices), and ``tests/sim/test_step_bookkeeping.py`` holds the two to
the same outputs, faults included. Nothing is computed in another order: the same numbers come out bit for bit.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np
import torch

from robot_rl.env import EpisodeTracker


@numba.njit(cache=True)
def _end_of_step(reward: np.ndarray, success: np.ndarray, terminated: np.ndarray, nonfinite: np.ndarray,
                 too_fast: np.ndarray, diverged: np.ndarray, bad: np.ndarray, terminate_on_success: bool,
                 returns: np.ndarray, lengths: np.ndarray, successes: np.ndarray, max_len: int,
                 success_out: np.ndarray, terminated_out: np.ndarray, truncated: np.ndarray, faulted: np.ndarray,
                 done: np.ndarray) -> tuple[int, int, int, int]:
    """Writes the outputs (and ``reward`` in place); returns the counts (NaN, diverged, faulted, done)."""
    n_nan, n_diverged, n_faulted, n_done = 0, 0, 0, 0
    has_bad = bad.shape[0] > 0
    for i in range(reward.shape[0]):
        div = diverged[i] or too_fast[i]
        fault = nonfinite[i] or div or (has_bad and bad[i])
        n_nan += nonfinite[i]
        n_diverged += div and not nonfinite[i]
        n_faulted += fault
        faulted[i] = fault
        ok = success[i] and not fault
        success_out[i] = ok
        term = terminated[i] or fault or (terminate_on_success and success[i])
        terminated_out[i] = term
        r = reward[i]
        if fault or not math.isfinite(r):
            r = np.float32(0.0)
        reward[i] = r
        returns[i] += r
        lengths[i] += 1
        successes[i] = successes[i] or ok
        trunc = lengths[i] >= max_len and not term
        truncated[i] = trunc
        done[i] = term or trunc
        n_done += term or trunc
    return n_nan, n_diverged, n_faulted, n_done


class StepEnd(NamedTuple):
    """What ``MujocoFamilyEnv.step`` needs after the physics and the reward: bool [N] masks and counts."""

    success: torch.Tensor  # the task's success, false where the env faulted
    terminated: torch.Tensor  # the task's terminations, faults, and success where it ends an episode
    truncated: torch.Tensor  # time-outs of episodes that did not terminate
    faulted: torch.Tensor  # non-finite state, divergence (or joint speeds past the limit), or a non-finite action
    done: torch.Tensor  # terminated | truncated
    n_done: int
    n_faulted: int
    n_nan: int  # faulted envs with non-finite state
    n_diverged: int  # faulted envs that diverged with finite state


def end_of_step_torch(reward: torch.Tensor, success: torch.Tensor, terminated: torch.Tensor,
                      nonfinite: torch.Tensor, too_fast: torch.Tensor, diverged: torch.Tensor,
                      bad: torch.Tensor | None, terminate_on_success: bool, episodes: EpisodeTracker,
                      max_len: int) -> StepEnd:
    """The reference, in torch ops on any device: ``reward`` [N] is sanitised in place (0 where non-finite or
    faulted) and ``episodes`` advanced by one step; the inputs are bool [N] masks (``bad``: None when every action
    was finite). The input tensors are not modified (a task may hand out cached ones)."""
    diverged = diverged | too_fast
    faulted = nonfinite | diverged
    if bad is not None:
        faulted = faulted | bad
    n_faulted = int(faulted.sum())  # rare: the masking below runs only then
    n_nan = n_diverged = 0
    if n_faulted:
        n_nan, n_diverged = int(nonfinite.sum()), int((diverged & ~nonfinite).sum())
        terminated = terminated | faulted
    if terminate_on_success:
        terminated = terminated | success
    # A faulted env's reward and observation are meaningless: zero them so nothing non-finite escapes.
    torch.nan_to_num(reward, nan=0.0, posinf=0.0, neginf=0.0, out=reward)
    if n_faulted:
        reward.masked_fill_(faulted, 0.0)
        success = success & ~faulted
    episodes.add(reward, success)
    truncated = (episodes.lengths >= max_len) & ~terminated
    done = terminated | truncated
    return StepEnd(success, terminated, truncated, faulted, done, int(done.sum()), n_faulted, n_nan, n_diverged)


_NO_BAD = np.zeros(0, dtype=np.bool_)


def end_of_step_cpu(reward: torch.Tensor, success: torch.Tensor, terminated: torch.Tensor, nonfinite: torch.Tensor,
                    too_fast: torch.Tensor, diverged: torch.Tensor, bad: torch.Tensor | None,
                    terminate_on_success: bool, episodes: EpisodeTracker, max_len: int) -> StepEnd:
    """``end_of_step_torch`` for CPU tensors, in one compiled pass."""
    n = reward.shape[0]
    success_out, terminated_out, truncated, faulted, done = (torch.empty(n, dtype=torch.bool) for _ in range(5))
    n_nan, n_diverged, n_faulted, n_done = _end_of_step(
        reward.numpy(), success.numpy(), terminated.numpy(), nonfinite.numpy(), too_fast.numpy(), diverged.numpy(),
        _NO_BAD if bad is None else bad.numpy(), terminate_on_success, episodes.returns.numpy(),
        episodes.lengths.numpy(), episodes.successes.numpy(), int(max_len), success_out.numpy(),
        terminated_out.numpy(), truncated.numpy(), faulted.numpy(), done.numpy())
    return StepEnd(success_out, terminated_out, truncated, faulted, done, n_done, n_faulted, n_nan, n_diverged)
