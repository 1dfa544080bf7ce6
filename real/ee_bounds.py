"""End-effector-space safety for the SO-101 (HIL-SERL's EE mode, RELIABILITY.md A11): EE deltas -> safe joint commands.

A teleop device or a policy that speaks end-effector deltas goes through ``EEBounds.command`` every tick, before
the joint-space ``SafetyFilter`` (which still caps every joint):

    bounds = EEBounds(EEBoundsConfig(box_min=(0.10, -0.22, 0.0), box_max=(0.32, 0.22, 0.28)))
    cmd = bounds.command(present_deg, delta=[0.01, 0.0, -0.02])       # [6] degrees, LeRobot joint order
    safe = safety.command(cmd.joints_deg, present_deg)                 # then the joint caps and limits

Frames and units: positions in metres in the robot's base frame (our SO-101 model's world frame: base origin on the
table, +x forward, +z up); orientations as rotation matrices / (w, x, y, z) quaternions in that frame; joints in
LeRobot degrees (``sim.so101`` joint order, all six in degrees as in our frame convention). The tool frame is a site
of our MuJoCo model: ``ee`` (LeRobot's ``gripper_frame_link``, the frame its HIL-SERL EE mode moves; ``so101_reach``)
or ``grasp`` (between the pads; ``so101_lift`` / ``so101_pick``). Both have +x along the approach (out of the
fingers) and +z along the jaw opening.

Per tick, from the present joints q0 (FK: p0, R0):

1. target: ``p* = p0 + dp``, ``R* = R0 exp([r])`` (``delta_rot_frame="tool"``, LeRobot's ``EEReferenceAndDelta``)
   or ``exp([r]) R0`` (``"base"``); or an absolute ``target`` (position, optionally a quaternion). Without a
   rotation the present orientation is the target. NaN / inf / missing / malformed -> **rejected**: hold, counted;
2. bounds: ``p*`` clipped into the box; the orientation split into swing and twist about the reference's approach
   axis (``R_ref^T R = S(tilt) T_x(-yaw)``), the tilt clipped to ``max_tilt_deg``, the yaw into ``yaw_range_deg``;
3. rate limit (never raises, unlike LeRobot's default ``raise_on_jump=True``): ``p = p0 + min(1, s / |p* - p0|)
   (p* - p0)`` with ``s = max_step_m``; the rotation from R0 likewise shortened to ``max_rot_step_deg`` (geodesic);
4. IK (``sim.ik.solve_ik``, damped least squares on the five arm joints, warm-started at q0, ``ik_iters``
   iterations, position + orientation with orientation weighted ``ik_rot_weight`` metres per radian: the 5-DOF arm
   reaches any position but not every orientation, so position wins), within the joint limits;
5. verify FK of the solution: inside the box grown by ``pos_tol_m`` (when the present is outside, no farther out
   than the present: a start outside the box re-enters at up to ``max_step_m`` per tick), ``|p - p0| <= max_step_m
   + pos_tol_m``, tilt / yaw within bounds + ``rot_tol_deg`` (or no worse than the present's), rotation from R0
   within ``max_rot_step_deg + rot_tol_deg``. A failed check retries once at half the step (a lateral step near the
   base can need more wrist rotation than a tick allows); a second failure **holds**, counted.

A hold returns the last accepted command when its EE pose is within one step (position and rotation) of the present
pose, else the present joints. So every command this returns is within one step of the present EE pose, and, when
the present is inside the box (+ ``pos_tol_m``), inside the box + ``pos_tol_m``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mujoco
import numpy as np

from sim import ik, so101

# sim.ik.top_down_quat(0): approach -> world -z, jaw -> world +x
_TOP_DOWN_YAW0 = (math.sqrt(0.5), 0.0, math.sqrt(0.5), 0.0)
_EX = np.array([1.0, 0.0, 0.0])
# Outside the bounds (a start outside the box, a tool tilted too far) a command may be this much farther out than the
# present pose (IK accuracy); its target always points back in, so the arm re-enters.
REENTRY_SLACK_M = 0.001
REENTRY_SLACK_RAD = math.radians(0.5)


class EEBoundsConfigError(ValueError):
    """An EE-bounds configuration that cannot be enforced (an empty box, a non-positive step, ...)."""


@dataclass
class EEBoundsConfig:
    """Limits of end-effector-space control. Positions in metres in the robot's base frame, angles in degrees.

    The default box is the workspace of our SO-101 tasks (``so101_reach`` targets, ``so101_lift`` cubes), tool on or
    above the table (z >= 0); set it to your own table.
    """

    box_min: tuple[float, float, float] = (0.10, -0.22, 0.0)  # m, lower corner of the allowed tool positions
    box_max: tuple[float, float, float] = (0.32, 0.22, 0.28)  # m, upper corner
    max_step_m: float = 0.05  # m, largest tool translation per tick (LeRobot's max_ee_step_m), rate-limited
    pos_tol_m: float = 0.005  # m, how far FK of a command may lie outside the box / beyond the step (IK accuracy)
    site: str = "ee"  # tool frame: "ee" (LeRobot's gripper frame) or "grasp" (between the pads)
    reference_quat: tuple[float, float, float, float] = _TOP_DOWN_YAW0  # (w,x,y,z) tool at tilt 0, yaw 0
    max_tilt_deg: float = 90.0  # deg, approach axis from the reference's (default: at most horizontal, never up)
    yaw_range_deg: tuple[float, float] = (-180.0, 180.0)  # deg, twist about the reference approach axis (full: free)
    max_rot_step_deg: float = 20.0  # deg, largest tool rotation per tick, rate-limited
    rot_tol_deg: float = 2.0  # deg, slack of the orientation checks on FK of a command
    delta_rot_frame: str = "tool"  # a rotation delta's frame: "tool" (LeRobot's convention) or "base"
    joint_margin_deg: float = 2.0  # deg inside the model's joint ranges, when no joint limits are passed
    ik_iters: int = 25  # damped-least-squares iterations per solve (warm-started at the present joints)
    ik_rot_weight: float = 0.05  # m per rad: orientation error's weight against position error in the IK
    ik_rot_weight_fallback: float = 0.005  # m per rad, the retries': position first (a joint limit in the way)

    def __post_init__(self) -> None:
        bad = []
        lo, hi = np.asarray(self.box_min, float), np.asarray(self.box_max, float)
        if lo.shape != (3,) or hi.shape != (3,) or not (np.isfinite(lo).all() and np.isfinite(hi).all()):
            bad.append(f"box_min={self.box_min}, box_max={self.box_max} (3 finite numbers each)")
        elif not (lo < hi).all():
            bad.append(f"box_min={self.box_min} must be < box_max={self.box_max} on every axis")
        for name in ("max_step_m", "pos_tol_m", "max_rot_step_deg"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                bad.append(f"{name}={v} (a finite number > 0)")
        if not (math.isfinite(self.rot_tol_deg) and self.rot_tol_deg >= 0):
            bad.append(f"rot_tol_deg={self.rot_tol_deg} (>= 0)")
        if not 0 < self.max_tilt_deg < 180:
            bad.append(f"max_tilt_deg={self.max_tilt_deg} (in (0, 180))")
        ylo, yhi = self.yaw_range_deg
        if not -180.0 <= ylo < yhi <= 180.0:
            bad.append(f"yaw_range_deg={self.yaw_range_deg} (-180 <= low < high <= 180)")
        q = np.asarray(self.reference_quat, float)
        if q.shape != (4,) or not np.isfinite(q).all() or np.linalg.norm(q) < 1e-6:
            bad.append(f"reference_quat={self.reference_quat} (4 finite numbers, not all 0)")
        if self.delta_rot_frame not in ("tool", "base"):
            bad.append(f"delta_rot_frame={self.delta_rot_frame!r} ('tool' or 'base')")
        if not (math.isfinite(self.joint_margin_deg) and self.joint_margin_deg >= 0):
            bad.append(f"joint_margin_deg={self.joint_margin_deg} (>= 0)")
        if self.ik_iters < 1:
            bad.append(f"ik_iters={self.ik_iters} (>= 1)")
        for name in ("ik_rot_weight", "ik_rot_weight_fallback"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                bad.append(f"{name}={getattr(self, name)} (>= 0)")
        if bad:
            raise EEBoundsConfigError("ee_bounds: " + "; ".join(bad))


@dataclass(frozen=True)
class EECommand:
    """One tick's result. ``joints_deg`` float64 [6] (LeRobot order, degrees; the gripper passed through);
    ``ee_pos`` [3] m and ``ee_quat`` [4] (w, x, y, z): FK of ``joints_deg``, base frame."""

    joints_deg: np.ndarray
    ee_pos: np.ndarray
    ee_quat: np.ndarray
    held: bool = False  # the present / last command was held (IK or verification failed, or the input was rejected)
    rejected: bool = False  # the input was malformed (NaN, inf, missing, wrong shape)
    clamped: bool = False  # the box or the orientation bounds changed the target
    rate_limited: bool = False  # the step or the rotation step was shortened
    reason: str | None = None  # why it was held / rejected


# ------------------------------------------------------------------------------------------------- rotation math
def rotvec_to_mat(r: np.ndarray) -> np.ndarray:
    """[3, 3] rotation of a rotation vector [3] (axis * angle, rad), Rodrigues' formula."""
    theta = float(np.linalg.norm(r))
    if theta < 1e-12:
        return np.eye(3)
    k = r / theta
    kx = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + math.sin(theta) * kx + (1.0 - math.cos(theta)) * (kx @ kx)


