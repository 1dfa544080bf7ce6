"""Scripted IK experts for the SO-101 tasks: the source of demos, a test oracle, and the simulated human in HIL.

Each expert is a small per-env state machine over waypoints of the ``grasp``/``ee`` site; every step it solves
damped-least-squares IK (``sim.ik``) from the measured joints toward the current waypoint and converts the joint
targets into the task's normalised action with ``SO101Arm.ctrl_to_action``. It reads the simulator's state the
way a human watching the scene would (object poses), so it is a privileged policy: use it for demos, not as a
baseline.

    expert = make_expert(env)
    obs, _ = env.reset(seed=0)
    action = expert.act()          # [N, 6] in [-1, 1]
"""

from __future__ import annotations

import math

import mujoco
import numpy as np
import torch

from sim import ik, so101
from sim.core import MujocoFamilyEnv

GRIPPER_OPEN = 1.0  # rad, ~5 cm between the pads
GRIPPER_CLOSED = -0.17  # rad, past contact so the servo squeezes


def _quat_yaw(q: np.ndarray) -> float:
    """Heading about world z of a (w, x, y, z) quaternion."""
    w, x, y, z = q
    return math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


class _Expert:
    """Shared plumbing: per-env phases, IK from the measured joints, joint targets -> actions."""

    site = "grasp"

    def __init__(self, env: MujocoFamilyEnv, ik_iters: int = 30) -> None:
        self.env, self.model = env, env.physics.model
        self.arm: so101.SO101Arm = env.task.arm
        self.data = mujoco.MjData(self.model)
        self.ik_iters = ik_iters
        self.arm_joints = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in so101.ARM_JOINTS]
        n = env.num_envs
        self.phase = np.zeros(n, dtype=int)
        self.timer = np.zeros(n, dtype=int)
        self.memo: dict[str, np.ndarray] = {}
        self._q_target = np.zeros((n, 6))

    def _sync(self, i: int) -> None:
        s = self.env.physics.state
        self.data.qpos[:] = s.qpos[i].cpu().numpy()
        mujoco.mj_kinematics(self.model, self.data)

    def _ik(self, i: int, pos: np.ndarray, yaw: float | None) -> np.ndarray:
        q0 = self.data.qpos[self.arm.qpos_idx[:5].cpu().numpy()]
        orient = ik.top_down_quat(yaw) if yaw is not None else None
        return ik.solve_ik(self.model, self.data, self.site, pos, q0, self.arm_joints,
                           target_quat_or_axis=orient, iters=self.ik_iters)

    def _site_pos(self) -> np.ndarray:
        return self.data.site(self.site).xpos.copy()

    def act(self) -> torch.Tensor:
        """[N, 6] actions for the current state of every env."""
        steps = self.env.episode_step.cpu().numpy()
        for i in range(self.env.num_envs):
            if steps[i] == 0:
                self.phase[i], self.timer[i] = 0, 0
            self._sync(i)
            self._q_target[i] = self._plan(i)
            self.timer[i] += 1
        s = self.env.physics.state
        target = torch.as_tensor(self._q_target, dtype=torch.float32, device=s.qpos.device)
        return self.arm.ctrl_to_action(s.qpos, target)

    def _advance(self, i: int) -> None:
        self.phase[i] += 1
        self.timer[i] = 0

    def _plan(self, i: int) -> np.ndarray:
        raise NotImplementedError


class ReachExpert(_Expert):
    """IK straight to the target with the tool frame."""

    site = "ee"

    def _plan(self, i: int) -> np.ndarray:
        target = self.env.task.target[i].cpu().numpy().astype(float)
        q = self._ik(i, target, None)
        return np.append(q, self.data.qpos[self.arm.qpos_idx[5].item()])


