"""Checks shared by the device backends' tests (mjx, warp): the same seeded rollout on MuJoCo and on the backend."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from policies import keys
from sim.env import MujocoFamilyEnv


def rollout(envs: dict[str, MujocoFamilyEnv], steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """qpos ``[steps, N, nq]`` (float64, CPU) of every env under the same random actions from ``reset(seed)``.
    Observations and rewards stay finite, and episodes end at the same steps on every backend."""
    ref = next(iter(envs.values()))
    gen = torch.Generator().manual_seed(1)
    actions = [torch.rand(ref.num_envs, ref.action_dim, generator=gen) * 2 - 1 for _ in range(steps)]
    qpos, ends = {}, {}
    for name, env in envs.items():
        env.reset(seed=seed)
        qs, es = [], []
        for a in actions:
            obs, reward, terminated, truncated, _ = env.step(a)
            assert all(torch.isfinite(v).all() for v in obs.values()) and torch.isfinite(reward).all(), name
            qs.append(env.physics.state.qpos.double().cpu().clone())
            es.append((terminated | truncated).cpu())
        qpos[name], ends[name] = torch.stack(qs), torch.stack(es)
    first = next(iter(ends.values()))
    assert all(torch.equal(first, e) for e in ends.values()), "episodes ended at different steps on the backends"
    return qpos


def assert_reset_observations_match(envs: dict[str, MujocoFamilyEnv], seed: int = 3, tol: float = 1e-4) -> None:
    """Observations after ``reset(seed)`` agree with MuJoCo's and come back on the CPU, whatever the backend."""
    obs = {name: env.reset(seed=seed)[0] for name, env in envs.items()}
    for name, o in obs.items():
        for k in (keys.POLICY, keys.CRITIC):
            assert o[k].device == torch.device("cpu"), (name, k)
            torch.testing.assert_close(o[k], obs["mujoco"][k], atol=tol, rtol=tol, msg=f"{name} {k}")


def use_persistent_jax_cache() -> None:
    """Keep MJX's compiled programs across test runs (like Warp's kernel cache): the humanoid's forward and step
    take ~55 s to compile on 2 busy cores, ~10 s to load from the cache. Call before anything is compiled."""
    import jax

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "robot_rl" / "jax"
    jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
