"""The scripted IK experts solve their tasks: >= 95% success over 100 seeded episodes each."""

import pytest
import torch

from policies import keys
from sim.core import SimConfig
from sim.experts import make_expert
from sim.registry import make_env


def success_rate(task: str, episodes: int = 100, num_envs: int = 20, seed: int = 0) -> float:
    env = make_env(task, SimConfig(num_envs=num_envs, num_threads=2, seed=seed))
    expert = make_expert(env)
    env.reset(seed=seed)
    outcomes: list[bool] = []
    started = torch.ones(num_envs, dtype=torch.bool)  # count only episodes that began after reset(seed)
    while len(outcomes) < episodes:
        _, _, terminated, truncated, info = env.step(expert.act())
        done = terminated | truncated
        for i in done.nonzero().flatten().tolist():
            if started[i]:
                outcomes.append(bool(info[keys.EPISODE][keys.EP_SUCCESS][i]))
    env.close()
    return sum(outcomes[:episodes]) / episodes


@pytest.mark.parametrize("task", ["so101_reach", "so101_lift", "so101_push"])
def test_expert_success_rate(task):
    rate = success_rate(task)
    assert rate >= 0.95, f"{task} expert succeeded in {rate:.0%} of 100 episodes"


def test_random_actions_rarely_succeed():
    """The success signal is not trivially on: random actions do not lift the cube."""
    env = make_env("so101_lift", SimConfig(num_envs=16))
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    wins = 0
    for _ in range(150):
        _, _, _, _, info = env.step(torch.rand(16, 6, generator=g) * 2 - 1)
        wins += int(info[keys.SUCCESS].sum())
    assert wins == 0