class LiftExpert(_Expert):
    """Above the cube -> down around it -> close -> lift, top-down with the jaws across two faces."""

    def _cube(self, i: int) -> tuple[np.ndarray, float]:
        qadr = self.env.task.cube_qadr
        q = self.env.physics.state.qpos[i, qadr:qadr + 7].cpu().numpy()
        return q[:3].copy(), _quat_yaw(q[3:7])

    def _grasp_yaw(self, cube: np.ndarray, cube_yaw: float) -> float:
        preferred = math.atan2(cube[1], cube[0]) + math.pi / 2  # jaws across the line from the base: least roll
        return ik.nearest_grasp_yaw(cube_yaw, preferred)

    def _plan(self, i: int) -> np.ndarray:
        cube, cube_yaw = self._cube(i)
        if self.phase[i] == 0:  # remember where the cube was and how to hold it
            self.memo.setdefault("yaw", np.zeros(self.env.num_envs))[i] = self._grasp_yaw(cube, cube_yaw)
            self._advance(i)
        yaw = float(self.memo["yaw"][i])
        site = self._site_pos()
        if self.phase[i] == 1:  # above the cube, open
            goal, grip = cube + [0, 0, 0.06], GRIPPER_OPEN
            if np.linalg.norm(site - goal) < 0.012 or self.timer[i] > 60:
                self._advance(i)
        elif self.phase[i] == 2:  # down around it
            goal, grip = cube + [0, 0, 0.002], GRIPPER_OPEN
            if np.linalg.norm(site - goal) < 0.006 or self.timer[i] > 40:
                self._advance(i)
        elif self.phase[i] == 3:  # close
            goal, grip = cube + [0, 0, 0.002], GRIPPER_CLOSED
            if self.timer[i] > 12:
                self._advance(i)
        else:  # lift
            goal, grip = cube * [1, 1, 0] + [0, 0, 0.0125 + self.env.task.cfg.lift_height + 0.03], GRIPPER_CLOSED
        return np.append(self._ik(i, goal, yaw), grip)


class PushExpert(_Expert):
    """Cage the cube between the open jaws and push it with the fixed jaw's flat pad along the line to the goal.

    The jaw opening axis is laid along the push direction u, so the fixed pad (behind) is a 2.4 cm flat pusher
    and the moving jaw (ahead) keeps the cube from escaping forward. Waypoints advance at a capped Cartesian
    speed so the arm never flings the cube. The line is fixed when the approach starts; if the cube slides off
    it, the expert lifts straight up and lines up again.
    """

    def _plan(self, i: int) -> np.ndarray:
        qadr = self.env.task.cube_qadr
        cube = self.env.physics.state.qpos[i, qadr:qadr + 3].cpu().numpy().astype(float)
        goal = self.env.task.goal[i].cpu().numpy().astype(float)
        line = self.memo.setdefault("u", np.zeros((self.env.num_envs, 2)))
        site = self._site_pos()
        if self.phase[i] == 0:  # lift clear, then fix the push direction from where the cube is now
            d = goal - cube[:2]
            line[i] = d / max(float(np.linalg.norm(d)), 1e-6)
            if site[2] > 0.045 or self.timer[i] > 20:
                self._advance(i)
            else:
                return np.append(self._ik(i, site + [0, 0, 0.02], None), GRIPPER_OPEN)
        u = line[i]
        yaw = math.atan2(u[1], u[0])  # opening axis (fixed -> moving jaw) along the push
        # The fixed pad's face is ~1.5 cm behind the grasp site along the opening axis: with the site 4 mm behind
        # the cube's centre it clears the cube's back face by ~6 mm, and the open moving jaw its front by ~18 mm.
        start = cube[:2] - u * 0.004
        speed = 0.015  # m per control step
        if self.phase[i] == 1:  # above the cube, jaws open across it
            goal_pos = np.array([*start, 0.06])
            if np.linalg.norm(site - goal_pos) < 0.01 or self.timer[i] > 60:
                self._advance(i)
        elif self.phase[i] == 2:  # down around it
            goal_pos, speed = np.array([*start, 0.015]), 0.01
            if np.linalg.norm(site - goal_pos) < 0.006 or self.timer[i] > 40:
                self._advance(i)
        else:  # push the cube's centre onto the goal, slowly
            lateral = float(np.dot(cube[:2] - goal, np.array([-u[1], u[0]])))
            if abs(lateral) > 0.012 and self.timer[i] > 15:  # slid off the line: lift, line up again
                self.phase[i], self.timer[i] = 0, 0
            goal_pos, speed = np.array([*(goal + u * 0.006), 0.015]), 0.005  # cube centre ~2.5 mm behind the site
        step = goal_pos - site
        norm = float(np.linalg.norm(step))
        waypoint = site + step * min(1.0, speed / max(norm, 1e-9))
        return np.append(self._ik(i, waypoint, yaw), GRIPPER_OPEN)


EXPERTS = {"so101_reach": ReachExpert, "so101_lift": LiftExpert, "so101_push": PushExpert}


def make_expert(env: MujocoFamilyEnv, **kwargs) -> _Expert:
    """The scripted expert of ``env``'s task."""
    name = env.task.name
    if name not in EXPERTS:
        raise ValueError(f"no scripted expert for task {name!r}; experts exist for {sorted(EXPERTS)}")
    return EXPERTS[name](env, **kwargs)
