"""humanoid_walk on another MJCF through a robot description; per-group action scales; pushes as an interval event."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mujoco
import pytest
import torch

from policies import keys
from sim.config import SimConfig
from sim.registry import config_from_dict, make_env, make_task, task_config
from sim.robot_description import ASSETS, LeggedRobotDescription


def _legs_only_biped(tmp_path: Path) -> Path:
    """A different robot from our humanoid's MJCF: no arms (12 actuators), renamed base and feet, no IMU site, no
    keyframe. Written to disk, so the task loads it by path as a user's own file."""
    spec = mujoco.MjSpec.from_file(str(ASSETS / "humanoid.xml"))
    for name in ("left_upper_arm", "right_upper_arm"):
        spec.delete(spec.body(name))
    for a in list(spec.actuators):
        if "shoulder" in a.name or "elbow" in a.name:
            spec.delete(a)
    for k in list(spec.keys):
        spec.delete(k)
    spec.delete(spec.site("imu"))
    spec.body("pelvis").name = "base_link"
    spec.body("left_foot").name = "l_foot"
    spec.body("right_foot").name = "r_foot"
    path = tmp_path / "biped.xml"
    path.write_text(spec.to_xml())
    return path


def _biped_cfg(path: Path, **task):
    robot = LeggedRobotDescription(
        mjcf=str(path), base_body="base_link", base_site=None, feet={"l_foot": [], "r_foot": []}, foot_sites=None,
        keyframe=None, default_joint_pos={"*hip_pitch": -0.2, "*knee": 0.4, "*ankle_pitch": -0.2}, base_height=0.758,
        joint_groups={"legs": ["*hip*", "*knee*", "*ankle*"]})
    return dataclasses.replace(task_config("humanoid_walk"), robot=robot, **task)


def test_task_runs_on_another_mjcf(tmp_path):
    env = make_env("humanoid_walk", SimConfig(num_envs=3, seed=0), _biped_cfg(_legs_only_biped(tmp_path)))
    assert env.action_dim == 12
    assert env.obs_spec.shapes == {keys.POLICY: (48,), keys.CRITIC: (51,)}  # 9 + 3*12 + 3; + height + 2 feet
    # no listed contact geoms: the soles (the only colliding geoms of each foot) are found
    assert env.task.contact_geoms == [["left_sole_in", "left_sole_out"], ["right_sole_in", "right_sole_out"]]
    obs, _ = env.reset(seed=0)
    q = env.physics.state.qpos
    assert q[:, 2].tolist() == pytest.approx([0.758] * 3)  # base height from the description
    for _ in range(25):  # 0.5 s holding the default pose: both feet on the floor, still standing
        obs, reward, term, _, _ = env.step(torch.zeros(3, 12))
    assert not term.any() and torch.isfinite(reward).all()
    assert (obs[keys.CRITIC][:, -2:] == 1.0).all()  # foot contacts
    assert (obs[keys.CRITIC][:, -3] > 0.6).all()  # base height
    env.close()


