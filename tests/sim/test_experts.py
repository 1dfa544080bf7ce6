"""The scripted IK experts solve their tasks: at least 99 of 100 seeded episodes each (the README's claim)."""

import pytest
import torch

from policies import keys
from sim.config import SimConfig
from sim.experts import make_expert
from sim.registry import make_env
from sim.tasks.so101_lift import LiftConfig


def first_episode_successes(task: str, num_envs: int = 100, seed: int = 0, task_cfg=None) -> torch.Tensor:
    """bool [num_envs]: whether each env's first episode after ``reset(seed)`` succeeded. Exactly one episode per
    env, so short (successful) episodes count no more often than long ones."""
    env = make_env(task, SimConfig(num_envs=num_envs, num_threads=2, seed=seed), task_cfg)
    expert = make_expert(env)
    obs, _ = env.reset(seed=seed)
    expert.reset()
    finished = torch.zeros(num_envs, dtype=torch.bool)
    success = torch.zeros(num_envs, dtype=torch.bool)
    for _ in range(env.max_episode_length):
        obs, _, terminated, truncated, info = env.step(expert.act(obs))
        done = (terminated | truncated).cpu()
        first = done & ~finished
        if first.any():
            success[first] = info[keys.EPISODE][keys.EP_SUCCESS].cpu()[first]
            finished |= done
        if finished.all():
            break
        expert.reset(done.nonzero().flatten())  # envs past their first episode go on; they are not counted
    env.close()
    assert finished.all(), "every episode ends within the time limit"
    return success


@pytest.mark.parametrize("task", ["so101_reach", "so101_lift", "so101_push"])
def test_expert_success_rate(task):
    wins = int(first_episode_successes(task).sum())
    assert wins >= 99, f"{task} expert succeeded in {wins} of 100 episodes"


def test_lift_expert_with_the_gripper_as_an_opening():
    """PPO's lift recipe maps the gripper's action onto its opening (``delta_absolute_gripper``); the expert's joint
    targets go through the same mapping's inverse and still lift the cube."""
    wins = int(first_episode_successes("so101_lift", task_cfg=LiftConfig(action_mode="delta_absolute_gripper")).sum())
    assert wins >= 99, f"so101_lift expert succeeded in {wins} of 100 episodes with delta_absolute_gripper"


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


def test_expert_acts_from_the_policy_observation_alone():
    """Teleoperator-shaped: the expert holds no env and reads named observation parts only; given just the policy
    group (what a gymnasium user holds) it still solves reach."""
    env = make_env("so101_reach", SimConfig(num_envs=4, seed=0))
    expert = make_expert(env)
    assert not any(v is env or v is env.physics for v in vars(expert).values())
    obs, _ = env.reset(seed=0)
    solved = torch.zeros(4, dtype=torch.bool)
    for _ in range(env.max_episode_length):
        obs, _, terminated, truncated, info = env.step(expert.act({keys.POLICY: obs[keys.POLICY]}))
        done = terminated | truncated
        if done.any():
            solved |= done & info[keys.EPISODE][keys.EP_SUCCESS]
            expert.reset(done.nonzero().flatten())
        if solved.all():
            break
    assert solved.all()
