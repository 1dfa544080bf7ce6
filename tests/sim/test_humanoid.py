"""humanoid_walk on the mujoco backend: the env contract, determinism, standing, commands, falls, reward kernels."""

from __future__ import annotations

import math

import mujoco
import pytest
import torch

from policies import keys
from sim.config import SimConfig
from sim.registry import make_env, task_config
from sim.tasks import humanoid_walk as hw


def _env(n: int = 4, seed: int = 0, **overrides):
    return make_env("humanoid_walk", SimConfig(num_envs=n, seed=seed), task_config("humanoid_walk", overrides))


def _rollout(env, steps: int, seed: int) -> list[tuple]:
    gen = torch.Generator().manual_seed(seed)
    obs, _ = env.reset(seed=seed)
    out = [(obs[keys.POLICY].clone(),)]
    for _ in range(steps):
        a = torch.rand(env.num_envs, env.action_dim, generator=gen) * 2 - 1
        obs, r, te, tr, _ = env.step(a)
        out.append((obs[keys.POLICY].clone(), obs[keys.CRITIC].clone(), r.clone(), te.clone(), tr.clone()))
    return out


def test_shapes_and_finite_under_random_actions():
    env = _env(4)
    obs, info = env.reset(seed=0)
    assert env.action_dim == 18 and env.control_dt == pytest.approx(0.02)
    assert env.max_episode_length == 1000  # 20 s at 50 Hz
    assert obs[keys.POLICY].shape == (4, 66) and obs[keys.CRITIC].shape == (4, 69)
    ended = 0
    for _ in range(60):
        obs, r, te, tr, info = env.step(torch.rand(4, 18) * 2 - 1)
        assert r.shape == (4,) and te.dtype == torch.bool and tr.dtype == torch.bool
        assert all(torch.isfinite(v).all() for v in obs.values()) and torch.isfinite(r).all()
        ended += int(te.sum())
    assert ended > 0  # random joint targets knock it over: falls terminate
    weights = task_config("humanoid_walk").reward_weights
    assert {f"reward/{k}" for k in weights} <= set(info[keys.LOG])
    env.close()


def test_same_seed_same_trajectory():
    a, b = _env(3, seed=1), _env(3, seed=1)
    for x, y in zip(_rollout(a, 30, seed=5), _rollout(b, 30, seed=5)):
        for u, v in zip(x, y):
            assert torch.equal(u, v)
    # and a different seed gives different noise / commands / initial poses
    c = _env(3, seed=1)
    assert not torch.equal(_rollout(c, 1, seed=6)[0][0], _rollout(a, 1, seed=5)[0][0])


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_home_pose_stands_for_two_seconds_under_zero_action(noise):
    env = _env(4, init_joint_noise=noise)
    env.reset(seed=0)
    zero = torch.zeros(4, 18)
    for _ in range(100):  # 2 s at 50 Hz
        obs, _, te, _, _ = env.step(zero)
        assert not te.any()
    height = obs[keys.CRITIC][:, 66]
    assert (height > 0.7).all(), height
    assert (obs[keys.CRITIC][:, 67:69] == 1).all()  # both feet on the floor
    gravity = obs[keys.CRITIC][:, 6:9]
    assert (gravity[:, 2] < -0.98).all()  # pelvis within ~11 degrees of level
    env.close()


def test_commands_resample_during_the_episode():
    env = _env(8, command_resample_s=0.1, standing_fraction=0.0)  # every 5 control steps
    env.reset(seed=0)
    first = env.task.command.clone()
    for _ in range(6):
        env.step(torch.zeros(8, 18))
    cmd = env.task.command
    assert not torch.equal(cmd, first)
    assert (cmd >= env.task.cmd_low).all() and (cmd <= env.task.cmd_high).all()
    # the command is the last 3 entries of the policy observation (no noise there)
    obs, *_ = env.step(torch.zeros(8, 18))
    assert torch.allclose(obs[keys.POLICY][:, -3:], env.task.command)


