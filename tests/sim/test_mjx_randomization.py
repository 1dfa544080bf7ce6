"""Domain randomization on the mjx backend: per-env parameters batched in the mjx.Model, seeded like the CPU backend.

The 'mjx' extra is installed by ``make test``: a broken install fails here, it is not skipped. Sampling and the
state_dict need no JAX compilation; the one test that steps compiles the humanoid's batched-model step and forward
(about 3 min on 2 busy cores), so it is ``slow``.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX picks a backend

import numpy as np
import pytest
import torch

from sim.config import SimConfig
from sim.env import MujocoFamilyEnv
from sim.mjx import MjxPhysics, make_mjx_compatible
from sim.mujoco_cpu import MujocoPhysics
from sim.randomization import ModelRandomizer, RandomizationConfig
from sim.registry import make_task
from tests.sim._backend_agreement import use_persistent_jax_cache

use_persistent_jax_cache()
N = 3
DR = RandomizationConfig(friction=[0.5, 1.5], mass=[0.8, 1.2], com_offset=0.005, joint_damping=[0.5, 2.0],
                         armature=[0.8, 1.2], actuator_gain=[0.7, 1.3], camera_pos_jitter=0.01, light_scale=[0.6, 1.0],
                         color_scale=[0.5, 1.0])


def _model(task: str = "so101_lift"):
    model = make_task(task).build_spec().compile()
    make_mjx_compatible(model)
    return model


# colours stay on the host (the renderer's); the jitted step reads the rest, and the constants derived from them
PHYSICS_FIELDS = [f for f in ModelRandomizer.FIELDS if f not in ModelRandomizer.RENDER_ONLY]
DERIVED = ["body_invweight0", "dof_invweight0"]  # BatchedModelParams.DERIVED present in so101_lift (no tendons)


def _randomized(physics, seed: int, n: int = N):
    physics.randomize(torch.arange(n), torch.Generator().manual_seed(seed))
    return physics


def _mjx_params(physics: MjxPhysics) -> dict[str, np.ndarray]:
    """The values the jitted step really reads: the batched fields of ``physics.mx`` (copied: on the CPU
    ``np.asarray`` of a JAX array views its buffer, which the next redraw overwrites in place)."""
    return {f: np.array(getattr(physics.mx, f), copy=True) for f in PHYSICS_FIELDS + DERIVED}


def test_mjx_parameters_are_batched_per_env_and_follow_the_seed():
    a, b, c = (_randomized(MjxPhysics(_model(), N, "cpu", DR), seed) for seed in (1, 1, 2))
    pa, pb, pc = _mjx_params(a), _mjx_params(b), _mjx_params(c)
    nominal = _model()
    for f, v in pa.items():
        assert v.shape == (N, *getattr(nominal, f).shape), f
        np.testing.assert_array_equal(v, pb[f], err_msg=f)  # same seed, same draw
    for f in ("geom_friction", "body_mass", "dof_damping", "actuator_gainprm", "body_ipos"):
        assert not np.allclose(pa[f][0], pa[f][1]), f  # per env
        assert not np.allclose(pa[f][0], getattr(nominal, f)), f  # really changed
        assert not np.allclose(pa[f], pc[f]), f  # another seed, another draw
    gain = pa["actuator_gainprm"][:, :, 0]
    np.testing.assert_allclose(pa["actuator_biasprm"][:, :, 1], -gain, rtol=1e-6)  # still position servos
    # The batched model reads the same buffers as the torch tensors the state_dict saves (DLPack views).
    sd = a.state_dict()
    np.testing.assert_array_equal(sd["model.geom_friction"].numpy(), pa["geom_friction"])


def test_mjx_and_cpu_backends_draw_the_same_parameters_for_a_seed():
    cpu = _randomized(MujocoPhysics(_model(), N, 1, DR), seed=5)
    gpu = _randomized(MjxPhysics(_model(), N, "cpu", DR), seed=5)
    batched = _mjx_params(gpu)
    for i, m in enumerate(cpu._models):
        for f in PHYSICS_FIELDS + DERIVED:  # MJX holds float32, MuJoCo float64; DERIVED: mj_setConst's per env
            np.testing.assert_allclose(batched[f][i], getattr(m, f), rtol=1e-6, atol=1e-7, err_msg=f"env {i} {f}")


def test_mjx_parameters_are_redrawn_for_reset_envs_only_and_restored_from_a_state_dict():
    phys = _randomized(MjxPhysics(_model(), N, "cpu", DR), seed=0)
    before = _mjx_params(phys)
    sd = phys.state_dict()
    phys.randomize(torch.tensor([1]), torch.Generator().manual_seed(9))
    after = _mjx_params(phys)
    np.testing.assert_array_equal(before["body_mass"][[0, 2]], after["body_mass"][[0, 2]])
    assert not np.allclose(before["body_mass"][1], after["body_mass"][1])
    fresh = MjxPhysics(_model(), N, "cpu", DR)
    fresh.load_state_dict(sd)
    for f, v in _mjx_params(fresh).items():
        np.testing.assert_array_equal(v, before[f], err_msg=f)


def test_randomized_cameras_render_differently_on_mjx():
    phys = _randomized(MjxPhysics(_model(), 2, "cpu", RandomizationConfig(camera_pos_jitter=0.05,
                                                                          light_scale=[0.3, 1.0])), seed=0, n=2)
    f = phys.render("front", 48, 48).float()  # MuJoCo's CPU renderer, each env with its own camera and lights
    assert f.shape == (2, 3, 48, 48) and (f[0] - f[1]).abs().mean() > 1.0
    phys.close()


def test_unrandomized_mjx_model_stays_shared():
    phys = MjxPhysics(_model(), N, "cpu", RandomizationConfig())
    assert phys._batched == () and phys.mx.geom_friction.ndim == 2
    assert not any(k.startswith("model.") for k in phys.state_dict())


@pytest.mark.slow
def test_randomized_mjx_env_steps_finitely_and_agrees_with_the_randomized_cpu_env():
    """Each env steps with its own parameters: the same draws on both backends give the same trajectories."""
    n, steps = 2, 10
    envs = {}
    for backend in ("mujoco", "mjx"):
        task, model = make_task("humanoid_walk"), _model("humanoid_walk")
        phys = MujocoPhysics(model, n, 1, DR) if backend == "mujoco" else MjxPhysics(model, n, "cpu", DR)
        envs[backend] = MujocoFamilyEnv(task, phys, SimConfig(backend=backend, num_envs=n, seed=4, randomization=DR))
    gen = torch.Generator().manual_seed(1)
    actions = [torch.rand(n, envs["mujoco"].action_dim, generator=gen) * 2 - 1 for _ in range(steps)]
    qpos = {}
    for name, env in envs.items():
        env.reset(seed=4)
        for a in actions:
            obs, reward, *_ = env.step(a)
            assert all(torch.isfinite(v).all() for v in obs.values()) and torch.isfinite(reward).all()
        qpos[name] = env.physics.state.qpos.double().clone()
    mjx_mass = envs["mjx"].physics.state_dict()["model.body_mass"]
    assert not torch.allclose(mjx_mass[0], mjx_mass[1])  # the two envs really have different bodies
    err = (qpos["mjx"] - qpos["mujoco"]).abs().max().item()
    # measured: 1.5e-4 after 10 steps (1.7e-4 over 50), as unrandomized (2.1e-4 over 50, tests/sim/test_mjx.py)
    assert err < 2e-3, f"max |dqpos| {err:.2e} after {steps} control steps"
    for env in envs.values():
        env.close()
