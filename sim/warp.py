"""The MuJoCo Warp backend: N worlds of one MuJoCo model stepped by ``mujoco_warp`` kernels, for NVIDIA GPUs.

Optional: the ``warp`` extra (``mujoco-warp``, ``warp-lang``); ``sim.registry`` imports this module only for
``sim.backend=warp``. Warp also has a CPU device and mujoco_warp runs on it (slowly; its kernels compile once into
Warp's kernel cache, ~3 min cold for the humanoid on 2 cores), which is what the tests use where there is no GPU.

State hand-over, zero-copy: the tensors in ``self.state`` are ``wp.to_torch`` views of ``mjw.Data``'s own arrays
(``qpos`` [N, nq], ``mocap_pos`` [N, nmocap, 3] ...), allocated once. Tasks write resets through them, ``step``
copies the controls into ``ctrl`` in place, and the kernels read and write the same memory. Randomized model fields
go the other way: torch tensors ``[N, ...]`` (``sim.randomization.BatchedModelParams``, rows rewritten in place)
viewed with ``wp.from_torch`` as per-world model arrays (mujoco_warp reads row ``worldid % shape[0]`` of every
model field whose spec starts with ``*``, ``mujoco_warp._src.types.Model``).

On CUDA, Warp works on its own stream, fenced against torch's current stream before and after each call
(``Stream.wait_stream``: no host synchronisation), and a control step is one CUDA graph per ``nsubsteps``
(captured at first use; needs Warp's memory pool, as mjlab's ``Simulation`` does). Capture is impossible on
torch's legacy default stream, hence the separate stream.

Conventions kept equal to ``sim/mujoco_cpu.py`` and ``sim/mjx.py``: ``sensordata`` is computed inside the last
substep (``mjw.step`` runs forward, sensors included, then integrates), the warm start is zeroed at every control
step, and a diverged world shows up as non-finite state (mujoco_warp has no auto-reset). Float32 throughout.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mujoco
import mujoco_warp as mjw
import torch
import warp as wp

from robot_rl.env import nonfinite_rows
from sim.host_render import HostRenderer
from sim.physics import BatchedParamsPhysics
from sim.randomization import BatchedModelParams, ModelRandomizer, RandomizationConfig
from sim.state import SimState

_VIEWED = ("qpos", "qvel", "ctrl", "mocap_pos", "mocap_quat", "sensordata")
_MIN_GRAPH_DRIVER = (12, 4)  # mujoco_warp's solver uses conditional graph nodes (``opt.graph_conditional``)


def warp_device(device: str | torch.device) -> wp.Device:
    """The Warp device holding the same memory as a torch device (``cpu`` or ``cuda:k``)."""
    device = torch.device(device)
    if device.type == "cuda":
        if not wp.is_cuda_available():
            raise ValueError(f"sim.device={device} but Warp sees no CUDA device (driver "  # a setting: exit 2
                             f"{wp.get_cuda_driver_version()}); set sim.device=cpu device=cpu (tiny tests only) or "
                             f"use a GPU")
        return wp.get_device(f"cuda:{device.index or 0}")
    if device.type == "cpu":
        return wp.get_device("cpu")
    raise ValueError(f"the warp backend runs on 'cpu' or 'cuda:k' devices, got {device}")


def default_capacity(model: mujoco.MjModel, nconmax: int = 64) -> tuple[int, int]:
    """Per-world contact and constraint-row capacities: ``(nconmax, njmax)``.

    Rows per contact: ``2 (condim - 1)`` with pyramidal cones, ``condim`` with elliptic ones (MuJoCo's
    computation chapter); plus one row per limited joint or tendon, per DOF with friction loss, and up to six per
    equality. mujoco_warp's own default sizes rows from the contacts at the initial pose, which a falling humanoid
    outgrows.
    """
    condim = max([1, *model.geom_condim.tolist(), *model.pair_dim.tolist()])
    pyramidal = model.opt.cone == mujoco.mjtCone.mjCONE_PYRAMIDAL
    per_contact = max(1, 2 * (condim - 1)) if pyramidal else condim
    other = int(model.jnt_limited.sum() + model.tendon_limited.sum() + (model.dof_frictionloss > 0).sum())
    return nconmax, nconmax * per_contact + other + 6 * model.neq


def _without_autoreset(model: mujoco.MjModel) -> mujoco.MjModel:
    """``model``, or a copy without the ``mjDSBL_AUTORESET`` bit (which mujoco_warp refuses: it never auto-resets,
    so the bit the mujoco backend sets on a shared model asks for nothing here)."""
    bit = int(mujoco.mjtDisableBit.mjDSBL_AUTORESET)
    if not model.opt.disableflags & bit:
        return model
    model = copy.copy(model)
    model.opt.disableflags &= ~bit
    return model


class WarpPhysics(BatchedParamsPhysics):
    """Batched MuJoCo Warp physics behind torch tensors."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, device: str | torch.device = "cuda:0",
                 randomization: RandomizationConfig | None = None, nconmax: int | None = None,
                 njmax: int | None = None) -> None:
        """``nconmax``/``njmax``: per-world contact and constraint-row capacities (``default_capacity``); on
        overflow mujoco_warp prints which one to raise and drops what does not fit."""
        self.model, self.num_envs = model, num_envs
        self.wp_device = warp_device(device)
        self.torch_device = torch.device(wp.device_to_torch(self.wp_device))
        default_con, default_rows = default_capacity(model, nconmax or 64)
        self.nconmax, self.njmax = nconmax or default_con, njmax or default_rows
        with wp.ScopedDevice(self.wp_device):
            self.m = mjw.put_model(_without_autoreset(model))
            # Reaching the iteration limit is routine (MuJoCo does not warn); overflows still print.
            quiet = mjw.OverflowType.ITERATIONS | mjw.OverflowType.LS_ITERATIONS
            self.m.opt.warn_overflow = int(self.m.opt.warn_overflow) & ~int(quiet)
            d = mujoco.MjData(model)
            mujoco.mj_resetData(model, d)
            mujoco.mj_forward(model, d)
            # Every world starts at the model's default state, like the other backends.
            self.d = mjw.put_data(model, d, nworld=num_envs, nconmax=self.nconmax, njmax=self.njmax)
        self._params: BatchedModelParams | None = None
        if randomization is not None and randomization.physics_enabled:
            self._params = BatchedModelParams(model, randomization, num_envs, self.torch_device, torch.float32)
            for f, t in self._params.tensors.items():
                if t.numel() and f not in ModelRandomizer.RENDER_ONLY:  # the model array: a view of the tensor
                    setattr(self.m, f, wp.from_torch(t, dtype=getattr(self.m, f).dtype))
        self.state = SimState(model, *(wp.to_torch(getattr(self.d, k)) for k in _VIEWED))
        self._host_render = HostRenderer(model, num_envs, self._params)
        self._cuda = self.wp_device.is_cuda
        self._use_graphs = self._cuda and wp.is_mempool_enabled(self.wp_device) and \
            (wp.get_cuda_driver_version() or (0, 0)) >= _MIN_GRAPH_DRIVER
        self._graphs: dict[object, wp.Graph] = {}

    # --------------------------------------------------------------------------------------------- running
    @contextmanager
    def _on_device(self) -> Iterator[None]:
        """Warp work on this device, ordered after torch's queued work and before torch's next (CUDA)."""
        with wp.ScopedDevice(self.wp_device):
            if not self._cuda:
                yield
                return
            torch_stream, stream = wp.stream_from_torch(self.torch_device), wp.get_stream(self.wp_device)
            stream.wait_stream(torch_stream)
            yield
            torch_stream.wait_stream(stream)

    def _run(self, key: object, work: Callable[[], None]) -> None:
        """``work`` (Warp launches), replayed from a CUDA graph captured at its first call where graphs are used."""
        with self._on_device():
            if not self._use_graphs:
                work()
                return
            if key not in self._graphs:
                gc_enabled = gc.isenabled()
                gc.disable()  # a stale graph's destructor must not be recorded into the capture (as mjlab does)
                try:
                    with wp.ScopedCapture(device=self.wp_device) as capture:
                        work()
                finally:
                    if gc_enabled:
                        gc.enable()
                self._graphs[key] = capture.graph
            wp.capture_launch(self._graphs[key])

    def _substeps(self, nsubsteps: int) -> None:
        self.d.qacc_warmstart.zero_()
        for _ in range(nsubsteps):
            mjw.step(self.m, self.d)

    def step(self, ctrl: torch.Tensor, nsubsteps: int) -> torch.Tensor:
        self.state.ctrl.copy_(ctrl)
        self._run(("step", int(nsubsteps)), lambda: self._substeps(int(nsubsteps)))
        self.state.invalidate()
        return nonfinite_rows(self.state.qpos) | nonfinite_rows(self.state.qvel)

    def forward(self, env_ids: torch.Tensor) -> None:
        """``mjw.forward`` runs on every world; the others get their sensordata (from their last substep) back."""
        keep = torch.ones(self.num_envs, dtype=torch.bool, device=self.torch_device)
        keep[env_ids.to(self.torch_device)] = False
        kept = self.state.sensordata[keep]
        if self.model.na:
            torch.nan_to_num_(wp.to_torch(self.d.act), nan=0.0, posinf=0.0, neginf=0.0)
        self._run("forward", lambda: mjw.forward(self.m, self.d))
        self.state.sensordata[keep] = kept
        self.state.invalidate()

    # randomize/state_dict from BatchedParamsPhysics: rows are written in place, so the model's views (and
    # captured CUDA graphs) see them without rebinding.

    def describe(self) -> dict[str, int]:
        """What one step allocates: per-world contact and constraint-row capacities."""
        return {"nq": self.model.nq, "nv": self.model.nv, "nconmax": self.nconmax, "njmax": self.njmax,
                "iterations": int(self.model.opt.iterations), "ls_iterations": int(self.model.opt.ls_iterations)}

    def precompile(self, nsubsteps: int) -> None:
        """Load (compile) every kernel of a control step and a reset forward now, and capture their graphs."""
        saved = self.state_dict()
        self.step(self.state.ctrl.clone(), nsubsteps)
        self.forward(torch.arange(self.num_envs, device=self.torch_device))
        self.load_state_dict(saved)

    # ------------------------------------------------------------------------------------------- rendering
    def render_many(self, cameras: list[str], width: int, height: int,
                    env_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return self._host_render.render_many(self.state, cameras, width, height, env_ids)

    def close(self) -> None:
        self._host_render.close()
        self._graphs.clear()