def mat_to_rotvec(m: np.ndarray) -> np.ndarray:
    """Rotation vector [3] (rad, angle in [0, pi]) of a rotation matrix [3, 3]."""
    q = mat_to_quat(m)
    v = q[1:] if q[0] >= 0 else -q[1:]
    s = float(np.linalg.norm(v))
    if s < 1e-15:
        return np.zeros(3)
    return v / s * 2.0 * math.atan2(s, abs(q[0]))


def mat_to_quat(m: np.ndarray) -> np.ndarray:
    """(w, x, y, z) [4] of a rotation matrix [3, 3]."""
    q = np.zeros(4)
    mujoco.mju_mat2Quat(q, np.ascontiguousarray(m, dtype=float).reshape(-1))
    return q


def quat_to_mat(q: np.ndarray) -> np.ndarray:
    """Rotation matrix [3, 3] of a (w, x, y, z) quaternion [4] (normalised here)."""
    m = np.zeros(9)
    mujoco.mju_quat2Mat(m, np.asarray(q, dtype=float) / np.linalg.norm(q))
    return m.reshape(3, 3)


def rotation_angle(a: np.ndarray, b: np.ndarray) -> float:
    """Geodesic angle between two rotations [3, 3] (rad)."""
    return float(np.linalg.norm(mat_to_rotvec(b @ a.T)))