def test_fused_cpu_kernels_agree_on_another_mjcf(tmp_path):
    """The CPU's compiled loops take their sizes from the robot (12 joints here, feet found from the soles): they give
    the torch reference's rewards, observations and states on the biped too, each step from the same state."""
    path = _legs_only_biped(tmp_path)
    fused, ref = (make_env("humanoid_walk", SimConfig(num_envs=4, seed=1),
                           _biped_cfg(path, fused_cpu=f, init_joint_noise=0.5)) for f in (True, False))
    assert fused.task._kernel_args is not None and ref.task._kernel_args is None
    fused.reset(seed=1)
    ref.reset(seed=1)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        a = torch.rand(4, 12, generator=g) * 2 - 1
        ref.load_state_dict(fused.state_dict())
        (obs_f, r_f, te_f, _, _), (obs_r, r_r, te_r, _, _) = fused.step(a), ref.step(a)
        torch.testing.assert_close(r_f, r_r, rtol=1e-5, atol=1e-5)
        assert torch.equal(te_f, te_r) and obs_f.keys() == obs_r.keys()
        for k in obs_r:
            torch.testing.assert_close(obs_f[k], obs_r[k], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(fused.physics.state.qpos, ref.physics.state.qpos, rtol=0, atol=1e-6)
    fused.close()
    ref.close()


def test_description_errors_are_clear(tmp_path):
    path = _legs_only_biped(tmp_path)
    with pytest.raises(ValueError, match="no body 'pelvis'"):
        make_task("humanoid_walk", dataclasses.replace(
            _biped_cfg(path), robot=dataclasses.replace(_biped_cfg(path).robot, base_body="pelvis")))
    with pytest.raises(ValueError, match="foot 'l_foot' has no geom"):
        bad = dataclasses.replace(_biped_cfg(path).robot, feet={"l_foot": ["sole"], "r_foot": []})
        make_task("humanoid_walk", dataclasses.replace(_biped_cfg(path), robot=bad))
    with pytest.raises(FileNotFoundError, match="robot MJCF not found"):
        make_task("humanoid_walk", dataclasses.replace(
            _biped_cfg(path), robot=dataclasses.replace(_biped_cfg(path).robot, mjcf=str(tmp_path / "nope.xml"))))
    with pytest.raises(ValueError, match="unknown group"):
        make_env("humanoid_walk", SimConfig(num_envs=1), dataclasses.replace(
            _biped_cfg(path), robot=dataclasses.replace(_biped_cfg(path).robot, group_action_scale={"arms": 0.1})))


def test_group_action_scale_sets_joint_targets():
    cfg = task_config("humanoid_walk")
    cfg.robot.group_action_scale = {"arms": 0.1}
    env = make_env("humanoid_walk", SimConfig(num_envs=1, seed=0), cfg)
    env.reset(seed=0)
    task = env.task
    target = task.action_to_ctrl(env.physics.state, torch.full((1, 18), 0.5))[0].float()
    arms = [i for i, n in enumerate(task.joint_names) if "shoulder" in n or "elbow" in n]
    legs = [i for i in range(18) if i not in arms]
    unclamped = (target > task.ctrl_low + 1e-6) & (target < task.ctrl_high - 1e-6)
    off = target - task.default_q
    assert torch.allclose(off[arms][unclamped[arms]], torch.tensor(0.05))
    assert torch.allclose(off[legs][unclamped[legs]], torch.tensor(0.25))
    env.close()


def test_g1_config_composes_and_names_its_missing_file():
    from omegaconf import OmegaConf

    from robot_rl.cli.build import compose

    cfg = OmegaConf.to_container(compose("train", ["task=humanoid_walk", "task/robot=g1",
                                                    "task.robot.mjcf=/nonexistent/scene_mjx.xml"]), resolve=True)
    raw = dict(cfg["task"])
    raw.pop("name")
    typed = config_from_dict("humanoid_walk", raw)
    assert typed.robot.base_site == "imu_in_pelvis" and typed.robot.group_action_scale == {"waist": 0.25, "arms": 0.25}
    with pytest.raises(FileNotFoundError, match="/nonexistent/scene_mjx.xml"):
        make_task("humanoid_walk", typed)


# ---------------------------------------------------------------------------------------------- pushes
def _twin(push: float, seed: int = 0):
    cfg = task_config("humanoid_walk", {"obs_noise": False, "push_velocity": push, "push_interval_s": [0.1, 0.1]})
    env = make_env("humanoid_walk", SimConfig(num_envs=4, seed=seed), cfg)
    env.reset(seed=seed)
    return env


def test_pushes_kick_the_base_on_schedule_and_are_seeded():
    pushed, calm, again = _twin(0.5), _twin(0.0), _twin(0.5)
    zero = torch.zeros(4, 18)
    base = pushed.task.base_dof_adr
    for step in range(1, 6):  # interval 0.1 s = 5 control steps: the first push lands at the start of step 5
        for env in (pushed, calm, again):
            env.step(zero)
        diff = (pushed.physics.state.qvel[:, base:base + 2] - calm.physics.state.qvel[:, base:base + 2]).abs()
        if step < 5:
            assert torch.equal(pushed.physics.state.qpos, calm.physics.state.qpos)
        else:
            assert (diff.amax(dim=1) > 0.05).all()  # every env was kicked, by up to 0.5 m/s per axis
            assert (diff.amax(dim=1) < 0.6).all()
    assert torch.equal(pushed.physics.state.qpos, again.physics.state.qpos)  # same seed, same pushes
    assert (pushed.task.push_timer == 5).all()  # redrawn for the next push
    for env in (pushed, calm, again):
        env.close()


def test_push_config_is_checked():
    with pytest.raises(ValueError, match="push_interval_s"):
        make_task("humanoid_walk", task_config("humanoid_walk", {"push_interval_s": [2.0, 1.0]}))
