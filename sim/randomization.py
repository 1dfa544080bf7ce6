"""Domain randomization as config: per-env physics parameters, action latency, observation noise, cameras.

Ranges are ``[low, high]``; scales multiply the model's nominal value, offsets add to it. Physics parameters are
drawn per env at every reset from the env's own seeded generator, so a seed reproduces them exactly. The CPU
backend keeps one ``MjModel`` per randomized env (``mujoco.rollout`` takes a model per env); the batched backends
(mjx, warp) hold the same fields as ``[N, ...]`` tensors (``BatchedModelParams``). All draw through one sampler
(``ModelRandomizer.sample``), so one seed gives the same parameters on every backend.

    sim.randomization.friction=[0.7,1.3] sim.randomization.action_latency=[0,2] sim.randomization.obs_noise=0.01
    sim.randomization.camera_pos_jitter=0.01 sim.randomization.light_scale=[0.5,1] sim.randomization.color_scale=[0.6,1]

Masses and inertias have constants derived from them at compile time (``mj_setConst``: invweight0, which sets the
contacts' softness, subtree masses, actuator_acc0). Every backend recomputes them per env after every draw (without
that, mass scales flung objects): the CPU backend on its per-env models, the batched backends (mjx, warp) on the host
into ``[N, ...]`` rows of the ones their constraint solvers read (``BatchedModelParams.DERIVED``).

Colours (``color_scale``: geom and material RGB, so textures are tinted) only reach the renderer: every backend
renders on MuJoCo's CPU renderer from a per-env model, so they work on all of them; the device backends keep
those two fields out of their physics model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import mujoco
import numpy as np
import torch


def _one() -> list[float]:
    return [1.0, 1.0]


@dataclass
class RandomizationConfig:
    """What to randomize. The defaults randomize nothing."""

    friction: list[float] = field(default_factory=_one)  # scale of every geom's sliding friction
    mass: list[float] = field(default_factory=_one)  # scale of every body's mass and inertia
    com_offset: float = 0.0  # m, uniform offset in [-x, x] per axis of every body's centre of mass
    joint_damping: list[float] = field(default_factory=_one)  # scale of joint damping
    armature: list[float] = field(default_factory=_one)  # scale of joint armature (rotor inertia)
    actuator_gain: list[float] = field(default_factory=_one)  # scale of position-actuator kp (gain and bias)
    action_latency: list[int] = field(default_factory=lambda: [0, 0])  # control steps of delay, per env/episode
    obs_noise: float = 0.0  # std of Gaussian noise added to the ``policy`` observation group (critic stays clean)
    camera_pos_jitter: float = 0.0  # m, uniform offset in [-x, x] per axis of every camera's position
    # m, the same for cameras mounted on a moving body (the wrist camera: its offset from the gripper, which a
    # rigid mount keeps to a few mm on a real arm); None: camera_pos_jitter
    mounted_camera_pos_jitter: float | None = None
    light_scale: list[float] = field(default_factory=_one)  # scale of every light's diffuse colour
    # scale of each geom's and each material's R, G and B, drawn per channel (materials carry the textures, so
    # textured surfaces are tinted): what a renderer sees, never the physics
    color_scale: list[float] = field(default_factory=_one)

    def __post_init__(self) -> None:
        for name in ("friction", "mass", "joint_damping", "armature", "actuator_gain", "light_scale",
                     "color_scale", "action_latency"):
            lo_hi = getattr(self, name)
            if len(lo_hi) != 2 or lo_hi[0] > lo_hi[1] or lo_hi[0] < 0:
                raise ValueError(f"randomization.{name} must be [low, high] with 0 <= low <= high, got {lo_hi}")
        for name in ("com_offset", "obs_noise", "camera_pos_jitter", "mounted_camera_pos_jitter"):
            if (getattr(self, name) or 0.0) < 0:
                raise ValueError(f"randomization.{name} must be >= 0, got {getattr(self, name)}")

    @property
    def physics_enabled(self) -> bool:
        """True when any per-env model parameter is randomized."""
        ranges = (self.friction, self.mass, self.joint_damping, self.armature, self.actuator_gain, self.light_scale,
                  self.color_scale)
        return (any(lo != 1.0 or hi != 1.0 for lo, hi in ranges) or self.com_offset > 0 or self.camera_pos_jitter > 0
                or (self.mounted_camera_pos_jitter or 0.0) > 0)

    @property
    def max_latency(self) -> int:
        return int(self.action_latency[1])


class ModelRandomizer:
    """Draws per-env values of a nominal model's randomized fields; every backend uses this one sampler.

    ``sample`` consumes the env's generator in one fixed order for a batch of envs, so two backends given the
    same seed and the same resets draw the same parameters (the CPU backend writes them into per-env ``MjModel``
    copies, the batched backends into ``[N, ...]`` arrays).
    """

    FIELDS = ("geom_friction", "body_mass", "body_inertia", "body_ipos", "dof_damping", "dof_armature",
              "actuator_gainprm", "actuator_biasprm", "cam_pos", "light_diffuse", "geom_rgba", "mat_rgba")
    RENDER_ONLY = ("geom_rgba", "mat_rgba")  # only the renderer reads these: device backends keep them on the host

    def __init__(self, nominal: mujoco.MjModel, cfg: RandomizationConfig) -> None:
        self.cfg = cfg
        self.nominal = {f: getattr(nominal, f).copy() for f in self.FIELDS}
        # Position actuators: gain = kp, bias = [0, -kp, -kv]; scale kp in both so the servo stays a servo.
        self.position_actuators = np.flatnonzero(
            (nominal.actuator_gaintype == mujoco.mjtGain.mjGAIN_FIXED)
            & (nominal.actuator_biastype == mujoco.mjtBias.mjBIAS_AFFINE)
            & np.isclose(nominal.actuator_biasprm[:, 1], -nominal.actuator_gainprm[:, 0]))
        self.movable_bodies = np.arange(1, nominal.nbody)  # not the world
        self.fixed_cameras = nominal.cam_bodyid == 0  # on the world body; the others ride on a moving body
        # MuJoCo's renderer colours a geom with a material by the material's rgba unless the geom's own rgba differs
        # from the default (0.5, 0.5, 0.5, 1): scaling that default turns it into an override that paints the geom
        # grey (every textured or material-coloured surface went grey and dark). Those geoms are tinted through their
        # material's rgba instead; the draws stay the same, so a seed gives the same colours to the others.
        default_rgba = np.isclose(nominal.geom_rgba, [0.5, 0.5, 0.5, 1.0]).all(axis=1)
        self.material_coloured_geoms = np.flatnonzero((nominal.geom_matid >= 0) & default_rgba)

    def sample(self, num: int, gen: torch.Generator) -> dict[str, np.ndarray]:
        """float64 values ``[num, *field_shape]`` of every field in ``FIELDS``, one row per env."""
        cfg, nom = self.cfg, self.nominal

        def u(lo_hi: list[float], *shape: int) -> np.ndarray:  # U(lo, hi) of the given shape
            r = torch.rand(shape, generator=gen, dtype=torch.float64).numpy()
            return lo_hi[0] + r * (lo_hi[1] - lo_hi[0])

        def rows(f: str) -> np.ndarray:
            return np.repeat(nom[f][None], num, axis=0)

        friction, mass, damping = u(cfg.friction, num), u(cfg.mass, num), u(cfg.joint_damping, num)
        armature, gain = u(cfg.armature, num), u(cfg.actuator_gain, num)
        out = {f: rows(f) for f in self.FIELDS}
        out["geom_friction"][:, :, 0] *= friction[:, None]  # sliding friction only
        out["body_mass"] *= mass[:, None]
        out["body_inertia"] *= mass[:, None, None]
        if cfg.com_offset > 0:
            n = len(self.movable_bodies)
            out["body_ipos"][:, self.movable_bodies] += u([-cfg.com_offset, cfg.com_offset], num, n, 3)
        out["dof_damping"] *= damping[:, None]
        out["dof_armature"] *= armature[:, None]
        pa = self.position_actuators
        out["actuator_gainprm"][:, pa, 0] *= gain[:, None]
        out["actuator_biasprm"][:, pa, 1] *= gain[:, None]
        ncam = len(nom["cam_pos"])
        fixed = cfg.camera_pos_jitter
        mounted = fixed if cfg.mounted_camera_pos_jitter is None else cfg.mounted_camera_pos_jitter
        if max(fixed, mounted) > 0 and ncam:
            half = np.where(self.fixed_cameras, fixed, mounted)[None, :, None]  # [1, ncam, 1] m
            out["cam_pos"] += u([-1.0, 1.0], num, ncam, 3) * half
        out["light_diffuse"] = np.clip(out["light_diffuse"] * u(cfg.light_scale, num)[:, None, None], 0.0, 1.0)
        for f in self.RENDER_ONLY:
            if list(cfg.color_scale) != [1.0, 1.0] and len(nom[f]):
                scale = u(cfg.color_scale, num, len(nom[f]), 3)
                if f == "geom_rgba":
                    scale[:, self.material_coloured_geoms] = 1.0
                out[f][:, :, :3] = np.clip(out[f][:, :, :3] * scale, 0.0, 1.0)
        return out


def movable_centres_of_mass(model: mujoco.MjModel) -> None:
    """Let every body's centre of mass leave its compiled place (``com_offset``): the compiler marks a body whose
    inertial frame is its body frame ``sameframe`` (and ``simple``), and the kinematics then put the centre of mass at
    the body's origin whatever ``body_ipos`` says (the offset was ignored, and ``mj_setConst`` refuses such a model).
    """
    model.body_sameframe[1:] = mujoco.mjtSameFrame.mjSAMEFRAME_NONE
    model.body_simple[1:] = 0
    model.dof_simplenum[:] = 0


def write_env_params(model: mujoco.MjModel, params: dict[str, np.ndarray | torch.Tensor], row: int) -> None:
    """Copy one env's row of ``params`` (``ModelRandomizer.FIELDS`` -> ``[N, ...]``) into ``model`` in place."""
    for f, v in params.items():
        r = v[row]
        getattr(model, f)[:] = r.detach().cpu().double().numpy() if isinstance(r, torch.Tensor) else r