def swing_twist(ref: np.ndarray, rot: np.ndarray) -> tuple[float, float, np.ndarray]:
    """Tilt and yaw of a tool orientation relative to a reference: ``ref^T rot = S(axis, tilt) T_x(-yaw)``.

    ``tilt`` = the angle between the two approach axes (tool +x) in [0, pi]; ``S`` the shortest rotation between
    them (about ``axis`` [3], in the reference's frame); ``yaw`` in (-pi, pi] the remaining twist, signed about
    the reference approach axis reversed (for the default top-down reference: about world +z, so ``yaw`` of
    ``sim.ik.top_down_quat(y)`` is ``y``). Returns (tilt, yaw, axis), angles in rad.
    """
    d = ref.T @ rot
    u = d[:, 0]
    tilt = math.acos(min(1.0, max(-1.0, float(u[0]))))
    axis = np.array([0.0, -u[2], u[1]])  # e_x x u
    s = float(np.linalg.norm(axis))
    axis = axis / s if s > 1e-12 else np.array([0.0, 1.0, 0.0])  # tilt 0 (any axis) or pi (any normal one)
    twist = rotvec_to_mat(axis * tilt).T @ d  # a rotation about e_x
    return tilt, -math.atan2(twist[2, 1], twist[1, 1]), axis


