"""humanoid_walk's per-step math as compiled loops over the envs, for the embedded CPU backend.

``sim/tasks/humanoid_walk.py`` writes its reward terms and observations as small batched torch functions: the
reference, and what runs on MJX and Warp. On the CPU at N = 64 those ~200 tiny ops cost ~0.34 ms per env step
against ~2.7 ms of physics (``benchmarks/sim_throughput.py``: outside-physics work held humanoid_walk at 0.61x of
raw ``mujoco.rollout``), nearly all of it per-op overhead, not arithmetic. Here the same math runs as numba loops
over the backend's numpy state (zero-copy), ~10 us a call; the random draws stay torch's, made in the reference's
order, so a seed gives the same noise either way. ``tests/sim/test_humanoid.py`` holds both to the same terms, air
times, falls, reset poses, commands, joint targets and observations, step by step.

Units and conventions are humanoid_walk's: velocities in the base frame, quaternions (w, x, y, z), gravity the unit
world down (0, 0, -1) in the base frame.
"""

from __future__ import annotations

import math

import numba
import numpy as np

# Column layout of ``params`` (float64) and ``adr`` (int64), shared with humanoid_walk.py.
P_LIN_STD2, P_ANG_STD2, P_AIR_THRESHOLD, P_DT, P_FALL_HEIGHT, P_TILT_Z = range(6)
A_POS, A_QUAT, A_LIN_VEL, A_ANG_VEL = range(4)
# Rows of ``joints`` (float32 [5, A]): the home pose, the soft limits of joint_pos_limits, the joint ranges.
J_DEFAULT, J_SOFT_LOW, J_SOFT_HIGH, J_LOW, J_HIGH = range(5)


@numba.njit(cache=True)
def _base(sens: np.ndarray, i: int, adr: np.ndarray) -> tuple[float, float, float, float, float, float, float, float,
                                                                    float, float]:
    """Env i's base linear velocity, angular velocity, projected gravity and height, as float32 like the reference
    (which casts the sensor readings first)."""
    f = np.float32
    lv, av, q = adr[A_LIN_VEL], adr[A_ANG_VEL], adr[A_QUAT]
    w, x, y, z = f(sens[i, q]), f(sens[i, q + 1]), f(sens[i, q + 2]), f(sens[i, q + 3])
    g0 = f(2.0) * (w * y - x * z)
    g1 = f(-2.0) * (y * z + w * x)
    g2 = f(2.0) * (x * x + y * y) - f(1.0)
    return (f(sens[i, lv]), f(sens[i, lv + 1]), f(sens[i, lv + 2]), f(sens[i, av]), f(sens[i, av + 1]),
            f(sens[i, av + 2]), g0, g1, g2, f(sens[i, adr[A_POS] + 2]))


@numba.njit(cache=True)
def _touch(sens: np.ndarray, i: int, foot: int, contact_cols: np.ndarray, contact_foot: np.ndarray) -> np.float32:
    """1.0 where any contact sensor of env i's ``foot`` found the floor, else 0.0."""
    found = np.float32(0.0)
    for s in range(contact_cols.shape[0]):
        if contact_foot[s] == foot:
            found += np.float32(sens[i, contact_cols[s]])
    return np.float32(1.0) if found > 0 else np.float32(0.0)