def test_fall_terminates_and_resets():
    env = _env(2, init_joint_noise=0.0)
    env.reset(seed=0)
    state = env.physics.state
    state.qpos[0, 3:7] = torch.tensor([math.cos(math.pi / 4), math.sin(math.pi / 4), 0.0, 0.0])  # on its side
    env.physics.forward(torch.tensor([0]))
    obs, _, te, tr, info = env.step(torch.zeros(2, 18))
    assert te.tolist() == [True, False] and not tr.any() and not info["faulted"].any()
    assert info[keys.LOG]["reward/fall"] == pytest.approx(-10.0 / 2)  # weight 10, one env of two
    assert info[keys.FINAL_OBS][keys.CRITIC][0, 8] > -0.5  # the true last observation: gravity sideways
    assert obs[keys.CRITIC][0, 8] < -0.95 and obs[keys.CRITIC][0, 66] > 0.7  # the new episode starts upright


def test_observation_noise_only_on_the_policy_group():
    env = _env(2, init_joint_noise=0.0)
    obs, _ = env.reset(seed=0)
    clean = obs[keys.CRITIC][:, :66]
    assert not torch.equal(obs[keys.POLICY], clean)
    assert (obs[keys.POLICY] - clean).abs().max() <= 1.5 + 1e-5
    quiet = _env(2, init_joint_noise=0.0, obs_noise=False)
    obs, _ = quiet.reset(seed=0)
    assert torch.equal(obs[keys.POLICY], obs[keys.CRITIC][:, :66])


def test_sensors_and_model():
    m = hw.HumanoidWalkTask(hw.HumanoidWalkConfig()).build_spec().compile()
    assert m.nu == 18 and m.nq == 25 and m.opt.solver == mujoco.mjtSolver.mjSOL_NEWTON
    names = {m.sensor(i).name for i in range(m.nsensor)}
    assert {"base_pos", "base_quat", "base_lin_vel", "base_ang_vel", "foot0_contact0", "foot1_contact1"} <= names
    # only soles touch the floor: every colliding geom pair involves the floor and a sole capsule
    floor = m.geom("floor").id
    colliders = [g for g in range(m.ngeom) if m.geom_contype[g] or m.geom_conaffinity[g]]
    assert floor in colliders and all(g == floor or m.geom(g).name.split("_sole_")[0] in ("left", "right")
                                      for g in colliders)
    assert 25 < m.body_subtreemass[1] < 40  # kg


def test_reward_kernels_by_hand():
    cmd = torch.tensor([[0.5, 0.0, 0.2], [0.5, 0.0, 0.2]])
    vel = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert hw.track_lin_vel_xy_exp(cmd, vel, 0.5).tolist() == pytest.approx([1.0, math.exp(-1.0)])
    ang = torch.tensor([[0.0, 0.0, 0.2], [0.0, 0.0, -0.3]])
    assert hw.track_ang_vel_z_exp(cmd, ang, 0.5).tolist() == pytest.approx([1.0, math.exp(-1.0)])
    q = torch.tensor([[0.0, 1.0], [-2.0, 0.5]])
    lo, hi = torch.tensor([-1.0, -1.0]), torch.tensor([1.0, 0.8])
    assert hw.joint_pos_limits(q, lo, hi).tolist() == pytest.approx([-0.2, -1.0])
    air = torch.tensor([[0.5, 0.1], [0.5, 0.1]])
    first = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert hw.feet_air_time(air, first, cmd, 0.3).tolist() == pytest.approx([0.2, 0.0], abs=1e-6)
    assert hw.feet_air_time(air, first, torch.zeros(2, 3), 0.3).tolist() == [0.0, 0.0]  # standing: no reward
    # gravity in the frame of a base pitched +90 degrees about y: world down becomes +x of the base
    q90 = torch.tensor([[math.cos(math.pi / 4), 0.0, math.sin(math.pi / 4), 0.0]])
    g = hw.quat_rotate_inverse(q90, torch.tensor([[0.0, 0.0, -1.0]]))
    assert g.tolist()[0] == pytest.approx([1.0, 0.0, 0.0], abs=1e-6)
    # the closed form the task uses, by hand (the same pitch) and against the general rotation on random rotations
    assert hw.projected_gravity(q90).tolist()[0] == pytest.approx([1.0, 0.0, 0.0], abs=1e-6)
    rand = torch.nn.functional.normalize(torch.randn(64, 4, generator=torch.Generator().manual_seed(0)), dim=1)
    down = torch.tensor([[0.0, 0.0, -1.0]]).expand(64, 3)
    torch.testing.assert_close(hw.projected_gravity(rand), hw.quat_rotate_inverse(rand, down))


