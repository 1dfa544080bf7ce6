"""The CPU backend's threading: the envs are split into one contiguous slice per thread (the caller steps the
first), and no number may depend on how they are split."""

import pytest
import torch

from sim.config import SimConfig
from sim.registry import make_env


def _trajectory(task: str, num_envs: int, num_threads: int, steps: int) -> list[torch.Tensor]:
    env = make_env(task, SimConfig(num_envs=num_envs, num_threads=num_threads, seed=3))
    try:
        obs, _ = env.reset(seed=3)
        g = torch.Generator().manual_seed(7)
        out = [obs["policy"].clone()]
        for _ in range(steps):  # resets included: humanoids fall under random actions within ~40 steps
            obs, reward, _, _, _ = env.step(torch.rand(num_envs, env.action_dim, generator=g) * 2 - 1)
            out += [obs["policy"].clone(), reward.clone(), env.physics.state.qpos.clone()]
        return out
    finally:
        env.close()


@pytest.mark.parametrize("task,num_envs,steps", [("humanoid_walk", 5, 60), ("so101_lift", 5, 30)])
def test_every_thread_count_steps_the_same_numbers(task, num_envs, steps):
    ref = _trajectory(task, num_envs, 1, steps)
    for threads in (2, 3, 8):  # uneven slices (2 + 1 + 2 envs at 3 threads), more threads than envs
        got = _trajectory(task, num_envs, threads, steps)
        for a, b in zip(ref, got, strict=True):
            assert torch.equal(a, b), f"{task}: {threads} threads differ from 1"


def test_slices_cover_every_env_once():
    env = make_env("so101_reach", SimConfig(num_envs=7, num_threads=3))
    try:
        slices = env.physics._slices
        assert [(s.start, s.stop) for s in slices] == [(0, 2), (2, 5), (5, 7)]
    finally:
        env.close()
    env = make_env("so101_reach", SimConfig(num_envs=2, num_threads=4))
    try:
        assert len(env.physics._slices) == 2  # no empty slices, no idle workers
    finally:
        env.close()


def test_close_joins_the_worker_threads():
    import threading

    def workers() -> int:
        return sum(t.name.startswith("mujoco_step") for t in threading.enumerate())

    before = workers()
    env = make_env("so101_reach", SimConfig(num_envs=6, num_threads=3))
    env.reset(seed=0)
    env.step(torch.zeros(6, env.action_dim))
    assert workers() - before == 2  # the caller steps the first slice itself
    env.close()
    env.close()  # twice is harmless
    assert workers() == before


def test_an_env_dropped_without_close_stops_its_worker_threads():
    import gc
    import threading

    def workers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("mujoco_step")]

    before = set(workers())
    env = make_env("so101_reach", SimConfig(num_envs=6, num_threads=3))
    env.reset(seed=0)
    env.step(torch.zeros(6, env.action_dim))
    started = set(workers()) - before
    assert len(started) == 2
    del env
    gc.collect()
    assert not any(t.is_alive() for t in started)


def test_an_error_in_a_worker_reaches_the_caller_after_every_slice_returned():
    """A worker's exception is raised by ``step`` on the calling thread, only once every other slice has returned
    (nothing may still write into the output arrays), and the next step runs normally."""
    import threading
    import time

    env = make_env("so101_reach", SimConfig(num_envs=6, num_threads=3))
    try:
        env.reset(seed=0)
        phys = env.physics
        originals = phys._rollouts
        real = [r.rollout for r in originals]
        returned: dict[int, float] = {}

        class Slice:
            def __init__(self, i: int) -> None:
                self.i = i

            def rollout(self, *args, **kwargs):
                if self.i == 1:
                    raise RuntimeError(f"slice failed on {threading.current_thread().name}")
                time.sleep(0.05 * self.i)  # the last slice returns well after the failing one
                real[self.i](*args, **kwargs)
                returned[self.i] = time.perf_counter()

            def close(self) -> None:
                pass

        phys._rollouts = [Slice(i) for i in range(3)]
        with pytest.raises(RuntimeError, match="slice failed on mujoco_step_1"):
            env.step(torch.zeros(6, env.action_dim))
        raised = time.perf_counter()
        assert sorted(returned) == [0, 2] and returned[2] <= raised
        phys._rollouts = originals
        before = phys.state.qpos.clone()
        env.step(torch.ones(6, env.action_dim))
        assert not torch.equal(phys.state.qpos, before)  # the workers took the next step's slices
    finally:
        env.close()


def test_fault_checks_in_one_pass_match_the_reference():
    """``MujocoPhysics.faults`` checks the batched arrays in one compiled pass; by hand and against the backend-agnostic
    ``Physics.faults`` (torch ops): NaN or inf anywhere in the state or the sensor readings is non-finite, and a
    joint speed past the limit diverged unless a NaN makes the row only non-finite."""
    from sim.physics import Physics

    env = make_env("so101_lift", SimConfig(num_envs=7, num_threads=1))
    try:
        env.reset(seed=0)
        s = env.physics.state
        s.qpos[1, 2] = float("nan")
        s.sensordata[2, -1] = float("inf")
        s.qvel[3, 0] = -60.0  # past the limit of 50 below
        s.qvel[4, 1] = 60.0
        s.qvel[4, 2] = float("nan")  # ... but NaN: non-finite only, as torch's amax says
        s.qvel[5, 3] = float("inf")  # inf is both
        s.qvel[6, 0] = 50.0  # at the limit: fine
        nonfinite, too_fast = env.physics.faults(50.0)
        assert nonfinite.tolist() == [False, True, True, False, True, True, False]
        assert too_fast.tolist() == [False, False, False, True, False, True, False]
        ref = Physics.faults(env.physics, 50.0)
        assert torch.equal(nonfinite, ref[0]) and torch.equal(too_fast, ref[1])
    finally:
        env.close()