@numba.njit(cache=True)
def rewards(sens: np.ndarray, qpos: np.ndarray, qpos_idx: np.ndarray, joints: np.ndarray, last_action: np.ndarray,
            prev_action: np.ndarray, command: np.ndarray, air_time: np.ndarray, contact_cols: np.ndarray,
            contact_foot: np.ndarray, foot_vel_cols: np.ndarray, adr: np.ndarray, params: np.ndarray,
            terms: np.ndarray, fallen: np.ndarray) -> None:
    """Unweighted terms [N, 12] in ``HumanoidWalkTask.reward_term_names`` order and the fall flags [N]; advances
    ``air_time`` [N, feet] by one control step (reset where a foot touches), as ``reward_terms`` does."""
    f = np.float32
    n, a, feet = sens.shape[0], qpos_idx.shape[0], air_time.shape[1]
    thr, dt = f(params[P_AIR_THRESHOLD]), f(params[P_DT])
    for i in range(n):
        lv0, lv1, lv2, av0, av1, av2, g0, g1, g2, _ = _base(sens, i, adr)
        # the height compared unrounded, as the reference compares it
        fell = sens[i, adr[A_POS] + 2] < params[P_FALL_HEIGHT] or g2 > params[P_TILT_Z]
        fallen[i] = fell
        c0, c1, c2 = command[i, 0], command[i, 1], command[i, 2]
        terms[i, 0] = math.exp(-((c0 - lv0) ** 2 + (c1 - lv1) ** 2) / params[P_LIN_STD2])
        terms[i, 1] = math.exp(-((c2 - av2) ** 2) / params[P_ANG_STD2])
        terms[i, 2] = -lv2 * lv2
        terms[i, 3] = -(av0 * av0 + av1 * av1)
        terms[i, 4] = -(g0 * g0 + g1 * g1)
        posture, rate, beyond = f(0.0), f(0.0), f(0.0)
        for j in range(a):
            q = f(qpos[i, qpos_idx[j]])
            r = q - joints[J_DEFAULT, j]
            posture += r * r
            d = last_action[i, j] - prev_action[i, j]
            rate += d * d
            beyond += max(q - joints[J_SOFT_HIGH, j], f(0.0)) + max(joints[J_SOFT_LOW, j] - q, f(0.0))
        terms[i, 5], terms[i, 6], terms[i, 7] = -posture, -rate, -beyond
        moving = math.sqrt(c0 * c0 + c1 * c1 + c2 * c2) > 0.1
        air, slip = f(0.0), f(0.0)
        for k in range(feet):
            touch = _touch(sens, i, k, contact_cols, contact_foot)
            if air_time[i, k] > 0:  # first contact after a swing
                air += (air_time[i, k] - thr) * touch
            air_time[i, k] = (air_time[i, k] + dt) * (f(1.0) - touch)
            vx, vy = f(sens[i, foot_vel_cols[2 * k]]), f(sens[i, foot_vel_cols[2 * k + 1]])
            slip += touch * (vx * vx + vy * vy)
        terms[i, 8] = air if moving else f(0.0)
        terms[i, 9] = -slip
        terms[i, 10] = f(0.0) if fell else f(1.0)
        terms[i, 11] = f(-1.0) if fell else f(0.0)


@numba.njit(cache=True)
def observations(sens: np.ndarray, qpos: np.ndarray, qvel: np.ndarray, qpos_idx: np.ndarray, qvel_idx: np.ndarray,
                 joints: np.ndarray, last_action: np.ndarray, command: np.ndarray, contact_cols: np.ndarray,
                 contact_foot: np.ndarray, adr: np.ndarray, noise_u: np.ndarray, noise_scale: np.ndarray,
                 policy: np.ndarray, critic: np.ndarray) -> None:
    """The policy group [N, 12 + 3A] (plus uniform noise (2u - 1)·scale where ``noise_u`` has rows) and the clean
    critic group [N, 13 + 3A + feet], in ``HumanoidWalkTask.obs_parts`` order."""
    f = np.float32
    n, a, feet = sens.shape[0], qpos_idx.shape[0], critic.shape[1] - policy.shape[1] - 1
    noisy = noise_u.shape[0] > 0
    for i in range(n):
        lv0, lv1, lv2, av0, av1, av2, g0, g1, g2, h = _base(sens, i, adr)
        critic[i, 0], critic[i, 1], critic[i, 2] = lv0, lv1, lv2
        critic[i, 3], critic[i, 4], critic[i, 5] = av0, av1, av2
        critic[i, 6], critic[i, 7], critic[i, 8] = g0, g1, g2
        for j in range(a):
            critic[i, 9 + j] = f(qpos[i, qpos_idx[j]]) - joints[J_DEFAULT, j]
            critic[i, 9 + a + j] = f(qvel[i, qvel_idx[j]])
            critic[i, 9 + 2 * a + j] = last_action[i, j]
        for j in range(3):
            critic[i, 9 + 3 * a + j] = command[i, j]
        width = policy.shape[1]
        for j in range(width):
            x = critic[i, j]
            if noisy:
                x = x + (noise_u[i, j] * f(2.0) - f(1.0)) * noise_scale[j]
            policy[i, j] = x
        critic[i, width] = h
        for k in range(feet):
            critic[i, width + 1 + k] = _touch(sens, i, k, contact_cols, contact_foot)


