"""The SO-101 reward terms, success and termination against values worked out by hand on constructed states.

Each state is a real env's state with the cube (and target or goal) written in, the sensors recomputed; the
positions the terms should see come from MuJoCo's own forward kinematics on a separate ``MjData``, so the checks
do not read the sensors they test.
"""

import math

import mujoco
import pytest
import torch

from policies import keys
from sim.config import SimConfig
from sim.registry import make_env
from sim.tasks.so101_lift import CUBE_HALF


def _env(task: str, n: int):
    env = make_env(task, SimConfig(num_envs=n, num_threads=1))
    env.reset(seed=0)
    return env


def _site(env, name: str) -> torch.Tensor:
    """float64 [N, 3]: world position of site ``name`` by forward kinematics of each env's current qpos."""
    model, data = env.physics.model, mujoco.MjData(env.physics.model)
    out = []
    for q in env.physics.state.qpos.double().cpu().numpy():
        data.qpos[:] = q
        mujoco.mj_kinematics(model, data)
        out.append(torch.tensor(data.site(name).xpos))
    return torch.stack(out)


def _place_cube(env, xyz: list[list[float]]) -> torch.Tensor:
    """Put each env's free cube upright at ``xyz`` [N, 3] (m) and recompute the sensors; returns it float64."""
    task, state = env.task, env.physics.state
    pose = torch.tensor([[*p, 1.0, 0.0, 0.0, 0.0] for p in xyz], dtype=state.qpos.dtype)
    state.qpos[:, task.cube_qadr:task.cube_qadr + 7] = pose.to(state.qpos.device)
    state.qvel.zero_()
    env.physics.forward(torch.arange(env.num_envs))
    return torch.tensor(xyz, dtype=torch.float64)


def _check(terms: dict[str, torch.Tensor], want: dict[str, list[float]]) -> None:
    assert set(terms) == set(want)
    for k, v in want.items():
        torch.testing.assert_close(terms[k].double().cpu(), torch.tensor(v, dtype=torch.float64), atol=2e-6, rtol=0,
                                   msg=k)


def test_so101_reach_terms_by_hand():
    """Targets 5 cm, 1 cm and 5 mm from the tool (success within 2 cm); distance = -d, near = exp(-d / 0.02) - 1,
    action_rate = -sum((a_t - a_{t-1})^2)."""
    env = _env("so101_reach", 3)
    task = env.task
    offsets = torch.tensor([[0.03, 0.0, 0.04], [0.0, 0.01, 0.0], [0.0, -0.003, 0.004]], dtype=torch.float64)
    task.target[:] = (_site(env, "ee") + offsets).float()
    task.prev_action[:] = torch.tensor([[0.0] * 6, [-0.5] * 6, [0.2, 0.1, 0.0, 0.0, 0.0, 0.0]])
    task.last_action[:] = torch.tensor([[0.5, 0, 0, 0, 0, -0.5], [0.5] * 6, [0.2, 0.1, 0.0, 0.0, 0.0, 0.0]])
    d = [0.05, 0.01, 0.005]
    _check(task.reward_terms(env.physics.state, task.last_action), {
        "distance": [-x for x in d],
        "near": [math.exp(-x / 0.02) - 1.0 for x in d],
        "success": [0.0, 1.0, 1.0],
        "action_rate": [-0.5, -6.0, 0.0],
    })
    assert task.success(env.physics.state).tolist() == [False, True, True]


def test_so101_lift_terms_by_hand():
    """reach = -|cube - grasp site|, grasp = both pads touching - 1, lift = -clamp(0.05 - h, 0, 0.05) / 0.05 with h
    the cube's height above its resting height; success = lifted 5 cm and held; pads = the share of the two pads
    touching - 1; near = exp(-|cube - grasp site| / 0.05) - 1; terminated = fell off the table."""
    env = _env("so101_lift", 5)
    task, state = env.task, env.physics.state
    cube = _place_cube(env, [[0.20, 0.00, CUBE_HALF],  # on the table, not held
                             [0.20, 0.05, CUBE_HALF + 0.02],  # held, 2 cm up
                             [0.22, -0.03, CUBE_HALF + 0.06],  # held, 6 cm up: success
                             [0.22, -0.03, CUBE_HALF + 0.06],  # as high, one pad touching only
                             [0.20, 0.00, -0.10]])  # fell off the table
    state.sensor("fixed_pad_contact")[:, 0] = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0], dtype=state.sensordata.dtype)
    state.sensor("moving_pad_contact")[:, 0] = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0], dtype=state.sensordata.dtype)
    reach = -(cube - _site(env, "grasp")).norm(dim=1)
    _check(task.reward_terms(state, torch.zeros(5, 6)), {
        "reach": reach.tolist(),
        "grasp": [-1.0, 0.0, 0.0, -1.0, -1.0],
        "lift": [-1.0, -0.6, 0.0, 0.0, -1.0],
        "success": [0.0, 0.0, 1.0, 0.0, 0.0],
        "pads": [-1.0, 0.0, 0.0, -0.5, -1.0],
        "near": [math.exp(r / 0.05) - 1.0 for r in reach.tolist()],
    })
    assert task.terminated(state).tolist() == [False, False, False, False, True]


def test_so101_push_terms_by_hand():
    """reach = -|cube - grasp site|, push = -(cube-to-goal distance in the table plane), success within 2.5 cm of
    the goal in that plane; terminated = fell off the table."""
    env = _env("so101_push", 3)
    task, state = env.task, env.physics.state
    cube = _place_cube(env, [[0.20, 0.00, CUBE_HALF], [0.18, 0.02, CUBE_HALF], [0.25, 0.10, -0.10]])
    task.goal[:] = torch.tensor([[0.20, 0.08], [0.18 + 0.012, 0.02 + 0.016], [0.22, 0.06]])
    reach = -(cube - _site(env, "grasp")).norm(dim=1)
    _check(task.reward_terms(state, torch.zeros(3, 6)), {
        "reach": reach.tolist(),
        "push": [-0.08, -0.02, -0.05],
        "success": [0.0, 1.0, 0.0],
    })
    assert task.terminated(state).tolist() == [False, False, True]


@pytest.mark.parametrize("task", ["so101_reach", "so101_lift", "so101_push"])
def test_step_reward_is_the_weighted_sum_of_the_terms(task):
    """A step's reward is sum_k w_k * term_k with the config's weights, and ``reward/<k>`` logs the mean of
    w_k * term_k (the terms recomputed on the state the step left)."""
    env = _env(task, 4)
    action = torch.linspace(-0.6, 0.6, 24).reshape(4, 6)
    for _ in range(2):
        _, reward, terminated, truncated, info = env.step(action)
    assert not (terminated | truncated).any()  # no reset replaced the state the reward was computed on
    weights = env.task.cfg.reward_weights
    terms = env.task.reward_terms(env.physics.state, action)
    assert set(terms) == set(weights)
    torch.testing.assert_close(reward, sum(weights[k] * t.float() for k, t in terms.items()))
    for k, t in terms.items():
        assert info[keys.LOG][f"reward/{k}"] == pytest.approx(float((weights[k] * t.float()).mean()), abs=1e-6), k
