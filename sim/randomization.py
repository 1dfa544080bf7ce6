"""Domain randomization as config: per-env physics parameters, action latency, observation noise, cameras.

Ranges are ``[low, high]``; scales multiply the model's nominal value, offsets add to it. Physics parameters are
drawn per env at every reset from the env's own seeded generator, so a seed reproduces them exactly. The CPU
backend keeps one ``MjModel`` per randomized env (``mujoco.rollout`` takes a model per env); GPU backends batch
the same fields.

    sim.randomization.friction=[0.7,1.3] sim.randomization.action_latency=[0,2] sim.randomization.obs_noise=0.01
"""

from __future__ import annotations

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
    light_scale: list[float] = field(default_factory=_one)  # scale of every light's diffuse colour

    def __post_init__(self) -> None:
        for name in ("friction", "mass", "joint_damping", "armature", "actuator_gain", "light_scale",
                     "action_latency"):
            lo_hi = getattr(self, name)
            if len(lo_hi) != 2 or lo_hi[0] > lo_hi[1] or lo_hi[0] < 0:
                raise ValueError(f"randomization.{name} must be [low, high] with 0 <= low <= high, got {lo_hi}")
        for name in ("com_offset", "obs_noise", "camera_pos_jitter"):
            if getattr(self, name) < 0:
                raise ValueError(f"randomization.{name} must be >= 0, got {getattr(self, name)}")

    @property
    def physics_enabled(self) -> bool:
        """True when any per-env model parameter is randomized."""
        ranges = (self.friction, self.mass, self.joint_damping, self.armature, self.actuator_gain, self.light_scale)
        return any(lo != 1.0 or hi != 1.0 for lo, hi in ranges) or self.com_offset > 0 or self.camera_pos_jitter > 0

    @property
    def max_latency(self) -> int:
        return int(self.action_latency[1])


class ModelRandomizer:
    """Writes randomized parameters into per-env copies of a nominal model."""

    FIELDS = ("geom_friction", "body_mass", "body_inertia", "body_ipos", "dof_damping", "dof_armature",
              "actuator_gainprm", "actuator_biasprm", "cam_pos", "light_diffuse")

    def __init__(self, nominal: mujoco.MjModel, cfg: RandomizationConfig) -> None:
        self.cfg = cfg
        self.nominal = {f: getattr(nominal, f).copy() for f in self.FIELDS}
        # Position actuators: gain = kp, bias = [0, -kp, -kv]; scale kp in both so the servo stays a servo.
        self.position_actuators = np.flatnonzero(
            (nominal.actuator_gaintype == mujoco.mjtGain.mjGAIN_FIXED)
            & (nominal.actuator_biastype == mujoco.mjtBias.mjBIAS_AFFINE)
            & np.isclose(nominal.actuator_biasprm[:, 1], -nominal.actuator_gainprm[:, 0]))
        self.movable_bodies = np.arange(1, nominal.nbody)  # not the world

    def sample(self, model: mujoco.MjModel, gen: torch.Generator) -> dict[str, float]:
        """Randomize ``model`` in place (a per-env copy); returns the drawn scalar scales for logging."""
        cfg, nom = self.cfg, self.nominal

        def u(lo_hi: list[float], size: int | tuple[int, ...] = ()) -> np.ndarray:
            shape = (size,) if isinstance(size, int) else size
            r = torch.rand(shape or (1,), generator=gen, dtype=torch.float64).numpy()
            v = lo_hi[0] + r * (lo_hi[1] - lo_hi[0])
            return v if shape else v[:1]

        friction, mass = float(u(cfg.friction)[0]), float(u(cfg.mass)[0])
        damping, armature, gain = float(u(cfg.joint_damping)[0]), float(u(cfg.armature)[0]), \
            float(u(cfg.actuator_gain)[0])
        model.geom_friction[:] = nom["geom_friction"]
        model.geom_friction[:, 0] *= friction
        model.body_mass[:] = nom["body_mass"] * mass
        model.body_inertia[:] = nom["body_inertia"] * mass
        model.body_ipos[:] = nom["body_ipos"]
        if cfg.com_offset > 0:
            n = len(self.movable_bodies)
            model.body_ipos[self.movable_bodies] += u([-cfg.com_offset, cfg.com_offset], (n, 3))
        model.dof_damping[:] = nom["dof_damping"] * damping
        model.dof_armature[:] = nom["dof_armature"] * armature
        model.actuator_gainprm[:] = nom["actuator_gainprm"]
        model.actuator_biasprm[:] = nom["actuator_biasprm"]
        pa = self.position_actuators
        model.actuator_gainprm[pa, 0] *= gain
        model.actuator_biasprm[pa, 1] *= gain
        model.cam_pos[:] = nom["cam_pos"]
        if cfg.camera_pos_jitter > 0 and model.ncam:
            model.cam_pos[:] += u([-cfg.camera_pos_jitter, cfg.camera_pos_jitter], (model.ncam, 3))
        model.light_diffuse[:] = np.clip(nom["light_diffuse"] * float(u(cfg.light_scale)[0]), 0.0, 1.0)
        return {"friction": friction, "mass": mass, "joint_damping": damping, "armature": armature,
                "actuator_gain": gain}