@numba.njit(cache=True)
def commands_and_targets(action: np.ndarray, cmd_draw: np.ndarray, cmd_box: np.ndarray, resample_steps: int,
                         standing_fraction: float, joints: np.ndarray, action_scale: np.ndarray,
                         ctrl_box: np.ndarray, last_action: np.ndarray, prev_action: np.ndarray, command: np.ndarray,
                         command_timer: np.ndarray, target: np.ndarray) -> None:
    """One control step of ``action_to_ctrl`` before the pushes: shift the action history, count the command timers
    down and take the drawn command ``cmd_draw`` [N, 4] where one runs out, and the joint targets [N, A] (the
    default pose plus the scaled action, clipped to the control range)."""
    n, a = action.shape
    for i in range(n):
        for j in range(a):
            prev_action[i, j] = last_action[i, j]
            last_action[i, j] = action[i, j]
            t = joints[J_DEFAULT, j] + action_scale[j] * action[i, j]
            target[i, j] = max(min(t, ctrl_box[1, j]), ctrl_box[0, j])
        command_timer[i] -= 1
        if command_timer[i] <= 0:
            _command(cmd_draw, i, i, cmd_box, standing_fraction, command)
            command_timer[i] = resample_steps


@numba.njit(cache=True)
def _command(draw: np.ndarray, row: int, env: int, cmd_box: np.ndarray, standing_fraction: float,
             command: np.ndarray) -> None:
    """Env ``env``'s command from the uniform draw ``draw[row]`` (4 numbers): in the box [low, low + span], or
    standing still where the fourth falls below ``standing_fraction``."""
    still = draw[row, 3] < standing_fraction
    for k in range(3):
        command[env, k] = 0.0 if still else cmd_box[0, k] + draw[row, k] * cmd_box[1, k]


@numba.njit(cache=True)
def reset(env_ids: np.ndarray, pose_draw: np.ndarray, cmd_draw: np.ndarray, timer_draw: np.ndarray,
          push_draw: np.ndarray, home_qpos: np.ndarray, qpos_idx: np.ndarray, joints: np.ndarray, base_qpos_adr: int,
          joint_noise: float, yaw_range: float, cmd_box: np.ndarray, standing_fraction: float, qpos: np.ndarray,
          qvel: np.ndarray, ctrl: np.ndarray, command: np.ndarray, command_timer: np.ndarray, push_timer: np.ndarray,
          last_action: np.ndarray, prev_action: np.ndarray, air_time: np.ndarray) -> None:
    """``HumanoidWalkTask.reset``'s writes for ``env_ids`` from its draws: the home pose with uniform joint noise
    (``pose_draw`` [K, A + 1], the last column the heading) clipped to the joint ranges, at rest, the joint targets
    on the pose, a new command (``cmd_draw`` [K, 4]) and timers (``timer_draw``, ``push_draw`` [K]), and cleared
    action history and air times."""
    f = np.float32
    a = qpos_idx.shape[0]
    for row in range(env_ids.shape[0]):
        i = env_ids[row]
        for j in range(home_qpos.shape[0]):
            qpos[i, j] = home_qpos[j]
        yaw = (pose_draw[row, a] * f(2.0) - f(1.0)) * f(yaw_range)
        qpos[i, base_qpos_adr + 3] = math.cos(yaw / f(2.0))
        qpos[i, base_qpos_adr + 6] = math.sin(yaw / f(2.0))
        for j in range(a):
            q = joints[J_DEFAULT, j] + (pose_draw[row, j] * f(2.0) - f(1.0)) * f(joint_noise)
            q = max(min(q, joints[J_HIGH, j]), joints[J_LOW, j])
            qpos[i, qpos_idx[j]] = q
            ctrl[i, j] = q
            last_action[i, j] = 0.0
            prev_action[i, j] = 0.0
        for j in range(qvel.shape[1]):
            qvel[i, j] = 0.0
        for k in range(air_time.shape[1]):
            air_time[i, k] = 0.0
        _command(cmd_draw, row, i, cmd_box, standing_fraction, command)
        command_timer[i] = timer_draw[row]
        push_timer[i] = push_draw[row]
