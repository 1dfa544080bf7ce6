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
state and controls), and a diverged env shows up as non-finite state (MJX never auto-resets).

Precision: float32 unless ``jax_enable_x64`` is on (then float64, like native MuJoCo).
"""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import torch
from mujoco import mjx

from sim.core import Physics, SimState

log = logging.getLogger(__name__)

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
            raise RuntimeError(
                f"sim.device={device} but JAX sees no GPU ({e}); install jax with its CUDA plugin, or set "
                "sim.device=cpu (MJX on the CPU is for tiny tests only)") from None
        return gpus[device.index or 0]
    raise ValueError(f"the mjx backend runs on 'cpu' or 'cuda:k' devices, got {device}")


def make_mjx_compatible(model: mujoco.MjModel) -> list[str]:
    """Adapt ``model`` in place to what MJX's JAX implementation supports; returns what was changed.

    * Solver: MJX has no PGS; PGS becomes Newton (few iterations for small nv, what MJX recommends on GPUs).
    * Collision pairs without an MJX collision function (cylinder-box, as of mujoco-mjx 3.17): the cylinder
      collides as the box that bounds it (same pose, half-sizes r, r, h). Same for both backends when the caller
      also hands this model to ``mujoco`` (the agreement tests do).
    * Frictionless contacts (condim 1) under elliptic cones, which MJX does not implement: condim 3 (the pair's
      own friction then applies).
    * Contact sensors MJX cannot compute (site, body or subtree matching, net-force reduction): a clear error
      naming the sensor; geom-geom contact sensors are supported.
    """
    from mujoco.mjx._src import collision_driver  # the pair list MJX itself will check in put_model

    changes = []
    if model.opt.solver == mujoco.mjtSolver.mjSOL_PGS:
        model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
        changes.append("solver PGS -> Newton")
    cyl = int(mujoco.mjtGeom.mjGEOM_CYLINDER)
    to_box = set()
    for g1, g2, _ in collision_driver.geom_pairs(model):
        t1, t2 = model.geom_type[[g1, g2]]
        if not collision_driver.has_collision_fn(t1, t2):
            cyls = [g for g, t in ((g1, t1), (g2, t2)) if t == cyl]
            if not cyls:
                raise NotImplementedError(
                    f"MJX has no collision function for geoms {_geom_label(model, g1)} ({mujoco.mjtGeom(t1).name}) "
                    f"and {_geom_label(model, g2)} ({mujoco.mjtGeom(t2).name}); change one of their types or "
                    "exclude the pair (contype/conaffinity)")
            to_box.update(cyls)
    for g in sorted(to_box):
        r, h = model.geom_size[g, :2]
        model.geom_type[g] = mujoco.mjtGeom.mjGEOM_BOX
        model.geom_size[g] = (r, r, h)
        model.geom_rbound[g] = float(np.sqrt(2 * r * r + h * h))
        model.geom_aabb[g] = (0.0, 0.0, 0.0, r, r, h)
        changes.append(f"collision cylinder {_geom_label(model, g)} -> its bounding box")
    if model.opt.cone == mujoco.mjtCone.mjCONE_ELLIPTIC:
        for p in range(model.npair):
            if model.pair_dim[p] == 1:
                model.pair_dim[p] = 3
                changes.append(f"contact pair {_geom_label(model, model.pair_geom1[p])}-"
                               f"{_geom_label(model, model.pair_geom2[p])}: condim 1 -> 3 (elliptic cones)")
        for g in range(model.ngeom):
            if model.geom_condim[g] == 1 and (model.geom_contype[g] or model.geom_conaffinity[g]):
                model.geom_condim[g] = 3
                changes.append(f"geom {_geom_label(model, g)}: condim 1 -> 3 (elliptic cones)")
    for i in range(model.nsensor):
        if model.sensor_type[i] != mujoco.mjtSensor.mjSENS_CONTACT:
            continue
        kinds = {int(model.sensor_objtype[i]), int(model.sensor_reftype[i])}
        bad = {int(mujoco.mjtObj.mjOBJ_SITE), int(mujoco.mjtObj.mjOBJ_BODY), int(mujoco.mjtObj.mjOBJ_XBODY)} & kinds
        if bad or model.sensor_intprm[i, 1] == 3:
            raise NotImplementedError(
                f"contact sensor {model.sensor(i).name!r} uses site/body/subtree matching or net-force reduction, "
                "which MJX cannot compute; match geoms against geoms instead")
    for c in changes:
        log.warning("mjx: %s", c)
    if model.opt.ls_iterations > 10 or model.opt.iterations > 20:
        # Under vmap MJX's line search runs all ls_iterations every solver iteration (a scan of conds turned into
        # selects), and float32 rarely meets MuJoCo's default tolerance: the cost is ~iterations x ls_iterations.
        log.warning("mjx: solver iterations=%d ls_iterations=%d make every MJX step expensive; MJX models usually "
                    "set <option iterations=\"4-10\" ls_iterations=\"4-10\">", model.opt.iterations,
                    model.opt.ls_iterations)
    return changes


def _geom_label(model: mujoco.MjModel, g: int) -> str:
    name = model.geom(g).name
    return repr(name) if name else f"#{g} of body {model.body(model.geom_bodyid[g]).name!r}"


def _substeps(mx: mjx.Model, data: mjx.Data, nsubsteps: int) -> tuple[mjx.Data, jax.Array]:
    """[N]-batched ``data`` advanced ``nsubsteps`` physics steps with ctrl/mocap held; and bool [N] diverged."""
    data = data.replace(qacc_warmstart=jnp.zeros_like(data.qacc_warmstart))
    batched_step = jax.vmap(mjx.step, in_axes=(None, 0))
    data, _ = jax.lax.scan(lambda d, _: (batched_step(mx, d), None), data, None, length=nsubsteps)
    finite = jnp.isfinite(data.qpos).all(-1) & jnp.isfinite(data.qvel).all(-1)
    return data, ~finite


def _masked_forward(mx: mjx.Model, data: mjx.Data, mask: jax.Array) -> mjx.Data:
    """``mjx.forward`` on the envs where ``mask`` [N] is true; the others keep every field as it was."""
    data = data.replace(act=jnp.where(jnp.isfinite(data.act), data.act, 0.0))
    new = jax.vmap(mjx.forward, in_axes=(None, 0))(mx, data)

    def pick(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, new, data)


# Module-level, so that every MjxPhysics of the same model and N reuses one compiled executable.
_STEP = jax.jit(_substeps, static_argnums=(2,))
_FORWARD = jax.jit(_masked_forward)
# One compiled broadcast of every field (eager per-field ops would compile ~100 tiny programs).
_BATCH = jax.jit(lambda d, n: jax.tree.map(lambda x: jnp.repeat(x[None], n, axis=0), d), static_argnums=(1,))


class MjxPhysics(Physics):
    """Batched MJX (JAX) physics behind torch tensors."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, device: str | torch.device = "cpu") -> None:
        make_mjx_compatible(model)
        self.model, self.num_envs = model, num_envs
        self.jax_device = jax_device(device)
        self.mx = mjx.put_model(model, device=self.jax_device, impl="jax")
        d = mujoco.MjData(model)
        mujoco.mj_resetData(model, d)
        mujoco.mj_forward(model, d)
        one = mjx.put_data(model, d, device=self.jax_device, impl="jax")
        # Every env starts at the model's default state, like the mujoco backend.
        self._data = _BATCH(one, num_envs)
        self._scratch = d
        self._renderers: dict[tuple[int, int], mujoco.Renderer] = {}
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

    def _publish(self, data: mjx.Data) -> None:
        self._data = data
        for k in _VIEWED:
            setattr(self.state, k, self._view(getattr(data, k)))

    # --------------------------------------------------------------------------------------------- physics
    def step(self, ctrl: torch.Tensor, nsubsteps: int) -> torch.Tensor:
        self.state.ctrl = ctrl  # converted (and, if needed, copied) to JAX's dtype by _from_torch
        data, diverged = _STEP(self.mx, self._data_from_state(), int(nsubsteps))
        self._publish(data)
        return torch.from_dlpack(diverged)

    def forward(self, env_ids: torch.Tensor) -> None:
        mask = torch.zeros(self.num_envs, dtype=torch.bool, device=self.torch_device)
        mask[env_ids.to(self.torch_device)] = True
        self._publish(_FORWARD(self.mx, self._data_from_state(), jax.dlpack.from_dlpack(mask)))

    def describe(self) -> dict[str, int]:
        """What one MJX step costs: contact slots and constraint rows (allocated for every env, touching or not)."""
        impl = self._data._impl
        return {"nq": self.model.nq, "nv": self.model.nv, "contact_slots": int(impl.contact.dist.shape[-1]),
                "constraint_rows": int(impl.efc_J.shape[-2]), "iterations": int(self.model.opt.iterations),
                "ls_iterations": int(self.model.opt.ls_iterations)}

    def precompile(self, nsubsteps: int) -> None:
        """Compile the step and the reset forward now (ahead of the first call), e.g. to time compilation."""
        _STEP.lower(self.mx, self._data, int(nsubsteps)).compile()
        _FORWARD.lower(self.mx, self._data, jnp.zeros(self.num_envs, bool, device=self.jax_device)).compile()

    # ------------------------------------------------------------------------------------------- rendering
    def _load_env(self, i: int) -> mujoco.MjData:
        """Env ``i``'s state copied into a native MjData (for rendering on MuJoCo's CPU renderer)."""
        d, s = self._scratch, self.state
        for k in ("qpos", "qvel", "ctrl"):
            getattr(d, k)[:] = getattr(s, k)[i].cpu().double().numpy()
        if self.model.nmocap:
            d.mocap_pos[:] = s.mocap_pos[i].cpu().double().numpy()
            d.mocap_quat[:] = s.mocap_quat[i].cpu().double().numpy()
        mujoco.mj_forward(self.model, d)
        return d

    def render(self, camera: str, width: int, height: int, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        ids = range(self.num_envs) if env_ids is None else env_ids.tolist()
        r = self._renderer(width, height)
        frames = np.empty((len(ids), height, width, 3), dtype=np.uint8)
        for j, i in enumerate(ids):
            r.update_scene(self._load_env(i), camera=camera)
            frames[j] = r.render()
        return torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()

    def _renderer(self, width: int, height: int) -> mujoco.Renderer:
        if (width, height) not in self._renderers:
            os.environ.setdefault("MUJOCO_GL", "egl")
            r = mujoco.Renderer(self.model, height=height, width=width)
            # Shadows, reflections and the skybox cost ~70 ms a frame on a CPU renderer (DESIGN.md §4).
            for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION,
                         mujoco.mjtRndFlag.mjRND_SKYBOX):
                r.scene.flags[flag] = 0
            self._renderers[(width, height)] = r
        return self._renderers[(width, height)]

    def close(self) -> None:
        for r in self._renderers.values():
            r.close()
        self._renderers.clear()


_TORCH_DTYPE = {"float32": torch.float32, "float64": torch.float64, "bool": torch.bool, "int32": torch.int32}


def _torch_device(device: jax.Device) -> torch.device:
    return torch.device("cpu") if device.platform == "cpu" else torch.device("cuda", device.id)
