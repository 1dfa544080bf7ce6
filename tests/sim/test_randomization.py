"""Domain randomization changes the model parameters per env, is seeded, and survives a state_dict round trip."""

import copy

import mujoco
import numpy as np
import pytest
import torch

from policies import keys
from sim.config import SimConfig
from sim.randomization import RandomizationConfig
from sim.registry import make_env

DR = {"friction": [0.5, 1.5], "mass": [0.8, 1.2], "com_offset": 0.005, "joint_damping": [0.5, 2.0],
      "armature": [0.8, 1.2], "actuator_gain": [0.7, 1.3], "camera_pos_jitter": 0.01, "light_scale": [0.6, 1.0]}


def _env(seed=0, n=4, **dr):
    return make_env("so101_lift", SimConfig(num_envs=n, seed=seed, randomization=RandomizationConfig(**dr)))


def _params(env):
    return np.stack([np.concatenate([m.geom_friction[:, 0], m.body_mass, m.dof_damping, m.actuator_gainprm[:, 0],
                                     m.cam_pos.ravel(), m.body_ipos.ravel()]) for m in env.physics._models])


def test_parameters_differ_per_env_and_follow_the_seed():
    a, b, c = _env(seed=1, **DR), _env(seed=1, **DR), _env(seed=2, **DR)
    for e in (a, b, c):
        e.reset(seed=e.cfg.seed)
    pa, pb, pc = _params(a), _params(b), _params(c)
    nominal = _params(_env())[0]
    assert not np.allclose(pa[0], pa[1])  # per env
    assert not np.allclose(pa[0], nominal)  # really changed
    np.testing.assert_array_equal(pa, pb)  # same seed, same draw
    assert not np.allclose(pa, pc)
    m, m0 = a.physics._models[0], _env().physics.model
    scale = m.geom_friction[:, 0] / m0.geom_friction[:, 0]
    assert np.allclose(scale, scale[0]) and 0.5 <= scale[0] <= 1.5
    kp = m.actuator_gainprm[:, 0] / m0.actuator_gainprm[:, 0]
    assert np.allclose(m.actuator_biasprm[:, 1], -m.actuator_gainprm[:, 0])  # still a position servo
    assert 0.7 <= kp[0] <= 1.3


def test_parameters_are_redrawn_at_reset_and_change_the_physics():
    env = _env(seed=0, n=2, **DR)
    env.reset(seed=0)
    before = _params(env)
    env._reset_envs(torch.tensor([1]))
    after = _params(env)
    np.testing.assert_array_equal(before[0], after[0])
    assert not np.allclose(before[1], after[1])
    plain = _env(seed=0, n=2)
    for e in (env, plain):
        e.reset(seed=0)
        for _ in range(20):
            obs, *_ = e.step(torch.full((2, 6), 0.5))
    assert not torch.allclose(obs[keys.POLICY], plain.step(torch.full((2, 6), 0.5))[0][keys.POLICY])


def test_action_latency_delays_the_command():
    fast = make_env("so101_reach", SimConfig(num_envs=1))
    slow = make_env("so101_reach", SimConfig(num_envs=1, randomization=RandomizationConfig(action_latency=[2, 2])))
    for e in (fast, slow):
        e.reset(seed=0)
    push = torch.tensor([[1.0, 0, 0, 0, 0, 0]])
    q_fast = fast.step(push)[0][keys.POLICY][0, 0]
    q_slow = [slow.step(push)[0][keys.POLICY][0, 0] for _ in range(3)]
    q0 = fast.task.home.qpos[0]
    assert abs(float(q_fast - q0)) > 0.02  # moved at once
    assert abs(float(q_slow[0] - q_slow[1])) < 1e-3 and abs(float(q_slow[2] - q_slow[1])) > 0.02  # two steps late


