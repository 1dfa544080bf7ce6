"""Success rates are exact shares: 45 of 50 episodes is 0.9, at a 0.9 threshold (a float32 mean read 0.8999999761)."""

from __future__ import annotations

import pytest
import torch

from policies import keys
from robot_rl.evaluation import evaluate
from robot_rl.runners.common import EpisodeStats, RunLimits, should_stop
from tests._toy_envs import PointMassEnv


def test_evaluate_reports_45_of_50_as_exactly_0_9():
    env = PointMassEnv(num_envs=50)
    steer = torch.ones(50)
    steer[45:] = -1.0  # the last five envs are pushed away from the origin: they time out without success

    def act(obs):
        x = obs[keys.POLICY]
        return (-10.0 * x * steer[:, None]).clamp(-1.0, 1.0) + (steer[:, None] < 0).float() * torch.sign(x)

    r = evaluate(env, act, 50, seed=0)
    assert r.num_episodes == 50 and r.success_rate == 0.9 and r.success_rate >= 0.9


def test_a_window_of_180_successes_in_200_reaches_stop_success_rate_0_9():
    stats = EpisodeStats(window=200)
    success = torch.zeros(200)
    success[:180] = 1.0
    info = {keys.EPISODE: {keys.EP_RETURN: torch.zeros(200), keys.EP_LENGTH: torch.ones(200),
                           keys.EP_SUCCESS: success}}
    stats.add(info, torch.ones(200, dtype=torch.bool))
    assert stats.summary()["episode/success_rate"] == 0.9
    assert should_stop(RunLimits(total_steps=10**9, stop_success_rate=0.9), stats.summary(), 0, 0.0)
    assert not should_stop(RunLimits(total_steps=10**9, stop_success_rate=0.905), stats.summary(), 0, 0.0)


def test_evaluate_takes_each_envs_first_episodes_not_whichever_end_first():
    """7 episodes over 3 envs: 3 from env 0 (steered to the origin: short successes) and 2 from each of envs 1-2
    (pushed away: 40-step time-outs). Taking whichever episodes end first would fill the count with env 0's."""
    env = PointMassEnv(num_envs=3)
    away = torch.tensor([1.0, -1.0, -1.0])

    def act(obs):
        x = obs[keys.POLICY]
        return (-10.0 * x * away[:, None]).clamp(-1.0, 1.0) + (away[:, None] < 0).float() * torch.sign(x)

    r = evaluate(env, act, 7, seed=0)
    assert r.num_episodes == 7 and r.success_rate == 3 / 7
    assert 4 * 40 / 7 < r.mean_length <= (4 * 40 + 3 * 10) / 7  # env 0's successes take 1-10 steps
    assert r.std_return > 0  # short successes and long time-outs
    one = evaluate(env, act, 1, seed=0)  # env 0's first episode alone
    assert (one.num_episodes, one.success_rate, one.std_return) == (1, 1.0, 0.0) and one.mean_length <= 10
    two = evaluate(env, act, 2, seed=0)  # a success and a time-out: their returns differ
    assert two.success_rate == 0.5 and two.std_return > 0
    with pytest.raises(ValueError, match="num_episodes must be >= 1"):
        evaluate(env, act, 0, seed=0)
