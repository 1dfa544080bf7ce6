"""The mjx backend on the CPU, at tiny sizes: agreement with native MuJoCo, DLPack zero-copy, resets, faults.

The 'mjx' extra is installed by ``make test``: a broken install fails here, it is not skipped. Tests that step
the humanoid share one compiled env pair (a module fixture): its forward and step compile in ~55 s on 2 busy
cores (~10 s from the persistent cache, ``use_persistent_jax_cache``), after which 50 control steps take well
under a second, so they run in the default tier. The SO-101 scene (380 contact slots: ~12 min to compile) is
``slow``. Model adaptation and zero-copy views need no step; the one-joint servo model compiles in seconds.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX picks a backend
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import mujoco
import numpy as np
import pytest
import torch

from sim.config import SimConfig
from sim.env import MujocoFamilyEnv
from sim.mjx import MjxPhysics, make_mjx_compatible
from sim.mujoco_cpu import MujocoPhysics
from sim.registry import make_task
from tests.sim._backend_agreement import assert_reset_observations_match, rollout, use_persistent_jax_cache

use_persistent_jax_cache()

N = 2
STEPS = 50
# Measured max |qpos_mjx - qpos_mujoco| over 50 control steps of random actions, N = 2, falls and auto-resets
# included: humanoid_walk 2.1e-4. so101_reach (no cube in its scene), 10 / 8 solver iterations: 3.5e-5 over the first
# 20 control steps with physics_step's clamped-servo rule (2026-12-06; plain mjx.step was 1.1e-2 after one step on
# the scene with its cube); from step 29 contacts part the backends for good (1.6e-3, then up to 1.1e-1). MJX runs in
# float32, MuJoCo in float64.
QPOS_TOL = {"humanoid_walk": 2e-3, "so101_reach": 1e-3}
SO101_STEPS = 20  # beyond ~28 control steps with these seeds the comparison is of chaotic contacts


def _pair(task_name: str, solver_iterations: tuple[int, int] | None = None) -> dict[str, MujocoFamilyEnv]:
    """The same compiled model (adapted for MJX; optionally other solver iterations) on both backends, N envs each."""
    out = {}
    for backend in ("mujoco", "mjx"):
        task = make_task(task_name)
        model = task.build_spec().compile()
        make_mjx_compatible(model)
        if solver_iterations is not None:
            model.opt.iterations, model.opt.ls_iterations = solver_iterations
        physics = MujocoPhysics(model, N, 1) if backend == "mujoco" else MjxPhysics(model, N, "cpu")
        out[backend] = MujocoFamilyEnv(task, physics, SimConfig(backend=backend, num_envs=N, seed=0))
    return out


@pytest.fixture(scope="module")
def humanoid_pair():
    envs = _pair("humanoid_walk")
    yield envs
    for e in envs.values():
        e.close()


@pytest.fixture(scope="module")
def reach_pair():
    # Both backends get the scene with 10 / 8 solver iterations instead of its 100 / 50: under vmap MJX runs every
    # line-search iteration, which at 50 costs ~30 s per control step on these CPUs. The comparison is between
    # backends on one model, so the setting only has to be the same on both.
    envs = _pair("so101_reach", solver_iterations=(10, 8))
    yield envs
    for e in envs.values():
        e.close()


def test_humanoid_walk_agrees_with_mujoco(humanoid_pair):
    q = rollout(humanoid_pair, STEPS)
    err = (q["mujoco"] - q["mjx"]).abs().max().item()
    assert err < QPOS_TOL["humanoid_walk"], f"max |dqpos| {err:.2e} over {STEPS} control steps"


@pytest.mark.slow
@pytest.mark.timeout(3600)  # ~2 min on 2 cores, most of it compiling the scene's contacts
def test_so101_reach_agrees_with_mujoco(reach_pair):
    """The arm's joints agree over SO101_STEPS control steps of random actions. so101_reach's scene has no free cube
    (fad9602): a cube knocked by the arm tumbles apart in float32 and float64 and takes the arm's joints with it, so
    a scene that grows one again must say how long the comparison may run."""
    model = reach_pair["mujoco"].physics.model
    assert not (model.jnt_type == mujoco.mjtJoint.mjJNT_FREE).any(), "so101_reach's scene has a free body again"
    q = rollout(reach_pair, SO101_STEPS)
    err = (q["mujoco"] - q["mjx"]).abs().max().item()
    assert err < QPOS_TOL["so101_reach"], f"max |dqpos| of the arm {err:.2e} over {SO101_STEPS} control steps"


def test_observations_match_between_backends(humanoid_pair):
    assert_reset_observations_match(humanoid_pair)


def test_views_stay_zero_copy_after_step_and_reset(humanoid_pair):
    env = humanoid_pair["mjx"]
    env.reset(seed=0)
    env.step(torch.zeros(N, env.action_dim))
    phys = env.physics
    for k in ("qpos", "qvel", "ctrl", "sensordata"):
        assert getattr(phys.state, k).data_ptr() == getattr(phys._data, k).unsafe_buffer_pointer(), k


def test_reset_written_through_torch_reaches_the_simulation_of_that_env_only(humanoid_pair):
    env = humanoid_pair["mjx"]
    env.reset(seed=0)
    phys = env.physics
    before = phys.state.sensordata.clone()
    z0 = phys.state.sensor("base_pos")[:, 2].clone()
    phys.state.qpos[1, 2] += 0.5  # lift env 1's pelvis
    phys.forward(torch.tensor([1]))
    z = phys.state.sensor("base_pos")[:, 2]
    assert float(z[1]) == pytest.approx(float(z0[1]) + 0.5, abs=1e-5)
    assert torch.equal(phys.state.sensordata[0], before[0])  # env 0 untouched


def test_nonfinite_state_is_flagged_per_env(humanoid_pair):
    env = humanoid_pair["mjx"]
    env.reset(seed=0)
    env.physics.state.qvel[0, 0] = float("nan")
    obs, _, te, _, info = env.step(torch.zeros(N, env.action_dim))
    assert te.tolist() == [True, False] and info["faulted"].tolist() == [True, False]
    assert all(torch.isfinite(v).all() for v in obs.values())
    assert torch.isfinite(env.physics.state.qpos).all()  # env 0 was reset


def test_dlpack_views_are_zero_copy():
    task = make_task("humanoid_walk")
    phys = MjxPhysics(task.build_spec().compile(), N, "cpu")
    s, d = phys.state, phys._data
    for k in ("qpos", "qvel", "ctrl", "sensordata"):
        assert getattr(s, k).data_ptr() == getattr(d, k).unsafe_buffer_pointer(), k
    # torch -> jax: the array handed to the jitted step wraps the torch buffer
    wrapped = phys._from_torch(s.qpos, d.qpos)
    assert wrapped.unsafe_buffer_pointer() == s.qpos.data_ptr()
    # writes through the torch view are what the next step reads
    s.qpos[1, 0] = 1.25
    assert float(phys._data_from_state().qpos[1, 0]) == 1.25
    assert s.qpos.dtype == torch.float32 and s.qpos.shape == (N, 25)
    phys.close()


def test_saturated_servo_adds_no_kv_damping_in_implicitfast():
    """``physics_step`` keeps MuJoCo's implicitfast rule (a force-clamped actuator has no velocity derivative), which
    ``mjx.step`` (mujoco-mjx 3.17) drops. A pendulum servo told to go far saturates at its forcerange throughout:
    measured max |dq| against MuJoCo over 0.4 s, 6.5e-7 rad with the rule and 0.76 rad without."""
    import jax
    from mujoco import mjx

    from sim.mjx import physics_step

    model = mujoco.MjModel.from_xml_string("""
    <mujoco><option integrator="implicitfast" timestep="0.002"/>
      <worldbody><body><joint name="j" axis="0 1 0" damping="0.01"/>
        <geom type="capsule" size="0.02" fromto="0 0 0 0.2 0 0" mass="0.2" contype="0" conaffinity="0"/></body>
      </worldbody>
      <actuator><position joint="j" kp="50" kv="1" forcerange="-0.3 0.3"/></actuator></mujoco>""")
    data = mujoco.MjData(model)
    data.ctrl[0] = 1.5
    mx, dx = mjx.put_model(model, impl="jax"), mjx.put_data(model, data, impl="jax")
    steps = 200

    def trajectory(step_fn):
        run = jax.jit(lambda m, d: jax.lax.scan(lambda d, _: (step_fn(m, d), d.qpos[0]), d, None, length=steps)[1])
        return np.asarray(run(mx, dx))

    ref = np.empty(steps)
    for t in range(steps):
        ref[t] = data.qpos[0]
        mujoco.mj_step(model, data)
    assert abs(data.actuator_force[0]) == pytest.approx(0.3)  # saturated to the end
    assert np.abs(trajectory(physics_step) - ref).max() < 1e-5
    assert np.abs(trajectory(mjx.step) - ref).max() > 0.1  # the gap physics_step closes


def test_model_adaptation_for_mjx():
    model = mujoco.MjModel.from_xml_string("""
    <mujoco><option solver="PGS"/><worldbody><geom name="floor" type="plane" size="1 1 0.1"/>
      <body pos="0 0 0.5"><freejoint/><geom name="cyl" type="cylinder" size="0.05 0.1"/></body>
      <body pos="0.3 0 0.5"><freejoint/><geom name="box" type="box" size="0.05 0.05 0.05"/></body>
    </worldbody></mujoco>""")
    changes = make_mjx_compatible(model)
    assert model.opt.solver == mujoco.mjtSolver.mjSOL_NEWTON and any("PGS" in c for c in changes)
    # MJX has no cylinder-box collision: the cylinder collides as its bounding box
    assert model.geom("cyl").type[0] == mujoco.mjtGeom.mjGEOM_BOX and any("'cyl'" in c for c in changes)
    assert model.geom("cyl").size.tolist() == pytest.approx([0.05, 0.05, 0.1])
    from mujoco import mjx

    mjx.put_model(model, impl="jax")  # accepted now


def test_unsupported_contact_sensor_is_a_clear_error():
    spec = make_task("humanoid_walk").build_spec()
    spec.add_sensor(name="foot_touch_site", type=mujoco.mjtSensor.mjSENS_CONTACT, objtype=mujoco.mjtObj.mjOBJ_SITE,
                    objname="left_foot", intprm=[1, 0, 1])
    with pytest.raises(NotImplementedError, match="foot_touch_site"):
        make_mjx_compatible(spec.compile())


def test_cuda_device_without_jax_gpu_is_a_clear_error():
    import jax

    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has a GPU here")
    with pytest.raises(ValueError, match="JAX sees no GPU"):
        MjxPhysics(make_task("humanoid_walk").build_spec().compile(), N, "cuda:0")
