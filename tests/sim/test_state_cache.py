"""``SimState.derived``: what tasks memoise from the sensor readings is recomputed whenever the backend publishes
new readings (physics step, forward after a reset, a restored state dict), on real MuJoCo envs."""

import torch

from sim.config import SimConfig
from sim.registry import make_env
from sim.tasks.so101_lift import CUBE_HALF
from sim.tasks.so101_pick import COLOURS, cube_name


def _lift(n: int = 2):
    env = make_env("so101_lift", SimConfig(num_envs=n, num_threads=1))
    env.reset(seed=0)
    return env


def _raise_cube(env, height: float) -> None:
    """Lift every env's cube to ``height`` m above its resting height, at rest, and recompute the sensors."""
    state, a = env.physics.state, env.task.cube_qadr
    state.qpos[:, a + 2] = CUBE_HALF + height
    state.qvel.zero_()
    env.physics.forward(torch.arange(env.num_envs))


def test_derived_computes_once_until_invalidated():
    state = _lift().physics.state
    calls = []

    def compute():
        calls.append(1)
        return torch.ones(3)

    first = state.derived("k", compute)
    assert state.derived("k", compute) is first and len(calls) == 1
    state.invalidate()
    assert state.derived("k", compute) is not first and len(calls) == 2


def test_memoised_values_follow_forward_step_and_restore():
    env = _lift()
    task, state = env.task, env.physics.state

    _raise_cube(env, 0.10)
    assert torch.allclose(task._height(state), torch.full((2,), 0.10))
    snapshot = env.physics.state_dict()

    _raise_cube(env, 0.03)  # forward publishes new readings: the memoised height must not be the old one
    assert torch.allclose(task._height(state), torch.full((2,), 0.03))

    env.physics.load_state_dict(snapshot)
    assert torch.allclose(task._height(state), torch.full((2,), 0.10))

    before = task._height(state).clone()
    env.physics.step(state.ctrl.clone(), 20)  # the cube falls for 20 physics steps
    after = task._height(state)
    fresh = state.sensor("cube_pos")[:, 2].float() - CUBE_HALF
    assert torch.equal(after, fresh) and bool((after < before - 1e-3).all())


def test_humanoid_fall_is_recomputed_after_a_reset_forward():
    env = make_env("humanoid_walk", SimConfig(num_envs=2, num_threads=1))
    env.reset(seed=0)
    task, state = env.task, env.physics.state
    assert not task.terminated(state).any()  # memoised while standing
    state.qpos[:, task.base_qpos_adr + 2] = 0.05  # the pelvis on the floor
    env.physics.forward(torch.arange(2))
    assert task.terminated(state).all()
    lin_vel, _, _ = task._base(state)
    assert torch.equal(lin_vel, state.sensor("base_lin_vel").float())


def test_pick_memoises_the_cubes_but_not_which_cube_is_named():
    """The named colour is redrawn at reset, outside the physics: changing it must change the reward at once."""
    env = make_env("so101_pick", SimConfig(num_envs=3, num_threads=1))
    env.reset(seed=0)
    task, state = env.task, env.physics.state
    before = task.reward_terms(state, torch.zeros(3, 6))["reach"]
    task.target.copy_((task.target + 1) % 3)  # name another cube, no physics step
    after = task.reward_terms(state, torch.zeros(3, 6))["reach"]
    grasp = state.sensor("grasp_pos").float()
    cubes = torch.stack([state.sensor(f"{cube_name(c)}_pos").float() for c in COLOURS], dim=1)
    named = cubes[torch.arange(3), task.target]
    torch.testing.assert_close(after, -torch.linalg.norm(named - grasp, dim=1))
    assert not torch.allclose(before, after)