def compose_swing_twist(ref: np.ndarray, tilt: float, yaw: float, axis: np.ndarray) -> np.ndarray:
    """Inverse of ``swing_twist``: ``ref S(axis, tilt) T_x(-yaw)`` [3, 3]."""
    return ref @ rotvec_to_mat(axis * tilt) @ rotvec_to_mat(_EX * -yaw)


def _wrap(a: float) -> float:
    return (a + math.pi) % (2.0 * math.pi) - math.pi


def box_distance(p: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    """Euclidean distance (m) from a point [3] to an axis-aligned box (0 inside)."""
    return float(np.linalg.norm(p - np.clip(p, lo, hi)))


# ------------------------------------------------------------------------------------------------- the bounds
@dataclass
class _Safe:
    joints_deg: np.ndarray
    pos: np.ndarray
    rot: np.ndarray


@dataclass
class EEBounds:
    """The EE-space safety layer of one SO-101 (see the module docstring).

    Args:
        cfg: the limits.
        joint_limits: the arm's joint command bounds, e.g. ``real.safety.limits_from_robot(...)`` (anything with
            ``names`` ("shoulder_pan.pos", ...) and ``low`` / ``high`` in degrees for the five body joints); IK stays
            inside them and inside the model's ranges. None: the model's ranges minus ``cfg.joint_margin_deg``.
        model: a MuJoCo model of the SO-101 whose world frame is the robot's base frame; None: ``sim/assets/so101.xml``.

    Attributes:
        ticks, rejects, holds, clamps, rate_limits: counts since construction (``holds`` counts failed IK /
            verification; a rejected input is counted in ``rejects`` only).
    """

    cfg: EEBoundsConfig
    joint_limits: Any = None
    model: mujoco.MjModel | None = None
    ticks: int = field(default=0, init=False)
    rejects: int = field(default=0, init=False)
    holds: int = field(default=0, init=False)
    clamps: int = field(default=0, init=False)
    rate_limits: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        cfg = self.cfg
        # a private copy: its joint ranges are narrowed to the command limits, which solve_ik respects every iteration
        if self.model is None:
            m = mujoco.MjModel.from_xml_path(str(so101.ASSETS / "so101.xml"))
        else:
            m = copy.deepcopy(self.model)
        self._model = m
        self._data = mujoco.MjData(m)
        self._ik_scratch = mujoco.MjData(m)  # the IK solver's, reused every tick
        self._site = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, cfg.site)
        if self._site < 0:
            raise EEBoundsConfigError(f"ee_bounds.site={cfg.site!r}: the model has no such site")
        self._jids = [mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, n) for n in so101.ARM_JOINTS]
        if min(self._jids) < 0:
            raise EEBoundsConfigError(f"the model lacks the SO-101 arm joints {so101.ARM_JOINTS}")
        self._qadr = m.jnt_qposadr[self._jids]
        lo, hi = m.jnt_range[self._jids, 0].copy(), m.jnt_range[self._jids, 1].copy()
        aids = [mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_ACTUATOR, n) for n in so101.ARM_JOINTS]
        if min(aids) >= 0:  # targets stay inside the actuators' control ranges too (SO101Arm.low/high)
            lo, hi = np.maximum(lo, m.actuator_ctrlrange[aids, 0]), np.minimum(hi, m.actuator_ctrlrange[aids, 1])
        if self.joint_limits is None:
            margin = math.radians(cfg.joint_margin_deg)
            lo, hi = lo + margin, hi - margin
        else:
            names = list(self.joint_limits.names)
            upd = getattr(self.joint_limits, "units_per_deg", None)
            for i, j in enumerate(so101.ARM_JOINTS):
                k = names.index(f"{j}.pos") if f"{j}.pos" in names else -1
                if k < 0 or (upd is not None and abs(float(upd[k]) - 1.0) > 1e-9):
                    raise EEBoundsConfigError(f"joint_limits: {j}.pos missing or not in degrees ({names})")
                lo[i] = max(lo[i], math.radians(float(self.joint_limits.low[k])))
                hi[i] = min(hi[i], math.radians(float(self.joint_limits.high[k])))
        if not (lo < hi).all():
            raise EEBoundsConfigError(f"joint limits leave no range: low {np.degrees(lo)}, high {np.degrees(hi)} deg")
        m.jnt_range[self._jids, 0], m.jnt_range[self._jids, 1] = lo, hi
        self.joint_low_deg, self.joint_high_deg = np.degrees(lo), np.degrees(hi)  # [5] the IK's joint bounds
        self._lo, self._hi = np.asarray(cfg.box_min, float), np.asarray(cfg.box_max, float)
        self._ref = quat_to_mat(np.asarray(cfg.reference_quat, float))
        self._max_tilt = math.radians(cfg.max_tilt_deg)
        ylo, yhi = (math.radians(v) for v in cfg.yaw_range_deg)
        self._yaw = None if yhi - ylo >= 2 * math.pi - 1e-9 else (ylo, yhi)
        self._max_rot = math.radians(cfg.max_rot_step_deg)
        self._rot_tol = math.radians(cfg.rot_tol_deg)
        self._last: _Safe | None = None
        mujoco.mj_kinematics(m, self._data)
        self._pan_xy = self._data.xanchor[self._jids[0], :2].copy()  # m, where the shoulder_pan axis meets the table
        self._vertical_ref = abs(float(self._ref[2, 0])) > 0.999  # the reference approach is straight down / up

    # ---------------------------------------------------------------------------------------- public
    def reset(self) -> None:
        """Forget the last accepted command (call on a hand-over: a hold then holds the present joints)."""
        self._last = None

    def fk(self, joints_deg: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tool position [3] (m) and rotation [3, 3] in the base frame of joints [5] or [6] (degrees)."""
        self._data.qpos[self._qadr] = np.radians(np.asarray(joints_deg, float)[:5])
        mujoco.mj_kinematics(self._model, self._data)
        return self._data.site_xpos[self._site].copy(), self._data.site_xmat[self._site].reshape(3, 3).copy()

    def tilt_yaw(self, rot: np.ndarray) -> tuple[float, float]:
        """(tilt, yaw) in degrees of a tool rotation [3, 3] relative to ``cfg.reference_quat`` (``swing_twist``)."""
        tilt, yaw, _ = swing_twist(self._ref, rot)
        return math.degrees(tilt), math.degrees(yaw)

    def yaw_excess(self, yaw: float) -> float:
        """How far (rad) a yaw (rad) lies outside ``cfg.yaw_range_deg`` (0 inside), around the circle."""
        if self._yaw is None:
            return 0.0
        lo, hi = self._yaw
        if lo <= yaw <= hi:
            return 0.0
        return min(abs(_wrap(yaw - lo)), abs(_wrap(yaw - hi)))

    def bound_orientation(self, rot: np.ndarray) -> np.ndarray:
        """[3, 3] the nearest orientation (in tilt and yaw separately) within the tilt and yaw bounds."""
        tilt, yaw, axis = swing_twist(self._ref, rot)
        if tilt <= self._max_tilt and self.yaw_excess(yaw) == 0.0:
            return rot
        return compose_swing_twist(self._ref, min(tilt, self._max_tilt), self._clamp_yaw(yaw), axis)

    def command(self, present_deg: Any, delta: Any = None, *, target: Any = None,
                gripper_deg: float | None = None) -> EECommand:
        """This tick's joint command from the present joints and an EE delta or target.

        Args:
            present_deg: float [6] or [1, 6] (numpy, torch or a sequence), the measured joints in LeRobot degrees.
            delta: [3] (dx, dy, dz m, base frame) or [6] (+ rotation vector rx, ry, rz rad, in the
                ``cfg.delta_rot_frame``), relative to the present tool pose. Exactly one of delta / target.
            target: [3] absolute tool position (m, base frame) or [7] (+ quaternion w, x, y, z).
            gripper_deg: the gripper's target in degrees; None: the present gripper (the joint filter caps it).

        Returns:
            An ``EECommand``; never raises for a bad ``delta`` / ``target`` / ``gripper_deg`` (rejected: hold).
            Raises ValueError only when ``present_deg`` is unusable and no earlier command exists to hold.
        """
        self.ticks += 1
        q0 = _vector(present_deg, (6,))
        if q0 is None:
            if self._last is None:
                raise ValueError(f"ee_bounds: present joints unusable ({_describe(present_deg)}) and nothing to hold")
            return self._reject(None, None, None, "present joints are not 6 finite numbers")
        p0, r0 = self.fk(q0)
        if (delta is None) == (target is None):
            return self._reject(q0, p0, r0, "need exactly one of delta / target")
        grip = q0[5]
        if gripper_deg is not None:
            g = _vector(gripper_deg, (1,))
            if g is None:
                return self._reject(q0, p0, r0, f"gripper_deg {_describe(gripper_deg)} is not one finite number")
            grip = float(g[0])
        if delta is not None:
            d = _vector(delta, (3,), (6,))
            if d is None:
                return self._reject(q0, p0, r0, f"delta {_describe(delta)} is not 3 or 6 finite numbers")
            p_goal, r_goal = p0 + d[:3], r0
            if d.shape == (6,):
                dr = rotvec_to_mat(d[3:])
                r_goal = r0 @ dr if self.cfg.delta_rot_frame == "tool" else dr @ r0
        else:
            t = _vector(target, (3,), (7,))
            if t is None or (t.shape == (7,) and np.linalg.norm(t[3:]) < 1e-9):
                return self._reject(q0, p0, r0, f"target {_describe(target)} is not 3 or 7 finite numbers "
                                    "(a non-zero quaternion)")
            p_goal, r_goal = t[:3], (quat_to_mat(t[3:]) if t.shape == (7,) else r0)

        # bounds, then the rate limit from the present pose
        p_box = np.clip(p_goal, self._lo, self._hi)
        clamped = not np.array_equal(p_box, p_goal)
        dp = p_box - p0
        n = float(np.linalg.norm(dp))
        step = dp * (self.cfg.max_step_m / n) if n > self.cfg.max_step_m else dp
        tilt0, yaw0, axis0 = swing_twist(self._ref, r0)
        tilt_g, yaw_g, axis_g = swing_twist(self._ref, r_goal)
        if tilt_g > self._max_tilt or self.yaw_excess(yaw_g) > 0.0:
            clamped = True
            tilt_g, yaw_g = min(tilt_g, self._max_tilt), self._clamp_yaw(yaw_g)
        # signed tilt: + leaning along the goal's swing direction (the arm's plane for a vertical reference)
        sign0 = 1.0 if float(axis0 @ axis_g) >= 0.0 else -1.0
        d_tilt, d_yaw = tilt_g - sign0 * tilt0, _wrap(yaw_g - yaw0)
        ang = math.hypot(d_tilt, d_yaw)
        rot_scale = min(1.0, self._max_rot / ang) if ang > 0 else 1.0
        limited = n > self.cfg.max_step_m or rot_scale < 1.0
        self.clamps += int(clamped)
        self.rate_limits += int(limited)

        # what FK of the answer must satisfy (no worse than the present where the present is outside)
        reason = ""
        # the full step; again with the position first (the orientation may be out of the joints' reach); half of it
        # (a lateral step near the base can turn the tool more than a tick allows); the rotation alone (a tool outside
        # the orientation bounds turns back first)
        w_hi, w_lo = self.cfg.ik_rot_weight, self.cfg.ik_rot_weight_fallback
        for frac, rfrac, w in ((1.0, 1.0, w_hi), (1.0, 1.0, w_lo), (0.5, 0.5, w_lo), (0.0, 1.0, w_hi)):
            p = p0 + frac * step
            signed = sign0 * tilt0 + rfrac * rot_scale * d_tilt
            yaw = yaw0 + rfrac * rot_scale * d_yaw
            axis = self._swing_axis(p, axis_g, r0) * math.copysign(1.0, signed)
            r = compose_swing_twist(self._ref, abs(signed), yaw, axis)
            q = self._solve(q0, p, r, w)
            pf, rf = self.fk(q)
            reason = self._check(p0, r0, pf, rf)
            if not reason:
                joints = np.append(q, grip)
                self._last = _Safe(joints, pf, rf)
                return EECommand(joints, pf, mat_to_quat(rf), clamped=clamped, rate_limited=limited or frac < 1.0)
        self.holds += 1
        return self._hold(q0, p0, r0, f"no IK solution passed the checks ({reason})", rejected=False)

    # ---------------------------------------------------------------------------------------- internals
    def _clamp_yaw(self, yaw: float) -> float:
        if self._yaw is None or self.yaw_excess(yaw) == 0.0:
            return yaw
        lo, hi = self._yaw
        return lo if abs(_wrap(yaw - lo)) <= abs(_wrap(yaw - hi)) else hi

    def _swing_axis(self, p: np.ndarray, axis_goal: np.ndarray, r0: np.ndarray) -> np.ndarray:
        """[3] unit swing axis (reference frame) of a reachable orientation at tool position ``p`` [3].

        The 5-DOF SO-101 keeps its approach axis in the vertical plane through the shoulder_pan axis and the tool
        (to ~2 deg beyond 12 cm from the axis), so with a vertical reference approach the swing axis is horizontal
        and normal to that plane, signed like ``axis_goal``'s. Any other reference: ``axis_goal`` (the IK compromises).
        """
        if not self._vertical_ref:
            return axis_goal
        radial = p[:2] - self._pan_xy
        if np.linalg.norm(radial) < 0.01:  # over the pan axis: the present approach's heading
            radial = r0[:2, 0]
            if np.linalg.norm(radial) < 1e-6:
                return axis_goal
        u = np.array([radial[0], radial[1], 0.0]) / np.linalg.norm(radial)
        axis_w = np.cross(self._ref[:, 0], u)  # swings the reference approach toward u
        axis = self._ref.T @ axis_w
        return axis if float(axis @ axis_goal) >= 0.0 or float(np.linalg.norm(axis_goal)) < 0.5 else -axis

    def _solve(self, q0_deg: np.ndarray, pos: np.ndarray, rot: np.ndarray, rot_weight: float) -> np.ndarray:
        """[5] arm joints (degrees) putting the tool at ``pos`` [3] with ``rot`` [3, 3] (orientation weighted
        ``rot_weight`` m/rad), warm-started at the present joints."""
        self._data.qpos[self._qadr] = np.radians(q0_deg[:5])
        q = ik.solve_ik(self._model, self._data, self.cfg.site, pos, np.radians(q0_deg[:5]), self._jids,
                        target_quat_or_axis=mat_to_quat(rot), iters=self.cfg.ik_iters,
                        rot_weight=rot_weight, tol=1e-4, scratch=self._ik_scratch)
        return np.degrees(q)

    def _check(self, p0: np.ndarray, r0: np.ndarray, pf: np.ndarray, rf: np.ndarray) -> str:
        """'' when a tool pose (``pf`` [3], ``rf`` [3, 3]) may be commanded from the present one (``p0``, ``r0``),
        else which check failed: inside the bounds + tolerance, or no worse than the present (+ the re-entry slack)
        where it is outside them; within one step and one rotation step + tolerance."""
        cfg = self.cfg
        tilt0, yaw0, _ = swing_twist(self._ref, r0)
        allow_box = max(cfg.pos_tol_m, box_distance(p0, self._lo, self._hi) + REENTRY_SLACK_M)
        allow_tilt = max(self._max_tilt + self._rot_tol, tilt0 + REENTRY_SLACK_RAD)
        allow_yaw = max(self._rot_tol, self.yaw_excess(yaw0) + REENTRY_SLACK_RAD)
        if not (np.isfinite(pf).all() and np.isfinite(rf).all()):
            return "non-finite FK"
        if box_distance(pf, self._lo, self._hi) > allow_box + 1e-9:
            return f"{box_distance(pf, self._lo, self._hi) * 1e3:.1f} mm outside the box"
        if np.linalg.norm(pf - p0) > cfg.max_step_m + cfg.pos_tol_m:
            return f"step {np.linalg.norm(pf - p0) * 1e3:.1f} mm"
        tilt, yaw, _ = swing_twist(self._ref, rf)
        if tilt > allow_tilt + 1e-9:
            return f"tilt {math.degrees(tilt):.1f} deg"
        # the yaw is checked within the tilt bound only: near tilt pi the swing-twist split is singular (re-entry
        # from a tool pointing backwards fixes the tilt first)
        if tilt <= self._max_tilt + self._rot_tol and self.yaw_excess(yaw) > allow_yaw + 1e-9:
            return f"yaw {math.degrees(yaw):.1f} deg"
        if rotation_angle(r0, rf) > self._max_rot + self._rot_tol:
            return f"rotation step {math.degrees(rotation_angle(r0, rf)):.1f} deg"
        return ""

    def _hold(self, q0: np.ndarray | None, p0: np.ndarray | None, r0: np.ndarray | None, reason: str,
              rejected: bool) -> EECommand:
        """The last accepted command when it passes ``_check`` from the present pose (or the present is unknown),
        else the present joints."""
        last = self._last
        if last is not None and (q0 is None or not self._check(p0, r0, last.pos, last.rot)):
            return EECommand(last.joints_deg.copy(), last.pos.copy(), mat_to_quat(last.rot), held=True,
                             rejected=rejected, reason=reason)
        return EECommand(q0.copy(), p0, mat_to_quat(r0), held=True, rejected=rejected, reason=reason)

    def _reject(self, q0: np.ndarray | None, p0: np.ndarray | None, r0: np.ndarray | None,
                reason: str) -> EECommand:
        self.rejects += 1
        return self._hold(q0, p0, r0, reason, rejected=True)


def _vector(x: Any, *shapes: tuple[int, ...]) -> np.ndarray | None:
    """float64 array of one of ``shapes`` (a leading batch of 1 allowed) with finite entries, else None."""
    if x is None or isinstance(x, str | bytes | bool):
        return None
    try:
        if hasattr(x, "detach"):  # a torch tensor
            x = x.detach().cpu().numpy()
        a = np.asarray(x)
        if a.dtype.kind not in "fiu":
            return None
        a = a.astype(np.float64)
    except (TypeError, ValueError):
        return None
    for s in shapes:
        if a.shape in (s, (1, *s)) or (s == (1,) and a.shape == ()):
            a = a.reshape(s)
            return a if np.isfinite(a).all() else None
    return None


def _describe(x: Any) -> str:
    try:
        return f"{type(x).__name__} {list(np.shape(x))}"
    except Exception:  # noqa: BLE001 -- only for a message
        return type(x).__name__
