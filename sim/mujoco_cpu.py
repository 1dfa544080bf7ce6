"""The embedded CPU backend: N MuJoCo simulations stepped in native threads with the GIL released.

Stepping goes through ``mujoco.rollout``: one call per thread advances a contiguous slice of the envs by
``nsubsteps`` physics steps in C with the GIL released, reading the full physics state and the held controls from
preallocated arrays. We measured it against a Python thread pool calling ``mj_step`` per env
(benchmarks/sim_throughput.py): rollout is faster at every N because the per-env Python overhead and GIL hand-offs
are gone.

The calling thread steps the first slice itself and ``num_threads - 1`` worker threads the others, rather than
``mujoco.rollout``'s own pool (``Rollout(nthread=k)``), whose k workers run while the caller sleeps. Between two
env steps the caller is busy with the task's observations and rewards, the workers go idle, and waking them made
each physics call slower than back-to-back calls. Inside ``env.step``, 2 threads, one env alternating the two
(``benchmarks/sim_throughput.py``, ``stepping_ab``, 2026-12-05): humanoid_walk 2.45 vs 2.59 ms per call at N = 64
and 8.99 vs 10.16 ms at N = 256, so101_lift 16.96 vs 18.78 ms at N = 256; at N = 1024, where the physics call
dominates, a wash (0.98-1.02x the env steps/s). Each env's result depends only on its own state and controls (the
warm start is zeroed every control step), so the split changes no number.

The batched state lives in one numpy array ``[N, nstate]`` (mjSTATE_FULLPHYSICS) and one ``[N, nuser]``
(ctrl, mocap pose); the torch tensors handed to tasks are zero-copy views of them.

MuJoCo resets a diverged ``MjData`` silently (it only bumps a warning counter). We disable that auto-reset
so a divergence shows up as non-finite state, which the env turns into ``terminated`` for that env alone.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import threading
import weakref
from collections.abc import Callable

import mujoco
import mujoco.rollout
import numba
import numpy as np
import torch

import robot_rl
from sim.physics import Physics
from sim.randomization import ModelRandomizer, RandomizationConfig, movable_centres_of_mass, write_env_params
from sim.state import SimState
from sim.tiled_render import TiledRenderer

_S = mujoco.mjtState
_FULL = _S.mjSTATE_FULLPHYSICS.value
_USER = _S.mjSTATE_CTRL.value | _S.mjSTATE_MOCAP_POS.value | _S.mjSTATE_MOCAP_QUAT.value
log = logging.getLogger(__name__)
_warned_spin = False


def _warn_if_openmp_spins(num_threads: int) -> None:
    """Once per process: torch was loaded before robot_rl could shorten OpenMP's spin (robot_rl.OPENMP_SPIN), and
    both torch and the physics run on more than one thread, so torch's idle threads spin on the cores the physics
    needs (with one physics thread, the caller's, they spin beside it)."""
    global _warned_spin
    if _warned_spin or robot_rl.OPENMP_SPIN != "late" or torch.get_num_threads() <= 1 or num_threads <= 1:
        return
    _warned_spin = True
    log.warning("torch was imported before robot_rl/sim, so its %d OpenMP threads busy-wait after every parallel "
                "region on the cores MuJoCo steps on (with a policy between env steps, the steps ran much slower: "
                "benchmarks/torch_threads.py). Import sim or robot_rl before torch, or set GOMP_SPINCOUNT=%s in the "
                "environment, or call torch.set_num_threads(1) while stepping.", torch.get_num_threads(),
                robot_rl.OPENMP_SPIN_DEFAULT)


@numba.njit(cache=True)
def _faults(state: np.ndarray, sens: np.ndarray, qvel: slice, max_abs_qvel: float, nonfinite: np.ndarray,
            too_fast: np.ndarray) -> None:
    """``Physics.faults`` in one pass over the batched arrays: rows of ``state`` [N, nstate] or ``sens`` holding a NaN
    or inf, and rows whose joint speeds (``state[:, qvel]``) hold no NaN and exceed ``max_abs_qvel``."""
    for i in range(state.shape[0]):
        bad, nan, fastest = False, False, 0.0
        for j in range(state.shape[1]):
            x = state[i, j]
            if not math.isfinite(x):
                bad = True
        for j in range(sens.shape[1]):
            if not math.isfinite(sens[i, j]):
                bad = True
        for j in range(qvel.start, qvel.stop):
            x = state[i, j]
            if math.isnan(x):
                nan = True
            elif abs(x) > fastest:
                fastest = abs(x)
        nonfinite[i] = bad
        too_fast[i] = not nan and fastest > max_abs_qvel


class _SliceWorker:
    """One thread that runs the job it is handed and signals when done: the physics' second slice.

    Two bare locks hand the work over (one the caller releases to start a job, one the worker releases when it is
    done): a round trip costs ~29 us here against ~45 us for ``ThreadPoolExecutor.submit(...).result()``, whose
    future, work queue and condition variable were ~1 % of humanoid_walk's env step at N = 64. An exception in the
    job is raised by ``wait``, on the caller's thread."""

    def __init__(self, name: str) -> None:
        self._go, self._done = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._job: Callable[[], None] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            # The job is held no longer than it runs (here and in self._job): its closure holds the backend, which
            # would otherwise never be collected while this thread waits.
            job, self._job = self._job, None
            if job is None:  # close()
                self._done.release()
                return
            try:
                job()
            except BaseException as e:  # noqa: BLE001 (handed to the caller by wait())
                self._error = e
            del job
            self._done.release()

    def start(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the worker; ``wait`` must follow before the next ``start``."""
        self._job = job
        self._go.release()

    def wait(self) -> None:
        """Block until the job handed to ``start`` has returned; raise what it raised."""
        self._done.acquire()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        self._job = None
        self._go.release()
        self._done.acquire()
        self._thread.join()


def _release(workers: list[_SliceWorker], rollouts: list[mujoco.rollout.Rollout]) -> None:
    """Join the worker threads and close the rollouts of a backend (its close(), or its collection)."""
    for w in workers:
        w.close()
    for r in rollouts:
        r.close()


def _component_slices(model: mujoco.MjModel, spec: int, parts: list[int]) -> dict[int, slice]:
    """Offsets of each mjtState component inside a state vector of signature ``spec`` (bit order)."""
    out, adr = {}, 0
    bit = 1
    while bit <= spec:
        if spec & bit:
            size = mujoco.mj_stateSize(model, bit)
            if bit in parts:
                out[bit] = slice(adr, adr + size)
            adr += size
        bit <<= 1
    return out


class MujocoPhysics(Physics):
    """Batched native MuJoCo on the CPU."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, num_threads: int = 2,
                 randomization: RandomizationConfig | None = None) -> None:
        _warn_if_openmp_spins(min(num_threads, num_envs))
        model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_AUTORESET.value
        self.model, self.num_envs = model, num_envs
        self.num_threads = num_threads
        self.nstate = mujoco.mj_stateSize(model, _FULL)
        self.nuser = mujoco.mj_stateSize(model, _USER)
        self._state = np.zeros((num_envs, self.nstate))
        self._user = np.zeros((num_envs, self.nuser))
        self._sens = np.zeros((num_envs, model.nsensordata))
        self._warmstart = np.zeros((num_envs, model.nv))
        self._scratch = mujoco.MjData(model)
        mujoco.mj_resetData(model, self._scratch)
        mujoco.mj_forward(model, self._scratch)
        # Every env starts at the model's default state.
        mujoco.mj_getState(model, self._scratch, self._state[0], _FULL)
        mujoco.mj_getState(model, self._scratch, self._user[0], _USER)
        self._state[:] = self._state[0]
        self._user[:] = self._user[0]
        self._sens[:] = self._scratch.sensordata
        # Contiguous slices, one per thread: slice 0 on the calling thread, the others on the workers.
        k = max(1, min(num_threads, num_envs))
        edges = [round(i * num_envs / k) for i in range(k + 1)]
        self._slices = [slice(a, b) for a, b in itertools.pairwise(edges)]
        self._datas = [[mujoco.MjData(model)] for _ in self._slices]
        # rollout takes one model per env: shared when nothing is randomized, private copies when it is.
        self._randomizer = None
        if randomization is not None and randomization.physics_enabled:
            self._randomizer = ModelRandomizer(model, randomization)
            self._models = [copy.copy(model) for _ in range(num_envs)]
            if randomization.com_offset > 0:
                for m in self._models:
                    movable_centres_of_mass(m)
        else:
            self._models = [model] * num_envs
        self._rollouts = [mujoco.rollout.Rollout(nthread=0) for _ in self._slices]
        self._workers = [_SliceWorker(f"mujoco_step_{i}") for i in range(1, k)]
        # An env dropped without close() (a notebook, a sweep in one process, a build that failed after make_env)
        # stops its worker threads when it is collected, instead of leaving one idle thread per slice behind (81 had
        # piled up by the end of one `make test` process).
        self._release = weakref.finalize(self, _release, self._workers, self._rollouts)
        self._out_cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._tiles = TiledRenderer(model, num_envs * max(1, model.ncam))

        sl = _component_slices(model, _FULL, [_S.mjSTATE_QPOS.value, _S.mjSTATE_QVEL.value])
        us = _component_slices(model, _USER, [_S.mjSTATE_CTRL.value, _S.mjSTATE_MOCAP_POS.value,
                                               _S.mjSTATE_MOCAP_QUAT.value])
        self._qvel_cols = sl[_S.mjSTATE_QVEL.value]
        t_state, t_user = torch.from_numpy(self._state), torch.from_numpy(self._user)
        nm = model.nmocap
        self.state = SimState(
            model,
            qpos=t_state[:, sl[_S.mjSTATE_QPOS.value]],
            qvel=t_state[:, sl[_S.mjSTATE_QVEL.value]],
            ctrl=t_user[:, us[_S.mjSTATE_CTRL.value]],
            mocap_pos=t_user[:, us[_S.mjSTATE_MOCAP_POS.value]].view(num_envs, nm, 3),
            mocap_quat=t_user[:, us[_S.mjSTATE_MOCAP_QUAT.value]].view(num_envs, nm, 4),
            sensordata=torch.from_numpy(self._sens),
        )
        # Views must alias the arrays: tasks write resets through them.
        assert self.state.qpos.data_ptr() >= t_state.data_ptr()

    def _outputs(self, nsubsteps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if nsubsteps not in self._out_cache:
            n, m = self.num_envs, self.model
            self._out_cache[nsubsteps] = (
                np.zeros((n, nsubsteps, self.nuser)),
                np.zeros((n, nsubsteps, self.nstate)),
                np.zeros((n, nsubsteps, m.nsensordata)),
            )
        return self._out_cache[nsubsteps]

    def step(self, ctrl: torch.Tensor, nsubsteps: int) -> torch.Tensor:
        self.state.ctrl.copy_(ctrl.to(self.state.ctrl.dtype))
        control, state_out, sens_out = self._outputs(nsubsteps)
        control[:] = self._user[:, None, :]
        self._advance(control, nsubsteps, state_out, sens_out)
        self._state[:] = state_out[:, -1]
        self._sens[:] = sens_out[:, -1]
        self.state.invalidate()
        return torch.zeros(self.num_envs, dtype=torch.bool)

    def _advance(self, control: np.ndarray, nsubsteps: int, state_out: np.ndarray, sens_out: np.ndarray) -> None:
        """Every env ``nsubsteps`` physics steps from ``self._state`` under ``control`` [N, nsubsteps, nuser], each
        substep's state and sensors into ``state_out`` / ``sens_out``: one slice per thread, the caller's first."""
        # Warm start zeroed each control step: the result of an env then depends only on its own state
        # and controls, never on which thread's MjData ran it before (determinism under threading).
        def run(i: int) -> None:
            s = self._slices[i]
            self._rollouts[i].rollout(
                self._models[s], self._datas[i], self._state[s], control[s], control_spec=_USER, skip_checks=True,
                nstep=nsubsteps, initial_warmstart=self._warmstart[s], state=state_out[s], sensordata=sens_out[s],
            )

        for i, w in enumerate(self._workers, start=1):
            w.start(lambda i=i: run(i))
        try:
            run(0)
        finally:  # never return (or raise) while a worker still writes into the output arrays
            errors = []
            for w in self._workers:
                try:
                    w.wait()
                except Exception as e:  # noqa: BLE001 (raised once every worker is done)
                    errors.append(e)
            if errors:
                raise errors[0]

    def randomize(self, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        if self._randomizer is None:
            return
        ids = env_ids.tolist()
        drawn = self._randomizer.sample(len(ids), gen)
        for row, i in enumerate(ids):
            write_env_params(self._models[i], drawn, row)
            self._refresh_constants(i)

    def _refresh_constants(self, i: int) -> None:
        """Recompute env i's model constants derived from masses and inertias (``mj_setConst``: invweight0, subtree
        masses, actuator_acc0), which the constraint solver's softness reads. Left at the nominal model's, a mass
        scale of [0.75, 1.3] let so101_lift fling its cube (rewards to -119, |qvel| to 581 over 600 random steps of
        64 envs; -3.4 and 34 with them recomputed) and FlashSAC never learned the randomized task."""
        mujoco.mj_setConst(self._models[i], self._scratch)  # the scratch data is reloaded before every use

    def faults(self, max_abs_qvel: float) -> tuple[torch.Tensor, torch.Tensor]:
        # one compiled pass: the numpy and torch checks cost ~80 us per step at 64 humanoids, ~3% of the physics
        nonfinite = torch.empty(self.num_envs, dtype=torch.bool)
        too_fast = torch.empty(self.num_envs, dtype=torch.bool)
        _faults(self._state, self._sens, self._qvel_cols, float(max_abs_qvel), nonfinite.numpy(), too_fast.numpy())
        return nonfinite, too_fast

    def forward(self, env_ids: torch.Tensor) -> None:
        for i in env_ids.tolist():
            self._sens[i] = self._load_env(i)[1].sensordata
        self.state.invalidate()

    def _load_env(self, i: int) -> tuple[mujoco.MjModel, mujoco.MjData]:
        m, d = self._models[i], self._scratch
        mujoco.mj_setState(m, d, self._state[i], _FULL)
        mujoco.mj_setState(m, d, self._user[i], _USER)
        mujoco.mj_forward(m, d)
        return m, d

    def render_many(self, cameras: list[str], width: int, height: int,
                    env_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Randomized per-env models draw their own cameras and lights (same sizes and assets as the model)."""
        ids = range(self.num_envs) if env_ids is None else env_ids.tolist()
        return self._tiles.render_chw(self._load_env, ids, cameras, width, height)

    def state_dict(self) -> dict[str, torch.Tensor]:
        sd = {"state": torch.from_numpy(self._state.copy()), "user": torch.from_numpy(self._user.copy()),
              "sensordata": torch.from_numpy(self._sens.copy())}
        if self._randomizer is not None:
            for f in ModelRandomizer.FIELDS:
                sd[f"model.{f}"] = torch.from_numpy(np.stack([getattr(m, f) for m in self._models]))
        return sd

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        self._state[:] = sd["state"].numpy()
        self._user[:] = sd["user"].numpy()
        self._sens[:] = sd["sensordata"].numpy()
        self.state.invalidate()
        if self._randomizer is not None:
            for f in ModelRandomizer.FIELDS:
                for m, v in zip(self._models, sd[f"model.{f}"].numpy()):
                    getattr(m, f)[:] = v
            for i in range(self.num_envs):
                self._refresh_constants(i)

    def close(self) -> None:
        self._tiles.close()
        self._release()  # once: a second close() (or the collection after it) does nothing
        self._workers, self._rollouts = [], []
