"""The MJX backend: N copies of one MuJoCo model stepped in JAX (``jax.vmap``), for GPUs.

The model is the task's own MJCF (``task.build_spec().compile()``), put on the JAX device with
``mjx.put_model(impl="jax")``; the same task code reads the same sensors as on the ``mujoco`` backend.

State hand-over, zero-copy both ways through DLPack:

* torch tensors in ``self.state`` are the source of truth between calls; tasks write resets into them
  (``state.qpos[env_ids] = ...``).
* ``step``/``forward`` wrap those tensors as JAX arrays (``jax.dlpack.from_dlpack``: the same buffer), run one
  jitted function, and rebind ``state.qpos`` ... to torch views of the outputs (``torch.from_dlpack``: the same
  buffer again). DLPack's stream argument orders torch's and XLA's CUDA streams on each hand-over.
* Jitted functions never donate their inputs, so a buffer torch still views is never reused by XLA; a torch
  view keeps its JAX buffer alive. Only these six fields are viewed, and every one of them is an output of its
  own, so writing through one view never changes another.

Conventions kept equal to ``sim/mujoco_cpu.py``: ``sensordata`` is computed inside the last substep (before its
integration), the solver's warm start is zeroed at every control step (an env's result depends only on its own
state and controls), and a diverged env shows up as non-finite state (MJX never auto-resets). Where MJX's physics
differs from MuJoCo's it is fixed here (``physics_step``: clamped actuators in implicitfast) or adapted in the
model (``sim.mjx_compat.make_mjx_compatible``), so one model behaves the same on both backends
(tests/sim/test_mjx.py).

Domain randomization: the randomized fields (``sim.randomization.BatchedModelParams``, torch tensors [N, ...]) are
DLPack views inside the ``mjx.Model``, and every vmap maps them with ``in_axes=0`` while the rest of the model is
shared (``in_axes=None``): MuJoCo Playground's way of batching a model, with our own sampler and seeding.

Precision: float32 unless ``jax_enable_x64`` is on (then float64, like native MuJoCo).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import torch
from mujoco import mjx
from mujoco.mjx._src import forward as _mjx_forward  # implicit(): MJX's implicitfast integrator (mujoco-mjx 3.17)

from sim.host_render import HostRenderer
from sim.mjx_compat import make_mjx_compatible
from sim.physics import BatchedParamsPhysics
from sim.randomization import BatchedModelParams, ModelRandomizer, RandomizationConfig
from sim.state import SimState

_VIEWED = ("qpos", "qvel", "ctrl", "mocap_pos", "mocap_quat", "sensordata")


def jax_device(device: str | torch.device) -> jax.Device:
    """The JAX device holding the same memory as a torch device (``cpu`` or ``cuda:k``)."""
    device = torch.device(device)
    if device.type == "cpu":
        return jax.devices("cpu")[0]
    if device.type == "cuda":
        try:
            gpus = jax.devices("gpu")
        except RuntimeError as e:
            raise ValueError(  # a setting to change: robot-rl exits 2 with this line
                f"sim.device={device} but JAX sees no GPU ({e}); install jax with its CUDA plugin, or set "
                "sim.device=cpu device=cpu (MJX on the CPU is for tiny tests only)") from None
        return gpus[device.index or 0]
    raise ValueError(f"the mjx backend runs on 'cpu' or 'cuda:k' devices, got {device}")


def physics_step(m: mjx.Model, d: mjx.Data) -> mjx.Data:
    """One env's ``mjx.step``, with MuJoCo's rule for implicitfast kept: a force-clamped actuator adds no velocity
    derivative (``mjd_actuator_vel``: ``if force <= range[0] || force >= range[1]: continue``).

    mujoco-mjx 3.17's JAX ``implicit`` always adds kv; for a saturated servo (the SO-101's, most of the time) that
    over-damps the joint, and MJX and MuJoCo then part by ~1e-2 rad within one control step. Here the forward pass
    is MJX's own, and the integrator is MJX's ``implicit`` on a model whose kv (biasprm[2]) and gain velocity term
    (gainprm[2]) are zeroed for this env's clamped actuators.
    """
    if int(m.opt.integrator) != int(mujoco.mjtIntegrator.mjINT_IMPLICITFAST) or not np.any(m.actuator_forcelimited):
        return mjx.step(m, d)
    d = mjx.forward(m, d)
    lo, hi = m.actuator_forcerange[:, 0], m.actuator_forcerange[:, 1]
    f = d.actuator_force
    keep = jnp.where(jnp.asarray(m.actuator_forcelimited) & ((f <= lo) | (f >= hi)), 0.0, 1.0)
    m = m.replace(actuator_biasprm=m.actuator_biasprm.at[:, 2].multiply(keep),
                  actuator_gainprm=m.actuator_gainprm.at[:, 2].multiply(keep))
    return _mjx_forward.implicit(m, d)


def _model_axes(mx: mjx.Model, batched: tuple[str, ...]) -> mjx.Model | None:
    """vmap ``in_axes`` of a model whose fields ``batched`` hold one row per env: 0 on those, None elsewhere."""
    if not batched:
        return None
    return jax.tree.map(lambda _: None, mx).replace(**dict.fromkeys(batched, 0))


def _substeps(mx: mjx.Model, data: mjx.Data, nsubsteps: int, batched: tuple[str, ...]) -> tuple[mjx.Data, jax.Array]:
    """[N]-batched ``data`` advanced ``nsubsteps`` physics steps with ctrl/mocap held; and bool [N] diverged.

    ``batched``: the model fields with a leading env axis (randomized per env); the others are shared.
    """
    data = data.replace(qacc_warmstart=jnp.zeros_like(data.qacc_warmstart))
    batched_step = jax.vmap(physics_step, in_axes=(_model_axes(mx, batched), 0))
    data, _ = jax.lax.scan(lambda d, _: (batched_step(mx, d), None), data, None, length=nsubsteps)
    finite = jnp.isfinite(data.qpos).all(-1) & jnp.isfinite(data.qvel).all(-1)
    return data, ~finite


def _masked_forward(mx: mjx.Model, data: mjx.Data, mask: jax.Array, batched: tuple[str, ...]) -> mjx.Data:
    """``mjx.forward`` on the envs where ``mask`` [N] is true; the others keep every field as it was."""
    data = data.replace(act=jnp.where(jnp.isfinite(data.act), data.act, 0.0))
    new = jax.vmap(mjx.forward, in_axes=(_model_axes(mx, batched), 0))(mx, data)

    def pick(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, new, data)


# Module-level, so that every MjxPhysics of the same model and N reuses one compiled executable.
_STEP = jax.jit(_substeps, static_argnums=(2, 3))
_FORWARD = jax.jit(_masked_forward, static_argnums=(3,))
# One compiled broadcast of every field (eager per-field ops would compile ~100 tiny programs).
_BATCH = jax.jit(lambda d, n: jax.tree.map(lambda x: jnp.repeat(x[None], n, axis=0), d), static_argnums=(1,))


class MjxPhysics(BatchedParamsPhysics):
    """Batched MJX (JAX) physics behind torch tensors."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, device: str | torch.device = "cpu",
                 randomization: RandomizationConfig | None = None) -> None:
        make_mjx_compatible(model)
        self.model, self.num_envs = model, num_envs
        self.jax_device = jax_device(device)
        self._mx_nominal = self.mx = mjx.put_model(model, device=self.jax_device, impl="jax")
        self._params: BatchedModelParams | None = None
        self._batched: tuple[str, ...] = ()
        if randomization is not None and randomization.physics_enabled:
            dtype = _TORCH_DTYPE[str(self.mx.body_mass.dtype)]
            self._params = BatchedModelParams(model, randomization, num_envs, _torch_device(self.jax_device), dtype)
            self._batched = tuple(f for f, t in self._params.tensors.items()
                                  if t.numel() and f not in ModelRandomizer.RENDER_ONLY)
            self._bind_params()
        self._host_render = HostRenderer(model, num_envs, self._params)
        d = mujoco.MjData(model)
        mujoco.mj_resetData(model, d)
        mujoco.mj_forward(model, d)
        one = mjx.put_data(model, d, device=self.jax_device, impl="jax")
        # Every env starts at the model's default state, like the mujoco backend.
        self._data = _BATCH(one, num_envs)
        self.state = SimState(model, *(self._view(getattr(self._data, k)) for k in _VIEWED))
        self.torch_device = self.state.qpos.device

    # ------------------------------------------------------------------------------------- torch <-> jax
    def _view(self, x: jax.Array) -> torch.Tensor:
        if x.size == 0:  # DLPack of an empty buffer is not portable; nothing to share anyway
            return torch.empty(x.shape, dtype=_TORCH_DTYPE[str(x.dtype)], device=_torch_device(self.jax_device))
        return torch.from_dlpack(x)

    def _from_torch(self, t: torch.Tensor, like: jax.Array) -> jax.Array:
        if t.numel() == 0:
            return like
        t = t.to(dtype=_TORCH_DTYPE[str(like.dtype)], device=self.torch_device).contiguous()
        return jax.dlpack.from_dlpack(t)

    def _data_from_state(self) -> mjx.Data:
        """The held ``mjx.Data`` with the torch-side fields (what tasks may have written) swapped in."""
        s, d = self.state, self._data
        return d.replace(**{k: self._from_torch(getattr(s, k), getattr(d, k)) for k in _VIEWED})

    def _bind_params(self) -> None:
        """``self.mx``: the nominal model with the randomized fields swapped for views of the [N, ...] tensors."""
        tensors = self._params.tensors
        self.mx = self._mx_nominal.replace(**{f: jax.dlpack.from_dlpack(tensors[f]) for f in self._batched})

    def _publish(self, data: mjx.Data) -> None:
        self._data = data
        for k in _VIEWED:
            setattr(self.state, k, self._view(getattr(data, k)))
        self.state.invalidate()

    # --------------------------------------------------------------------------------------------- physics
    def step(self, ctrl: torch.Tensor, nsubsteps: int) -> torch.Tensor:
        self.state.ctrl = ctrl  # converted (and, if needed, copied) to JAX's dtype by _from_torch
        data, diverged = _STEP(self.mx, self._data_from_state(), int(nsubsteps), self._batched)
        self._publish(data)
        return torch.from_dlpack(diverged)

    def forward(self, env_ids: torch.Tensor) -> None:
        mask = torch.zeros(self.num_envs, dtype=torch.bool, device=self.torch_device)
        mask[env_ids.to(self.torch_device)] = True
        self._publish(_FORWARD(self.mx, self._data_from_state(), jax.dlpack.from_dlpack(mask), self._batched))

    def _params_changed(self) -> None:
        # Rows were written in place by torch; re-importing orders XLA's stream after those writes (DLPack's
        # stream handshake) and covers an import that copied.
        self._bind_params()

    def describe(self) -> dict[str, int]:
        """What one MJX step costs: contact slots and constraint rows (allocated for every env, touching or not)."""
        impl = self._data._impl
        return {"nq": self.model.nq, "nv": self.model.nv, "contact_slots": int(impl.contact.dist.shape[-1]),
                "constraint_rows": int(impl.efc_J.shape[-2]), "iterations": int(self.model.opt.iterations),
                "ls_iterations": int(self.model.opt.ls_iterations)}

    def precompile(self, nsubsteps: int) -> None:
        """Compile the step and the reset forward now (ahead of the first call), e.g. to time compilation."""
        _STEP.lower(self.mx, self._data, int(nsubsteps), self._batched).compile()
        mask = jnp.zeros(self.num_envs, bool, device=self.jax_device)
        _FORWARD.lower(self.mx, self._data, mask, self._batched).compile()

    # ------------------------------------------------------------------------------------------- rendering
    def render_many(self, cameras: list[str], width: int, height: int,
                    env_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return self._host_render.render_many(self.state, cameras, width, height, env_ids)

    def close(self) -> None:
        self._host_render.close()


_TORCH_DTYPE = {"float32": torch.float32, "float64": torch.float64, "bool": torch.bool, "int32": torch.int32}


def _torch_device(device: jax.Device) -> torch.device:
    return torch.device("cpu") if device.platform == "cpu" else torch.device("cuda", device.id)