def test_observation_noise_only_on_the_policy_group():
    """Against a noise-free env on the same seed and actions: the critic group is bit for bit the noise-free one,
    the policy group differs by zero-mean noise of the configured scale (0.05)."""
    noisy = make_env("so101_lift", SimConfig(num_envs=8, randomization=RandomizationConfig(obs_noise=0.05)))
    clean = make_env("so101_lift", SimConfig(num_envs=8))
    pairs = [(noisy.reset(seed=0)[0], clean.reset(seed=0)[0])]
    action = torch.linspace(-0.8, 0.8, 6).expand(8, 6)
    for _ in range(3):  # no episode ends (150 steps), so the noise draws move no reset
        pairs.append((noisy.step(action)[0], clean.step(action)[0]))
    diffs = []
    for o_noisy, o_clean in pairs:
        assert torch.equal(o_noisy[keys.CRITIC], o_clean[keys.CRITIC])
        diffs.append(o_noisy[keys.POLICY] - o_clean[keys.POLICY])
    d = torch.stack(diffs)  # [4, 8, 33]
    assert 0.045 < d.std() < 0.055 and d.mean().abs() < 0.01, (d.std(), d.mean())
    assert (d != 0).all()  # every element of the policy group is noised


def test_randomized_env_resumes_exactly():
    env = _env(seed=3, n=2, action_latency=[0, 2], obs_noise=0.01, **DR)
    env.reset(seed=3)
    acts = [torch.rand(2, 6) * 2 - 1 for _ in range(30)]
    for a in acts[:10]:
        env.step(a)
    sd = env.state_dict()
    ref = [env.step(a)[0][keys.POLICY] for a in acts[10:]]
    env2 = _env(seed=0, n=2, action_latency=[0, 2], obs_noise=0.01, **DR)
    env2.load_state_dict(sd)
    out = [env2.step(a)[0][keys.POLICY] for a in acts[10:]]
    assert all(torch.equal(x, y) for x, y in zip(ref, out))


def test_randomized_cameras_render_differently():
    env = _env(seed=0, n=2, camera_pos_jitter=0.05, light_scale=[0.3, 1.0])
    env.reset(seed=0)
    f = env.render(camera="front", width=48, height=48).float()
    assert f.shape == (2, 3, 48, 48) and (f[0] - f[1]).abs().mean() > 1.0


def test_colors_are_randomized_for_the_renderer_only():
    tinted, again, plain = (_env(seed=3, n=2, color_scale=[0.2, 1.0]), _env(seed=3, n=2, color_scale=[0.2, 1.0]),
                            _env(seed=3, n=2))
    for e in (tinted, again, plain):
        e.reset(seed=3)
    m0, m1 = tinted.physics._models
    nominal = plain.physics.model
    ratio = m0.mat_rgba[:, :3] / np.maximum(nominal.mat_rgba[:, :3], 1e-9)
    lit = nominal.mat_rgba[:, :3] > 0.05
    assert ((ratio[lit] >= 0.2 - 1e-6) & (ratio[lit] <= 1.0 + 1e-6)).all() and ratio[lit].std() > 0.05  # per channel
    assert not np.allclose(m0.geom_rgba, m1.geom_rgba)  # per env
    np.testing.assert_array_equal(m0.mat_rgba[:, 3], nominal.mat_rgba[:, 3])  # alpha kept
    assert np.array_equal(m0.body_mass, nominal.body_mass)  # nothing physical moved
    frames = [e.render(camera="front", width=48, height=48).float() for e in (tinted, again, plain)]
    assert torch.equal(frames[0], frames[1])  # seeded
    assert (frames[0][0] - frames[2][0]).abs().mean() > 1.0 and (frames[0][0] - frames[0][1]).abs().mean() > 1.0


def test_colour_scales_near_one_render_the_nominal_scene():
    # A geom coloured by its material keeps MuJoCo's default rgba, which the renderer reads as "use the material";
    # scaling it made it an override that painted the table, arm and cubes grey (images ~45 % darker at scale ~1).
    near, plain = _env(seed=3, n=2, color_scale=[0.999, 1.0]), _env(seed=3, n=2)
    near.reset(seed=3)
    plain.load_state_dict(near.state_dict())  # the same scene on the nominal model
    nominal = plain.physics.model
    by_material = (nominal.geom_matid >= 0) & np.isclose(nominal.geom_rgba, [0.5, 0.5, 0.5, 1.0]).all(axis=1)
    assert by_material.any()  # the scene has such geoms (the table, the arm's parts)
    np.testing.assert_array_equal(near.physics._models[0].geom_rgba[by_material], nominal.geom_rgba[by_material])
    for cam in ("front", "wrist"):
        a, b = (e.render(camera=cam, width=48, height=48).float() for e in (near, plain))
        assert (a - b).abs().mean() < 1.0, cam  # grey overrides gave ~40-55 levels of 255


