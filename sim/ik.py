"""Damped-least-squares inverse kinematics of a site on a MuJoCo model (used by the scripted experts).

One iteration, with J the site Jacobian restricted to the chosen joints (``mj_jacSite``; rows: 3 translational,
then 3 rotational when an orientation is asked for) and e the task-space error:

    e_p = p* - p(q)                                         position error [m]
    e_r = log(R* R(q)^T)^vee          (full orientation)    rotation vector [rad], world frame
    e_r = atan2(|a x a*|, a . a*) (a x a*)/|a x a*|         (axis only: a = R(q) a_site, the site's approach axis)
    J_r <- (I - a a^T) J_r                                   (axis only: rolling about a is left free)
    dq  = J^T (J J^T + lambda^2 I)^-1 [e_p; w e_r]           damped least squares, rotational rows weighted by w
    q   <- clip(q + dq, q_min, q_max)                        joint ranges respected every iteration

All kinematics run on a scratch ``MjData`` (``mj_kinematics`` + ``mj_comPos``); the caller's data is only read.

A top-down grasp with the SO-101 uses the "grasp" site (approach axis = site +x) and ``top_down_quat(yaw)``: the
approach axis points to world -z and the jaw opening axis (site +z) points along ``(cos yaw, sin yaw, 0)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mujoco
import numpy as np

TOP_DOWN = np.array([0.0, 0.0, -1.0])  # world direction of the approach axis for a top-down grasp


def top_down_quat(yaw: float) -> np.ndarray:
    """World quaternion (w, x, y, z) of a site whose +x points down and whose +z points along ``yaw``.

    Args:
        yaw: heading of the site's +z axis (the SO-101 jaw opening direction, fixed -> moving jaw) about world z,
            in rad.

    Returns:
        [4] unit quaternion.
    """
    c, s = np.cos(yaw), np.sin(yaw)
    # columns: x = down, y = z cross x, z = (c, s, 0)
    mat = np.array([[0.0, -s, c], [0.0, c, s], [-1.0, 0.0, 0.0]])
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, mat.reshape(-1))
    return quat


def quat_yaw(q: Sequence[float]) -> float:
    """Heading about world z [rad] of a unit (w, x, y, z) quaternion (a sequence, array or tensor of 4): the
    heading of its rotated x axis."""
    w, x, y, z = (float(v) for v in q)
    return math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def nearest_grasp_yaw(object_yaw: float, preferred_yaw: float, symmetry: float = np.pi / 2) -> float:
    """Of the yaws ``object_yaw + k * symmetry`` (a cube: every pi/2), the one closest to ``preferred_yaw``.

    Args:
        object_yaw: the object's heading about world z [rad].
        preferred_yaw: the jaw heading that needs the least wrist roll, e.g. the object's azimuth seen from the
            shoulder_pan axis [rad].
        symmetry: the object's rotational symmetry about z [rad].

    Returns:
        The grasp yaw [rad], within ``symmetry / 2`` of ``preferred_yaw``.
    """
    k = np.round((preferred_yaw - object_yaw) / symmetry)
    return float(object_yaw + k * symmetry)


def solve_ik(
    model: mujoco.MjModel,
    data: mujoco.MjData,
    site_name: str,
    target_pos: Sequence[float] | np.ndarray,
    q_init: Sequence[float] | np.ndarray,
    joint_ids: Sequence[int],
    *,
    target_quat_or_axis: Sequence[float] | np.ndarray | None = None,
    approach_axis: Sequence[float] = (1.0, 0.0, 0.0),
    iters: int = 200,
    damping: float = 1e-2,
    rot_weight: float = 0.2,
    tol: float = 1e-5,
    scratch: mujoco.MjData | None = None,
) -> np.ndarray:
    """Joint values that put a site at a position (and optionally orientation), by damped least squares.

    Args:
        model: the MuJoCo model.
        data: the caller's data; only read (every other joint keeps its ``data.qpos`` value during the solve).
        site_name: the site to move, e.g. "grasp" or "ee".
        target_pos: [3] world position of the site [m].
        q_init: [len(joint_ids)] starting joint values [rad]; the solution stays on its branch.
        joint_ids: indices of the (hinge or slide) joints the solver may move, e.g. the five SO-101 arm joints.
        target_quat_or_axis: None for position only; [4] world quaternion (w, x, y, z) for the full site
            orientation; [3] world direction that the site's ``approach_axis`` must point along (roll left free).
        approach_axis: [3] the site-frame axis aligned with a [3] ``target_quat_or_axis``.
        iters: maximum iterations.
        damping: lambda of the damped least squares; larger is slower but steadier near singularities.
        rot_weight: w, metres of position error worth one radian of orientation error.
        tol: stop when the step's largest joint change is below this [rad].
        scratch: an ``MjData`` of ``model`` the solver may overwrite (a caller solving every control step keeps one:
            allocating it is ~0.4 ms, most of a warm-started solve); None: a new one.

    Returns:
        [len(joint_ids)] joint values within the joints' ranges (the best found if the target is unreachable).
    """
    joint_ids = np.asarray(joint_ids, dtype=int)
    qadr = model.jnt_qposadr[joint_ids]
    dadr = model.jnt_dofadr[joint_ids]
    limited = model.jnt_limited[joint_ids].astype(bool)
    lo = np.where(limited, model.jnt_range[joint_ids, 0], -np.inf)
    hi = np.where(limited, model.jnt_range[joint_ids, 1], np.inf)
    site_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, site_name)
    if site_id < 0:
        raise KeyError(f"no site named {site_name!r}")

    target_pos = np.asarray(target_pos, dtype=float)
    mode, target_quat, target_axis = "pos", None, None
    if target_quat_or_axis is not None:
        t = np.asarray(target_quat_or_axis, dtype=float)
        if t.shape == (4,):
            mode, target_quat = "quat", t / np.linalg.norm(t)
        elif t.shape == (3,):
            mode, target_axis = "axis", t / np.linalg.norm(t)
        else:
            raise ValueError(f"target_quat_or_axis must have 3 or 4 entries, got shape {t.shape}")
    axis_local = np.asarray(approach_axis, dtype=float)

    if scratch is None:
        scratch = mujoco.MjData(model)
    scratch.qpos[:] = data.qpos  # kinematics reads only qpos and the mocap poses: nothing else carries over
    scratch.mocap_pos[:] = data.mocap_pos
    scratch.mocap_quat[:] = data.mocap_quat
    q = np.clip(np.asarray(q_init, dtype=float), lo, hi)
    jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    site_quat, err_quat, neg_quat, rot_err = np.zeros(4), np.zeros(4), np.zeros(4), np.zeros(3)

    def error_and_jacobian(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        scratch.qpos[qadr] = q
        mujoco.mj_kinematics(model, scratch)
        mujoco.mj_comPos(model, scratch)
        mujoco.mj_jacSite(model, scratch, jacp, jacr, site_id)
        err = [target_pos - scratch.site_xpos[site_id]]
        jac = [jacp[:, dadr]]
        xmat = scratch.site_xmat[site_id].reshape(3, 3)
        if mode == "quat":
            mujoco.mju_mat2Quat(site_quat, xmat.reshape(-1))
            mujoco.mju_negQuat(neg_quat, site_quat)
            mujoco.mju_mulQuat(err_quat, target_quat, neg_quat)  # R* R^T, in the world frame
            mujoco.mju_quat2Vel(rot_err, err_quat, 1.0)
            err.append(rot_weight * rot_err)
            jac.append(rot_weight * jacr[:, dadr])
        elif mode == "axis":
            a = xmat @ axis_local
            cross = np.cross(a, target_axis)
            sin, cos = np.linalg.norm(cross), float(a @ target_axis)
            if sin > 1e-12:
                rot = cross / sin * np.arctan2(sin, cos)
            elif cos < 0.0:  # pointing exactly away: turn about any axis normal to a
                ortho = np.cross(a, [1.0, 0.0, 0.0] if abs(a[0]) < 0.9 else [0.0, 1.0, 0.0])
                rot = ortho / np.linalg.norm(ortho) * np.pi
            else:
                rot = np.zeros(3)
            proj = np.eye(3) - np.outer(a, a)
            err.append(rot_weight * rot)
            jac.append(rot_weight * proj @ jacr[:, dadr])
        return np.concatenate(err), np.concatenate(jac, axis=0)

    best_q, best_err = q.copy(), np.inf
    for _ in range(iters):
        err, jac = error_and_jacobian(q)
        err_norm = float(np.linalg.norm(err))
        if err_norm < best_err:
            best_q, best_err = q.copy(), err_norm
        lhs = jac @ jac.T + damping**2 * np.eye(jac.shape[0])
        dq = jac.T @ np.linalg.solve(lhs, err)
        dq *= min(1.0, 0.5 / max(np.abs(dq).max(), 1e-12))  # at most 0.5 rad per step
        q_new = np.clip(q + dq, lo, hi)
        if np.abs(q_new - q).max() < tol:
            q = q_new
            break
        q = q_new
    err, _ = error_and_jacobian(q)
    if float(np.linalg.norm(err)) < best_err:
        best_q = q.copy()
    return best_q