class BatchedModelParams:
    """Per-env values of ``ModelRandomizer.FIELDS`` and of the constants derived from them (``DERIVED``) as torch
    tensors ``[N, *field_shape]`` on the sim's device.

    What the batched backends hand their kernels: ``sim.mjx`` maps these fields with vmap ``in_axes=0`` in a batched
    ``mjx.Model``, ``sim.warp`` views them as its per-world model arrays. Redraws write rows in place, so views of
    these buffers (DLPack, ``wp.from_torch``) see them without being rebuilt. Every env starts at the nominal model.
    """

    # What mj_setConst derives from masses, inertias, centres of mass and armatures that the constraint solvers of mjx
    # and mujoco_warp read (the softness of contacts, limits and friction loss scales with them). Left at the nominal
    # model's, a mass scale made the CPU backend fling so101_lift's cube (sim.mujoco_cpu._refresh_constants); here
    # each redrawn env's row is recomputed on the host (``mj_setConst`` on a scratch model holding that env's
    # parameters: ~11 us for so101_lift, ~23 us for humanoid_walk on this machine kind).
    DERIVED = ("body_invweight0", "dof_invweight0", "tendon_invweight0")

    def __init__(self, nominal: mujoco.MjModel, cfg: RandomizationConfig, num_envs: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.sampler = ModelRandomizer(nominal, cfg)
        self._scratch = copy.copy(nominal)  # one env's parameters at a time, for mj_setConst
        if cfg.com_offset > 0:
            movable_centres_of_mass(self._scratch)  # as the CPU backend's per-env models
        self._scratch_data = mujoco.MjData(self._scratch)
        self.tensors = {f: torch.as_tensor(v, device=device, dtype=dtype).expand(num_envs, *v.shape).contiguous()
                        for f, v in {**self.sampler.nominal,
                                     **{f: getattr(nominal, f) for f in self.DERIVED}}.items()}

    def randomize(self, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        """New parameters for ``env_ids``, drawn from ``gen`` exactly as the CPU backend draws them, and the constants
        derived from them."""
        if env_ids.numel() == 0:
            return
        self._write(env_ids, self.sampler.sample(len(env_ids), gen))
        self._write(env_ids, self._derive(env_ids))

    def _derive(self, env_ids: torch.Tensor) -> dict[str, np.ndarray]:
        """``DERIVED`` [len(env_ids), ...] from those envs' parameters as held (in the tensors' dtype, as the solver
        reads them: a restored state_dict gives the same constants)."""
        ids = env_ids.to(self.tensors["body_mass"].device)
        physics = {f: self.tensors[f][ids].detach().cpu().double().numpy() for f in ModelRandomizer.FIELDS
                   if f not in ModelRandomizer.RENDER_ONLY}
        out = {f: np.empty((len(ids), *getattr(self._scratch, f).shape)) for f in self.DERIVED}
        for row in range(len(ids)):
            write_env_params(self._scratch, physics, row)
            mujoco.mj_setConst(self._scratch, self._scratch_data)
            for f in self.DERIVED:
                out[f][row] = getattr(self._scratch, f)
        return out

    def _write(self, env_ids: torch.Tensor, values: dict[str, np.ndarray]) -> None:
        for f, v in values.items():
            t = self.tensors[f]
            t[env_ids.to(t.device)] = torch.from_numpy(v).to(device=t.device, dtype=t.dtype)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The drawn parameters (the derived constants follow from them)."""
        return {f"model.{f}": self.tensors[f].clone() for f in ModelRandomizer.FIELDS}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        for f in ModelRandomizer.FIELDS:
            self.tensors[f].copy_(sd[f"model.{f}"])
        every = torch.arange(len(self.tensors["body_mass"]))
        self._write(every, self._derive(every))
