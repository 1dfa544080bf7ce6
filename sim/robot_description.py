"""What a legged task needs to know about a robot's MJCF: its base, feet, default pose, joint groups, action scale.

The humanoid tasks read the model only through this description, so pointing them at another robot is a config:

    robot-rl train task=humanoid_walk task/robot=g1 task.robot.mjcf=/path/to/mujoco_menagerie/unitree_g1/scene_mjx.xml

Requirements on the MJCF: a floor geom, one free joint on the base body, and position actuators (gain kp, bias
-kp) on hinge joints; every actuator is driven by the policy, in the model's actuator order.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

import mujoco
import numpy as np

ASSETS = Path(__file__).resolve().parent / "assets"


@dataclass
class LeggedRobotDescription:
    """A floating-base robot for the legged tasks. Names are MJCF names; joint patterns are ``fnmatch`` globs."""

    mjcf: str = "humanoid.xml"  # relative: inside sim/assets; absolute or ~/...: your own file (meshes beside it)
    base_body: str = "pelvis"  # carries the free joint; base velocity, orientation and height are measured here
    base_site: str | None = "imu"  # IMU site on the base; None: a site is added at the base body's origin
    # foot body -> its geoms that touch the floor (contact sensors are geom-geom pairs: what MJX can compute).
    # An empty list takes every geom of the foot body that can collide (contype/conaffinity or a contact pair).
    feet: dict[str, list[str]] = field(default_factory=lambda: {
        "left_foot": ["left_sole_in", "left_sole_out"], "right_foot": ["right_sole_in", "right_sole_out"]})
    foot_sites: list[str] | None = field(default_factory=lambda: ["left_foot", "right_foot"])  # None: body origins
    floor_geom: str = "floor"
    keyframe: str | None = "home"  # the default pose (qpos); None: the model's qpos0
    default_joint_pos: dict[str, float] = field(default_factory=dict)  # pattern -> rad, over the keyframe
    base_height: float | None = None  # m, initial base height; None: the keyframe's
    joint_groups: dict[str, list[str]] = field(default_factory=lambda: {
        "legs": ["*hip*", "*knee*", "*ankle*"], "arms": ["*shoulder*", "*elbow*"]})
    action_scale: float = 0.5  # rad of joint-target offset at |a| = 1 ...
    group_action_scale: dict[str, float] = field(default_factory=dict)  # ... unless the joint's group sets its own
    fall_height: float = 0.45  # m, base height below which the robot has fallen

    def mjcf_path(self) -> Path:
        p = Path(self.mjcf).expanduser()
        path = p if p.is_absolute() else ASSETS / p
        if not path.is_file():
            raise FileNotFoundError(f"robot MJCF not found: {path} (task.robot.mjcf={self.mjcf!r}; relative paths "
                                    f"are inside {ASSETS})")
        return path

    def load_spec(self) -> mujoco.MjSpec:
        """The robot's MjSpec, with a site on the base (and on each foot) when the description names none."""
        spec = mujoco.MjSpec.from_file(str(self.mjcf_path()))
        bodies = {b.name: b for b in spec.bodies}
        for name in [self.base_body, *self.feet]:
            if name not in bodies:
                raise ValueError(f"robot description: no body {name!r} in {self.mjcf}; bodies: {sorted(bodies)[:40]}")
        if self.base_site is None:
            bodies[self.base_body].add_site(name="robot_rl_base")
        if self.foot_sites is None:
            for foot in self.feet:
                bodies[foot].add_site(name=f"robot_rl_{foot}")
        elif len(self.foot_sites) != len(self.feet):
            raise ValueError(f"robot description: {len(self.feet)} feet but {len(self.foot_sites)} foot_sites")
        return spec

    @property
    def base_site_name(self) -> str:
        return self.base_site or "robot_rl_base"

    @property
    def foot_site_names(self) -> list[str]:
        return list(self.foot_sites) if self.foot_sites is not None else [f"robot_rl_{f}" for f in self.feet]

    def foot_contact_geoms(self, spec: mujoco.MjSpec) -> list[list[str]]:
        """Per foot, the names of its floor-contact geoms (unnamed collision geoms of the foot get names here)."""
        paired = {g for p in spec.pairs for g in (p.geomname1, p.geomname2)}
        out = []
        for foot, listed in self.feet.items():
            body = spec.body(foot)
            if listed:
                names = {g.name for g in body.geoms}
                missing = sorted(set(listed) - names)
                if missing:
                    raise ValueError(f"robot description: foot {foot!r} has no geom(s) {missing}; its geoms: "
                                     f"{sorted(n for n in names if n)}")
                out.append(list(listed))
                continue
            geoms = []
            for i, g in enumerate(body.geoms):
                if (g.contype or g.conaffinity) or (g.name and g.name in paired):
                    if not g.name:
                        g.name = f"robot_rl_{foot}_geom{i}"
                    geoms.append(g.name)
            if not geoms:
                raise ValueError(f"robot description: foot {foot!r} has no geom that can touch the floor; list them "
                                 f"in task.robot.feet")
            out.append(geoms)
        return out

    # --------------------------------------------------------------------------------- on the compiled model
    def base_dofs(self, model: mujoco.MjModel) -> tuple[int, int]:
        """(qpos address, dof address) of the base's free joint."""
        bid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, self.base_body)
        jid = int(model.body_jntadr[bid])
        if jid < 0 or model.jnt_type[jid] != mujoco.mjtJoint.mjJNT_FREE.value:
            raise ValueError(f"robot description: base body {self.base_body!r} has no free joint as its first joint")
        return int(model.jnt_qposadr[jid]), int(model.jnt_dofadr[jid])

    def actuated_joints(self, model: mujoco.MjModel) -> list[str]:
        """Joint names in actuator order; every actuator must be a position servo on a hinge or slide joint."""
        names = []
        for i in range(model.nu):
            if model.actuator_trntype[i] != mujoco.mjtTrn.mjTRN_JOINT.value:
                raise ValueError(f"robot description: actuator {model.actuator(i).name!r} does not drive a joint")
            jid = int(model.actuator_trnid[i, 0])
            if model.jnt_type[jid] not in (mujoco.mjtJoint.mjJNT_HINGE.value, mujoco.mjtJoint.mjJNT_SLIDE.value):
                raise ValueError(f"robot description: actuator {model.actuator(i).name!r} drives a non-hinge joint")
            if not (model.actuator_biastype[i] == mujoco.mjtBias.mjBIAS_AFFINE.value
                    and np.isclose(model.actuator_biasprm[i, 1], -model.actuator_gainprm[i, 0])):
                raise ValueError(f"robot description: actuator {model.actuator(i).name!r} is not a position servo; "
                                 "the legged tasks send joint targets")
            names.append(model.joint(jid).name)
        return names

    def default_qpos(self, model: mujoco.MjModel) -> np.ndarray:
        """The full default qpos: keyframe (or qpos0), joint overrides, base height."""
        if self.keyframe is None:
            qpos = model.qpos0.copy()
        else:
            kid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_KEY, self.keyframe)
            if kid < 0:
                keys = [model.key(i).name for i in range(model.nkey)]
                raise ValueError(f"robot description: no keyframe {self.keyframe!r}; the model has {keys}")
            qpos = model.key_qpos[kid].copy()
        joints = [model.joint(j).name for j in range(model.njnt)]
        for pattern, value in self.default_joint_pos.items():
            hits = fnmatch.filter(joints, pattern)
            if not hits:
                raise ValueError(f"robot description: default_joint_pos pattern {pattern!r} matches no joint")
            for name in hits:
                qpos[model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)]] = value
        if self.base_height is not None:
            qpos[self.base_dofs(model)[0] + 2] = self.base_height
        return qpos

    def joint_action_scale(self, joint_names: list[str]) -> np.ndarray:
        """Per actuated joint: the scale of its group (first matching group in order), else ``action_scale``."""
        unknown = sorted(set(self.group_action_scale) - set(self.joint_groups))
        if unknown:
            raise ValueError(f"robot description: group_action_scale names unknown group(s) {unknown}; groups: "
                             f"{sorted(self.joint_groups)}")
        scale = np.full(len(joint_names), self.action_scale)
        for i, name in enumerate(joint_names):
            for group, patterns in self.joint_groups.items():
                if any(fnmatch.fnmatch(name, p) for p in patterns):
                    scale[i] = self.group_action_scale.get(group, self.action_scale)
                    break
        return scale
