"""The runners' shared bookkeeping by hand: the rolling episode window, the stopping rule at each of its bounds, the
run limits' checks and torch's thread count around an update."""

from __future__ import annotations

import pytest
import torch

from policies import keys
from robot_rl.runners.common import EpisodeStats, RunLimits, should_stop, torch_threads


def _ended(returns: list[float], success: list[float], done: list[bool]) -> tuple[dict, torch.Tensor]:
    n = len(returns)
    info = {keys.EPISODE: {keys.EP_RETURN: torch.tensor(returns), keys.EP_LENGTH: torch.arange(1.0, n + 1),
                           keys.EP_SUCCESS: torch.tensor(success)}}
    return info, torch.tensor(done)


def test_the_window_holds_the_last_episodes_of_the_envs_that_ended():
    stats = EpisodeStats(window=3)
    stats.add(*_ended([1.0, 2.0, 3.0], [1.0, 0.0, 1.0], [True, False, True]))  # envs 0 and 2 ended
    assert stats.summary() == {"episode/count": 2.0}  # nothing but the count before the window is full
    stats.add({}, torch.tensor([True]))  # no episode info: nothing to add
    stats.add(*_ended([9.0, 9.0, 9.0], [1.0, 1.0, 1.0], [False, False, False]))  # nothing ended
    assert stats.count == 2
    stats.add(*_ended([10.0, 20.0, 30.0], [0.0, 0.0, 1.0], [False, True, True]))  # two more: 1, 3 | 20, 30
    # the last three: 3 (length 3, success), 20 (length 2, failure), 30 (length 3, success)
    assert stats.summary() == {"episode/return": pytest.approx(53.0 / 3), "episode/length": pytest.approx(8.0 / 3),
                               "episode/success_rate": 2.0 / 3, "episode/count": 4.0}
    back = EpisodeStats(window=3)
    back.load_state_dict(stats.state_dict())
    assert back.summary() == stats.summary()


def test_should_stop_at_each_limit_exactly():
    full = EpisodeStats(window=2)
    full.add(*_ended([0.0, 0.0], [1.0, 0.0], [True, True]))  # success rate 0.5
    steps = RunLimits(total_steps=1000)
    assert not should_stop(steps, full.summary(), 999, 1e9) and should_stop(steps, full.summary(), 1000, 0.0)
    minutes = RunLimits(total_steps=None, max_minutes=2.0)
    assert not should_stop(minutes, full.summary(), 10**12, 119.999) and should_stop(minutes, full.summary(), 0, 120.0)
    rate = RunLimits(total_steps=10**9, stop_success_rate=0.5)
    assert should_stop(rate, full.summary(), 0, 0.0)
    assert not should_stop(RunLimits(total_steps=10**9, stop_success_rate=0.51), full.summary(), 0, 0.0)
    assert not should_stop(rate, EpisodeStats(window=2).summary(), 0, 0.0)  # no rate before the window is full
    assert not should_stop(RunLimits(total_steps=10**9), full.summary(), 0, 0.0)  # no rate rule


@pytest.mark.parametrize("kw,match", [
    ({"checkpoint_every": 0}, "checkpoint_every and success_window must be >= 1"),
    ({"success_window": 0}, "checkpoint_every and success_window must be >= 1"),
    ({"total_steps": None}, "needs a stopping rule"),
    ({"total_steps": 0}, "total_steps must be >= 1"),
    ({"max_minutes": 0.0}, "max_minutes must be > 0"),
    ({"stop_success_rate": 0.0}, r"stop_success_rate must be in \(0, 1\]"),
    ({"stop_success_rate": 1.01}, r"stop_success_rate must be in \(0, 1\]"),
])
def test_run_limits_refuse_values_past_their_bounds(kw, match):
    with pytest.raises(ValueError, match=match):
        RunLimits(**kw)


def test_run_limits_accept_their_bounds():
    RunLimits(total_steps=1, checkpoint_every=1, success_window=1, stop_success_rate=1.0)
    RunLimits(total_steps=None, max_minutes=0.01)
    RunLimits(total_steps=1, stop_success_rate=0.001)  # any rate above 0


def test_torch_threads_inside_the_block_and_restored_after():
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with torch_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(other):
        raise RuntimeError("an update failed")
    assert torch.get_num_threads() == before  # restored on an error too
    with torch_threads(None):
        assert torch.get_num_threads() == before
