"""Named observation parts: every flat group of every task is named slice by slice, the names read the right
quantities, and the SO-101 tasks have a proprio-only group (what a real arm reports)."""

import itertools

import pytest
import torch

from policies import keys
from sim.config import SimConfig
from sim.registry import make_env, task_names


@pytest.mark.parametrize("task", task_names())
def test_parts_tile_each_flat_group_exactly(task):
    env = make_env(task, SimConfig(num_envs=2, num_threads=1))
    spec = env.obs_spec
    obs, _ = env.reset(seed=0)
    assert keys.POLICY in spec.parts and keys.CRITIC in spec.parts
    for group, parts in spec.parts.items():
        slices = sorted(parts.values())
        assert slices[0][0] == 0 and slices[-1][1] == spec.shapes[group][0], group
        assert all(a[1] == b[0] for a, b in itertools.pairwise(slices)), f"{group}: gaps or overlaps {slices}"
        assert obs[group].shape == (2, *spec.shapes[group])
    assert spec.to_json()[keys.POLICY]["parts"]["joint_pos"] == list(spec.parts[keys.POLICY]["joint_pos"])
    env.close()


@pytest.mark.parametrize("task", ["so101_reach", "so101_lift", "so101_push"])
def test_so101_parts_read_what_they_name(task):
    env = make_env(task, SimConfig(num_envs=3, num_threads=1))
    obs, _ = env.reset(seed=1)
    for _ in range(5):
        obs, *_ = env.step(torch.rand(3, 6) * 2 - 1)
    spec, state = env.obs_spec, env.physics.state
    joints = env.task.arm.qpos(state.qpos)
    assert obs[keys.PROPRIO].shape == (3, 6) and torch.equal(obs[keys.PROPRIO], joints)  # only the six joints
    for group in (keys.POLICY, keys.CRITIC):
        assert torch.equal(spec.part(obs, "joint_pos", [group]), joints)
        assert torch.equal(spec.part(obs, "last_action", [group]), env.task.last_action)
    if task != "so101_reach":
        torch.testing.assert_close(spec.part(obs, "cube_pos"), state.sensor("cube_pos").float())
    if task == "so101_push":
        assert torch.equal(spec.part(obs, "goal_pos"), env.task.goal)
    if task == "so101_reach":
        assert torch.equal(spec.part(obs, "target_pos"), env.task.target)
    with pytest.raises(KeyError, match="no observation part 'elbow_angle'"):
        spec.part(obs, "elbow_angle")
    env.close()