def test_mass_randomization_recomputes_the_models_derived_constants():
    env = _env(seed=0, n=2, mass=[0.75, 1.3])
    env.reset(seed=0)
    again = _env(seed=5, n=2, mass=[0.75, 1.3])
    again.reset(seed=5)
    again.load_state_dict(env.state_dict())  # a resumed run rebuilds them too
    nominal = _env().physics.model
    for m in (env.physics._models[0], again.physics._models[0]):
        ref = copy.copy(m)
        mujoco.mj_setConst(ref, mujoco.MjData(ref))
        assert not np.allclose(m.body_subtreemass, nominal.body_subtreemass)  # masses really moved
        for f in ("body_subtreemass", "body_invweight0", "dof_invweight0", "actuator_acc0"):
            np.testing.assert_allclose(getattr(m, f), getattr(ref, f), rtol=1e-9, err_msg=f)


def test_batched_params_carry_the_derived_constants_of_each_envs_draw():
    """The device backends' [N, ...] rows (``BatchedModelParams``, what mjx and mujoco_warp read) hold the constants
    mj_setConst derives from each env's masses, inertias and centres of mass: those of the CPU backend's per-env model
    for the same seed, also after a state_dict round trip (which stores only the draws)."""
    from sim.mujoco_cpu import MujocoPhysics
    from sim.randomization import BatchedModelParams

    cfg = RandomizationConfig(mass=[0.7, 1.3], com_offset=0.01, armature=[0.8, 1.2])
    cpu = _env(seed=3, n=3, mass=[0.7, 1.3], com_offset=0.01, armature=[0.8, 1.2]).physics
    assert isinstance(cpu, MujocoPhysics)
    batched = BatchedModelParams(cpu.model, cfg, 3, torch.device("cpu"), torch.float64)
    for p in (cpu, batched):
        p.randomize(torch.arange(3), torch.Generator().manual_seed(7))
    restored = BatchedModelParams(cpu.model, cfg, 3, torch.device("cpu"), torch.float64)
    restored.load_state_dict(batched.state_dict())
    assert not any(k.removeprefix("model.") in BatchedModelParams.DERIVED for k in batched.state_dict())
    for f in ("body_invweight0", "dof_invweight0"):
        assert not np.allclose(batched.tensors[f][0].numpy(), getattr(cpu.model, f)), f  # the draws moved them
        for params in (batched, restored):
            for i, m in enumerate(cpu._models):
                np.testing.assert_allclose(params.tensors[f][i].numpy(), getattr(m, f), rtol=1e-9, err_msg=f)


def test_com_offset_moves_every_bodys_centre_of_mass():
    # The compiler marks bodies whose inertial frame is the body frame; the kinematics then ignored body_ipos (the
    # cube's offset had no effect) and mj_setConst refused the model.
    env = _env(seed=0, n=1, com_offset=0.01)
    env.reset(seed=0)
    m, nominal = env.physics._models[0], _env().physics.model
    d, d0 = mujoco.MjData(m), mujoco.MjData(nominal)
    mujoco.mj_forward(m, d)
    mujoco.mj_forward(nominal, d0)  # both at qpos0: same body frames
    np.testing.assert_allclose(d.xpos, d0.xpos)
    moved = np.linalg.norm(d.xipos - d0.xipos, axis=1)[1:]
    assert (moved > 1e-4).all(), moved