def test_gathered_contacts_and_foot_velocities_match_the_named_sensors():
    """The task reads contacts and foot velocities through precomputed sensordata columns; they must be the named
    sensors' readings, on states where feet touch and leave the floor (a falling, randomly driven humanoid)."""
    env = _env(8, init_joint_noise=0.3)
    env.reset(seed=0)
    task, state = env.task, env.physics.state
    g = torch.Generator().manual_seed(0)
    touched = left = 0
    for _ in range(40):
        env.step(torch.rand(8, env.action_dim, generator=g) * 2 - 1)
        named = torch.cat([sum(state.sensor(f"foot{i}_contact{j}")[:, :1] for j in range(len(geoms))) > 0
                           for i, geoms in enumerate(task.contact_geoms)], dim=1).float()
        assert torch.equal(task._contact(state), named)
        touched, left = touched + int(named.sum()), left + int((named == 0).sum())
        vel = torch.stack([state.sensor(f"foot{i}_lin_vel")[:, :2].float() for i in range(task.num_feet)], dim=1)
        gathered = state.sensordata[:, task.foot_vel_cols].float().view(-1, task.num_feet, 2)
        assert torch.equal(gathered, vel)
    assert touched > 0 and left > 0  # both cases were seen


@pytest.mark.parametrize("obs_noise", [True, False])
def test_fused_cpu_kernels_give_the_reference_numbers(obs_noise):
    """On the CPU the task's per-step math runs as compiled loops (sim/tasks/humanoid_kernels.py); it must give the
    torch reference's numbers (what MJX and Warp run) on a falling, randomly driven and pushed humanoid: every
    reward term, the feet's air times, falls, the reset poses and commands drawn, the commands resampled, the joint
    targets, and both observation groups, noise included. Each step starts both from the same state (the fused
    env's, loaded into the reference): a 1-ulp difference (float32 cosines of the reset heading) grows along a
    falling humanoid's trajectory, and this checks the step, not the chaos."""
    # 1 rad of joint noise at reset reaches the joint ranges (the clip is exercised)
    fused, ref = (_env(16, seed=2, init_joint_noise=1.0, obs_noise=obs_noise, fused_cpu=f, command_resample_s=0.2,
                       push_velocity=0.5, push_interval_s=[0.1, 0.3]) for f in (True, False))
    assert fused.task._kernel_args is not None and ref.task._kernel_args is None
    obs_f, _ = fused.reset(seed=2)
    obs_r, _ = ref.reset(seed=2)
    g = torch.Generator().manual_seed(0)
    seen = {"fall": 0, "air": 0, "slip": 0, "limits": 0}
    for _ in range(120):
        for k in obs_r:
            torch.testing.assert_close(obs_f[k], obs_r[k], rtol=1e-6, atol=1e-6)
        a = torch.rand(16, 18, generator=g) * 2 - 1
        ref.load_state_dict(fused.state_dict())
        obs_f, r_f, te_f, tr_f, info_f = fused.step(a)
        obs_r, r_r, te_r, tr_r, info_r = ref.step(a)
        torch.testing.assert_close(r_f, r_r, rtol=1e-5, atol=1e-5)
        assert torch.equal(te_f, te_r) and torch.equal(tr_f, tr_r)
        for name, buf in ref.task.task_state_dict().items():
            torch.testing.assert_close(fused.task.task_state_dict()[name], buf, rtol=0, atol=1e-6, msg=name)
        for name in ("qpos", "qvel", "ctrl"):
            torch.testing.assert_close(getattr(fused.physics.state, name), getattr(ref.physics.state, name), rtol=0,
                                       atol=1e-6, msg=name)
        for name, term in (("fall", "fall"), ("air", "feet_air_time"), ("slip", "feet_slip"),
                           ("limits", "joint_pos_limits")):
            logged_f, logged_r = info_f[keys.LOG][f"reward/{term}"], info_r[keys.LOG][f"reward/{term}"]
            assert logged_f == pytest.approx(logged_r, rel=1e-4, abs=1e-6)
            seen[name] += logged_r != 0
    assert all(seen.values()), seen  # every branch of the kernels was exercised
    fused.close()
    ref.close()