def test_mass_randomization_keeps_the_simulation_stable():
    # With the nominal model's invweight0 the contacts' softness no longer matched the masses: under random actions
    # the cube was flung (a reach reward of -119, i.e. >100 m away; |qvel| 581) and FlashSAC never learned the task.
    env = make_env("so101_lift", SimConfig(num_envs=64, num_threads=1, seed=0,
                                           randomization=RandomizationConfig(mass=[0.75, 1.3])))
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    worst, fastest = 0.0, 0.0
    for _ in range(600):
        _, r, *_ = env.step(torch.rand(64, env.action_dim, generator=g) * 2 - 1)
        worst, fastest = min(worst, float(r.min())), max(fastest, float(env.physics.state.qvel.abs().max()))
    assert worst > -10.0 and fastest < 100.0, (worst, fastest)


@pytest.mark.parametrize("bad", [{"friction": [1.5, 0.5]}, {"obs_noise": -1.0}, {"action_latency": [0]}])
def test_bad_ranges_are_refused(bad):
    with pytest.raises(ValueError, match="randomization"):
        RandomizationConfig(**bad)


def test_cameras_on_a_moving_body_take_their_own_jitter():
    """The wrist camera (on the gripper) moves by ``mounted_camera_pos_jitter``, the world-fixed ones by
    ``camera_pos_jitter``; the other draws do not change with it."""
    def drawn(**dr):
        env = _env(seed=3, n=8, camera_pos_jitter=0.01, light_scale=[0.6, 1.0], **dr)
        env.reset(seed=3)
        return (np.stack([m.cam_pos for m in env.physics._models]) - env.physics.model.cam_pos,
                np.stack([m.light_diffuse for m in env.physics._models]))

    model = _env().physics.model
    wrist = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, "wrist")
    front = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, "front")
    assert model.cam_bodyid[front] == 0 and model.cam_bodyid[wrist] != 0
    both, light = drawn()
    fixed_only, light_fixed = drawn(mounted_camera_pos_jitter=0.0)
    small, _ = drawn(mounted_camera_pos_jitter=0.002)
    for off, half in ((both, 0.01), (fixed_only, 0.0), (small, 0.002)):
        assert np.abs(off[:, wrist]).max() <= half + 1e-12
        assert np.abs(off[:, front]).max() <= 0.01 + 1e-12 and np.abs(off[:, front]).max() > 0.005
    assert np.abs(both[:, wrist]).max() > 0.005 and np.abs(small[:, wrist]).max() > 0.001
    np.testing.assert_allclose(fixed_only[:, front], both[:, front], atol=1e-15)  # same draws, same front offsets
    np.testing.assert_allclose(small[:, wrist], both[:, wrist] * 0.2, atol=1e-15)
    np.testing.assert_array_equal(light_fixed, light)
    with pytest.raises(ValueError, match="mounted_camera_pos_jitter"):
        RandomizationConfig(mounted_camera_pos_jitter=-0.01)


def test_each_field_is_scaled_as_configured_by_hand():
    """Ranges pinned to one value give exact draws: each field is its nominal value times its scale (sliding friction
    only; masses and inertias together; the servos' kp in gain and bias, their kv untouched), lights and colours
    clipped to [0, 1], the world body's centre of mass never moved."""
    from sim.randomization import ModelRandomizer

    model = _env().physics.model
    cfg = RandomizationConfig(friction=[0.5, 0.5], mass=[2.0, 2.0], joint_damping=[3.0, 3.0], armature=[0.25, 0.25],
                              actuator_gain=[0.5, 0.5], light_scale=[5.0, 5.0], color_scale=[3.0, 3.0],
                              com_offset=0.02)
    sampler = ModelRandomizer(model, cfg)
    assert sampler.position_actuators.tolist() == list(range(model.nu))  # every SO-101 servo is a position servo
    out = sampler.sample(3, torch.Generator().manual_seed(0))

    def rows(x):  # the nominal value, once per env
        return np.broadcast_to(x, (3, *x.shape))

    for f, v in out.items():
        assert v.shape == (3, *getattr(model, f).shape), f
    np.testing.assert_allclose(out["geom_friction"][:, :, 0], 0.5 * rows(model.geom_friction[:, 0]))
    np.testing.assert_array_equal(out["geom_friction"][:, :, 1:], rows(model.geom_friction[:, 1:]))
    np.testing.assert_allclose(out["body_mass"], 2.0 * rows(model.body_mass))
    np.testing.assert_allclose(out["body_inertia"], 2.0 * rows(model.body_inertia))
    np.testing.assert_allclose(out["dof_damping"], 3.0 * rows(model.dof_damping))
    np.testing.assert_allclose(out["dof_armature"], 0.25 * rows(model.dof_armature))
    np.testing.assert_allclose(out["actuator_gainprm"][:, :, 0], 0.5 * rows(model.actuator_gainprm[:, 0]))
    np.testing.assert_allclose(out["actuator_biasprm"][:, :, 1], -out["actuator_gainprm"][:, :, 0])
    np.testing.assert_array_equal(out["actuator_biasprm"][:, :, 2], rows(model.actuator_biasprm[:, 2]))
    assert (model.light_diffuse > 0.2).any()  # so the clip at 1 is exercised
    np.testing.assert_allclose(out["light_diffuse"], rows(np.minimum(5.0 * model.light_diffuse, 1.0)))
    np.testing.assert_allclose(out["mat_rgba"][:, :, :3], rows(np.minimum(3.0 * model.mat_rgba[:, :3], 1.0)))
    np.testing.assert_array_equal(out["mat_rgba"][:, :, 3], rows(model.mat_rgba[:, 3]))
    offset = out["body_ipos"] - model.body_ipos
    assert (offset[:, 0] == 0).all() and np.abs(offset).max() <= 0.02 and np.abs(offset[:, 1:]).min() > 0
    dark = ModelRandomizer(model, RandomizationConfig(color_scale=[0.0, 0.0], light_scale=[0.0, 0.0])).sample(
        3, torch.Generator())
    assert (dark["light_diffuse"] == 0).all()
    tinted = sampler.material_coloured_geoms  # coloured through their material: their own rgba stays
    plain = np.setdiff1d(np.arange(model.ngeom), tinted)
    assert len(plain) and (dark["geom_rgba"][:, plain, :3] == 0).all() and (dark["mat_rgba"][:, :, :3] == 0).all()
    np.testing.assert_array_equal(dark["geom_rgba"][:, tinted], rows(model.geom_rgba[tinted]))


@pytest.mark.parametrize("field,value", [("friction", [0.9, 1.0]), ("mass", [1.0, 1.1]), ("com_offset", 0.001),
                                         ("joint_damping", [1.0, 1.2]), ("armature", [0.9, 0.9]),
                                         ("actuator_gain", [1.0, 1.01]), ("light_scale", [0.5, 1.0]),
                                         ("color_scale", [1.0, 1.5]), ("camera_pos_jitter", 0.001),
                                         ("mounted_camera_pos_jitter", 0.001)])
def test_any_one_randomized_field_enables_the_per_env_models(field, value):
    assert RandomizationConfig(**{field: value}).physics_enabled
    assert not RandomizationConfig().physics_enabled
    assert not RandomizationConfig(obs_noise=0.1, action_latency=[0, 2]).physics_enabled  # no model field


@pytest.mark.parametrize("bad", [{"mass": [-0.1, 1.0]}, {"mass": [1.0, 1.1, 1.2]}, {"color_scale": [2.0, 1.0]},
                                 {"com_offset": -0.01}, {"mounted_camera_pos_jitter": -0.001}])
def test_more_bad_ranges_are_refused(bad):
    with pytest.raises(ValueError, match=f"randomization.{next(iter(bad))} must be"):
        RandomizationConfig(**bad)


def test_batched_params_redraw_a_single_env():
    from sim.randomization import BatchedModelParams

    model = _env().physics.model
    params = BatchedModelParams(model, RandomizationConfig(mass=[0.5, 1.5]), 3, torch.device("cpu"), torch.float64)
    before = params.tensors["body_mass"].clone()
    params.randomize(torch.tensor([1]), torch.Generator().manual_seed(0))
    changed = ~torch.isclose(params.tensors["body_mass"], before).all(dim=1)
    assert changed.tolist() == [False, True, False]
