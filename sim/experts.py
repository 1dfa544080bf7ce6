"""Scripted IK experts for the SO-101 tasks: the source of demos, a test oracle, and the simulated human in HIL.

Teleoperator-shaped: an expert sees only observations, like a person watching the scene, and answers with
actions; it never reads the simulator. ``act(obs)`` returns [N, 6] actions from the named observation parts
(``ObsSpec.part``: joint positions, cube pose, target); ``reset(env_ids)`` starts new episodes. It prefers the
privileged, noise-free ``critic`` group (a human sees the world, not a noisy sensor) and falls back to
``proprio`` / ``policy``, so an observation holding only the policy group works too.

Each expert is a small per-env state machine over waypoints of the ``grasp``/``ee`` site; every step it solves
damped-least-squares IK (``sim.ik``) on its own copy of the task's MuJoCo model, from the observed joints toward
the current waypoint, and converts the joint targets into the task's normalised action with
``SO101Arm.ctrl_to_action``. Being privileged, it is for demos, not a baseline.

    expert = make_expert(env)
    obs, _ = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(expert.act(obs))   # [N, 6] in [-1, 1]
    expert.reset((terminated | truncated).nonzero().flatten())            # with auto-reset: new episodes

``quality`` (1.0: the expert as written, its full success rate) makes demos imperfect the way a person's are, so a
dataset holds good and bad actions (RECAP needs both): at every episode start each flaw is switched on, per env,
with probability ``1 - quality``, drawn from the expert's own seeded generator -- Gaussian action noise, a pause
(the arm held still for a while), a detour (the approach aims beside the object first, then corrects), and where
the task has them a missed grasp (closing above the cube, then starting over), a dropped cube (let go while lifting,
then starting over) and the wrong cube first (so101_pick).

``grasp_recovery`` (tasks with a grasp: lift, pick) is the grasp's counterpart of DART's disturbed approach: with
that probability per episode the first grasp is botched on purpose -- the jaws go down beside the cube and askew
(``BOTCH_XY``, ``BOTCH_Z``, ``BOTCH_YAW_DEG``, the way a learned policy's failed grasps miss), close there, and the
expert starts over when the lift finds no cube between the pads. While it botches, ``label_action`` holds what the
expert would command from each state it passes through instead (the straight way down to the true grasp pose, the
jaws open), and a recorder writes that as the demonstration's ``action``: the demos visit a learner's near misses
and show the correction, never the miss itself. ``label_action`` is None when no episode carries the option.
"""

from __future__ import annotations

import math
from typing import Any

import mujoco
import numpy as np
import torch

from policies import keys
from robot_rl.env import Obs, ObsSpec
from sim import ik, so101
from sim.env import MujocoFamilyEnv
from sim.task import Task
from sim.tasks.so101_pick import COLOURS, cube_name

GRIPPER_OPEN = 1.0  # rad, ~5 cm between the pads
GRIPPER_CLOSED = -0.17  # rad, past contact so the servo squeezes
GROUPS = (keys.CRITIC, keys.PROPRIO, keys.POLICY)  # where observation parts are looked up, first match wins
# Flaws of an imperfect episode (``quality`` < 1), each drawn per env and episode.
NOISE_STD = (0.2, 0.8)  # std of the Gaussian noise on normalised actions, uniform in this range
PAUSE_START = (3, 40)  # control step at which the arm stops, uniform in [low, high)
PAUSE_STEPS = (10, 30)  # control steps it stays still, uniform in [low, high)
DETOUR = (0.04, 0.06)  # m, how far beside the approach waypoint the first approach aims (random heading, 0-2 cm up)
MISS_HEIGHT = (0.025, 0.035)  # m, how far above the grasp height a missed grasp closes
DROP_AFTER = (1, 4)  # control steps into the lift at which a dropped cube is let go (success comes ~4 in)
# A botched first grasp (``grasp_recovery``), drawn per episode: the grasp site's offset beside the cube (random
# heading), above it, and the jaws' yaw error (random sign). The flow VLA's failed picks closed 1.6 cm off, 1.3 cm
# high and 24 deg askew (medians; vla_bc.json -> pick_failure_geometry_2026_12_05).
BOTCH_XY = (0.010, 0.025)  # m
BOTCH_Z = (0.0, 0.012)  # m
BOTCH_YAW_DEG = (10.0, 35.0)


class ScriptedExpert:
    """Shared plumbing: per-env phases, IK from the observed joints, joint targets -> actions.

    Args:
        task: the task being solved (its config: action mapping, lift height; its scene: the expert's model).
        num_envs: N.
        obs_spec: the env's observation spec (names the parts the expert reads).
        ik_iters: damped-least-squares iterations per step.
        quality: in [0, 1]; each flaw of an episode is on with probability ``1 - quality`` (1.0: none, ever).
        seed: seeds the draws of the flaws (and of the action noise).
        grasp_recovery: in [0, 1]; the probability that an episode's first grasp is botched and corrected (module
            docstring); its draws come from a generator of their own, so the flaws stay those of ``seed``.
    """

    site = "grasp"
    parts: tuple[str, ...] = ()  # observation parts read besides joint_pos
    # Phases that bring the tool to where the task's contact starts (above the cube); None: the whole episode is one
    # approach (reach). ``approaching`` reads them, for DART demos that disturb the approach and not the grasp.
    approach_phases: tuple[int, ...] | None = None
    grasps = False  # whether the task has a grasp that ``grasp_recovery`` can botch

    def __init__(self, task: Task, num_envs: int, obs_spec: ObsSpec, ik_iters: int = 30, quality: float = 1.0,
                 seed: int = 0, grasp_recovery: float = 0.0) -> None:
        if not 0.0 <= float(quality) <= 1.0:
            raise ValueError(f"expert quality must lie in [0, 1], got {quality}")
        if not 0.0 <= float(grasp_recovery) <= 1.0:
            raise ValueError(f"expert grasp_recovery must lie in [0, 1], got {grasp_recovery}")
        if grasp_recovery > 0 and not self.grasps:
            raise ValueError(f"grasp_recovery: {task.name}'s expert has no grasp to botch (experts with one: "
                             f"{sorted(name for name, cls in EXPERTS.items() if cls.grasps)})")
        self.quality, self.grasp_recovery = float(quality), float(grasp_recovery)
        self.rng = np.random.default_rng(seed)
        self.recovery_rng = np.random.default_rng([seed, 1])
        self.cfg, self.obs_spec, self.num_envs = task.cfg, obs_spec, num_envs
        self.model = task.build_spec().compile()  # the expert's own model: its IK never touches the env
        self.data = mujoco.MjData(self.model)
        self._ik_scratch = mujoco.MjData(self.model)  # the IK solver's, reused every solve
        self.arm = so101.SO101Arm(self.model, torch.device("cpu"), self.cfg.max_delta, self.cfg.max_delta_gripper,
                                  self.cfg.action_mode)
        self.ik_iters = ik_iters
        self.arm_joints = [mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in so101.ARM_JOINTS]
        self.arm_qadr = self.arm.qpos_idx.numpy()
        self.phase = np.zeros(num_envs, dtype=int)
        self.timer = np.zeros(num_envs, dtype=int)
        self.memo: dict[str, np.ndarray] = {}
        self.seen: dict[str, np.ndarray] = {}  # this step's observation parts, float64 [N, size]
        self._q_target = np.zeros((num_envs, 6))
        # This episode's flaws, per env (see the module docstring); none at quality 1.
        self.steps = np.zeros(num_envs, dtype=int)  # control steps since the episode began
        self.noise_std = np.zeros(num_envs)
        self.pause = np.zeros((num_envs, 2), dtype=int)  # [start, stop) control steps; empty when start == stop
        self.detour = np.zeros((num_envs, 3))  # m, added to the first approach waypoint until it is reached
        self.miss = np.zeros(num_envs)  # m, added to the first grasp height (0: no miss)
        self.drop = np.zeros(num_envs, dtype=int)  # the first lift lets go after this many steps (0: it holds on)
        self.botch = np.zeros((num_envs, 4))  # a botched first grasp: site offset (m) [3], yaw error (rad); 0: none
        self._hold = np.zeros((num_envs, 6))
        # grasp_recovery: the command from the state each env is in, where it differs from the one sent (rad [N, 6])
        self._label_q = np.zeros((num_envs, 6))
        self._relabelled = np.zeros(num_envs, dtype=bool)
        self.label_action: torch.Tensor | None = None  # [N, 6] in [-1, 1] as of the last act; None: never differs
        self.reset()

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        """Start new episodes in ``env_ids`` (int [K]; None: every env) and draw their flaws."""
        ids = np.arange(self.num_envs) if env_ids is None else torch.as_tensor(env_ids).cpu().long().numpy()
        self.phase[ids], self.timer[ids], self.steps[ids] = 0, 0, 0
        self._draw_flaws(ids)

    def _draw_flaws(self, ids: np.ndarray) -> None:
        """Each flaw on with probability ``1 - quality`` for the episodes starting in ``ids``, in a fixed order of
        draws (the same seed, resets and quality give the same flaws)."""
        n, p, rng = len(ids), 1.0 - self.quality, self.rng
        on = rng.random((n, 6)) < p  # noise, pause, detour, miss, drop, task-specific
        self.noise_std[ids] = np.where(on[:, 0], rng.uniform(*NOISE_STD, n), 0.0)
        start = rng.integers(*PAUSE_START, n)
        self.pause[ids] = np.stack([start, start + np.where(on[:, 1], rng.integers(*PAUSE_STEPS, n), 0)], axis=1)
        heading = rng.uniform(0, 2 * np.pi, n)
        dist, up = rng.uniform(*DETOUR, n), rng.uniform(0.0, 0.02, n)
        detour = np.stack([dist * np.cos(heading), dist * np.sin(heading), up], axis=1)
        self.detour[ids] = np.where(on[:, 2:3], detour, 0.0)
        self.miss[ids] = np.where(on[:, 3], rng.uniform(*MISS_HEIGHT, n), 0.0)
        self.drop[ids] = np.where(on[:, 4], rng.integers(*DROP_AFTER, n), 0)
        self._draw_task_flaws(ids, on[:, 5])
        self.botch[ids] = 0.0
        if self.grasp_recovery > 0:
            r = self.recovery_rng
            botched = r.random(n) < self.grasp_recovery
            heading, dist = r.uniform(0, 2 * np.pi, n), r.uniform(*BOTCH_XY, n)
            yaw = np.deg2rad(r.uniform(*BOTCH_YAW_DEG, n)) * r.choice([-1.0, 1.0], n)
            botch = np.stack([dist * np.cos(heading), dist * np.sin(heading), r.uniform(*BOTCH_Z, n), yaw], axis=1)
            self.botch[ids] = np.where(botched[:, None], botch, 0.0)

    def _draw_task_flaws(self, ids: np.ndarray, on: np.ndarray) -> None:
        """A task's own flaw for the episodes starting in ``ids`` where ``on`` (bool [len(ids)])."""

    def act(self, obs: Obs) -> torch.Tensor:
        """float32 [N, 6] actions in [-1, 1] for the observations ``obs``, on their device."""
        q = self.obs_spec.part(obs, "joint_pos", GROUPS)
        self.seen = {name: self.obs_spec.part(obs, name, GROUPS).detach().cpu().double().numpy()
                     for name in ("joint_pos", *self.parts)}
        self._relabelled[:] = False
        for i in range(self.num_envs):
            start, stop = self.pause[i]
            if start <= self.steps[i] < stop:  # holding still: the arm where it stood, the gripper as commanded
                if self.steps[i] == start:
                    self._hold[i] = np.append(self.seen["joint_pos"][i, :5], self._q_target[i, 5])
                self._q_target[i] = self._hold[i]
            else:
                self.data.qpos[self.arm_qadr] = self.seen["joint_pos"][i]
                mujoco.mj_kinematics(self.model, self.data)
                self._q_target[i] = self._plan(i)
                self.timer[i] += 1
            self.steps[i] += 1
        target = torch.as_tensor(self._q_target, dtype=torch.float32)
        q_cpu = q.detach().float().cpu()
        action = self.arm.ctrl_to_action(q_cpu, target)
        if self.noise_std.any():
            noise = self.rng.standard_normal((self.num_envs, 6)) * self.noise_std[:, None]
            action = (action + torch.as_tensor(noise, dtype=torch.float32)).clamp(-1.0, 1.0)
        if self.grasp_recovery > 0:
            label = action.clone()
            rows = torch.as_tensor(self._relabelled)
            label[rows] = self.arm.ctrl_to_action(q_cpu, torch.as_tensor(self._label_q, dtype=torch.float32))[rows]
            self.label_action = label.to(q.device)
        return action.to(q.device)

    def _relabel(self, i: int, target: np.ndarray) -> None:
        """Env ``i``'s demonstration records ``target`` (rad [6]) this step instead of the command it sends."""
        self._label_q[i], self._relabelled[i] = target, True

    @property
    def approaching(self) -> np.ndarray:
        """bool [N]: each env's expert is in an approach phase (``approach_phases``) as of its last ``act``."""
        if self.approach_phases is None:
            return np.ones(self.num_envs, dtype=bool)
        return np.isin(self.phase, self.approach_phases)

    def _ik(self, pos: np.ndarray, yaw: float | None) -> np.ndarray:
        q0 = self.data.qpos[self.arm_qadr[:5]]
        orient = ik.top_down_quat(yaw) if yaw is not None else None
        return ik.solve_ik(self.model, self.data, self.site, pos, q0, self.arm_joints,
                           target_quat_or_axis=orient, iters=self.ik_iters, scratch=self._ik_scratch)

    def _site_pos(self) -> np.ndarray:
        return self.data.site(self.site).xpos.copy()

    def _advance(self, i: int) -> None:
        self.phase[i] += 1
        self.timer[i] = 0

    def _approached(self, i: int) -> bool:
        """Called when the approach waypoint is reached: True when it was the real one; after a detour's false
        waypoint the detour ends (the approach corrects) and the phase goes on."""
        if self.detour[i].any():
            self.detour[i], self.timer[i] = 0.0, 0
            return False
        return True

    def _plan(self, i: int) -> np.ndarray:
        """[6] joint targets (rad) of env ``i``; ``self.data`` holds its observed arm pose."""
        raise NotImplementedError


class ReachExpert(ScriptedExpert):
    """IK straight to the target with the tool frame (after a detour's false target, when it has one)."""

    site = "ee"
    parts = ("target_pos",)

    def _plan(self, i: int) -> np.ndarray:
        goal = self.seen["target_pos"][i] + self.detour[i]
        if self.detour[i].any() and (np.linalg.norm(self._site_pos() - goal) < 0.015 or self.timer[i] > 40):
            self._approached(i)
        q = self._ik(goal, None)
        return np.append(q, self.seen["joint_pos"][i, 5])


class LiftExpert(ScriptedExpert):
    """Above the cube -> down around it -> close -> lift, top-down with the jaws across two faces."""

    parts = ("cube_pos", "cube_quat", "pad_contacts")
    approach_phases = (0, 1)  # choose the cube, go above it; then down, close, lift
    grasps = True
    descent_speed: float | None = None  # m per control step along the straight line down; None: IK straight to it

    def _cube(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The cube to lift in env ``i``: position [3] (m), quaternion [4] (w x y z), pad contacts [2] (1/0)."""
        return self.seen["cube_pos"][i], self.seen["cube_quat"][i], self.seen["pad_contacts"][i]

    def _choose(self, i: int) -> None:
        """Called at the start of every attempt (phase 0): a task with several cubes picks one here."""

    def _grasp_yaw(self, cube: np.ndarray, cube_yaw: float) -> float:
        preferred = math.atan2(cube[1], cube[0]) + math.pi / 2  # jaws across the line from the base: least roll
        return ik.nearest_grasp_yaw(cube_yaw, preferred)

    def _plan(self, i: int) -> np.ndarray:
        if self.phase[i] == 0:  # choose the cube, remember how to hold it
            self._choose(i)
            cube, quat, _ = self._cube(i)
            yaw = self._grasp_yaw(cube, ik.quat_yaw(quat))
            self.memo.setdefault("yaw", np.zeros(self.num_envs))[i] = yaw
            self._advance(i)
        cube, _, contacts = self._cube(i)
        yaw = float(self.memo["yaw"][i])
        site = self._site_pos()
        phase = int(self.phase[i])  # this step's phase (an advance below takes effect at the next step)
        botched = bool(self.botch[i].any())
        true_goal = cube + [0, 0, 0.002 + self.miss[i]]
        if phase == 1:  # above the cube, open (beside it first, on a detour)
            goal, grip = cube + [0, 0, 0.06] + self.detour[i], GRIPPER_OPEN
            if (np.linalg.norm(site - goal) < 0.012 or self.timer[i] > 60) and self._approached(i):
                self._advance(i)
        elif phase == 2:  # down around it (closing too high on a missed grasp; beside it and askew when botched)
            goal, grip = true_goal + self.botch[i, :3], GRIPPER_OPEN
            self.memo.setdefault("close_at", np.zeros((self.num_envs, 3)))[i] = goal
            if np.linalg.norm(site - goal) < 0.006 or self.timer[i] > 40:
                self._advance(i)
            goal = self._descend(site, goal)
        elif phase == 3:  # close where the descent ended: following a cube that one jaw nudges chases it away
            goal, grip = self.memo["close_at"][i], GRIPPER_CLOSED
            if self.timer[i] > 12:
                self._advance(i)
        else:  # lift; a missed grasp (a jaw nudged the cube away) starts over from above the cube, as a person would
            goal, grip = cube * [1, 1, 0] + [0, 0, 0.0125 + self.cfg.lift_height + 0.03], GRIPPER_CLOSED
            if 0 < self.drop[i] <= self.timer[i]:  # a flawed episode lets the cube slip from its fingers
                grip = GRIPPER_OPEN
            if self.timer[i] > 6 and contacts.min() < 0.5:
                self.phase[i], self.timer[i], self.miss[i], self.drop[i] = 0, 0, 0.0, 0
                self.botch[i] = 0.0  # only the first grasp is botched
        if botched and (phase in (2, 3) or (phase >= 4 and contacts.min() < 0.5)):  # no cube held: the way to it
            self._relabel(i, np.append(self._ik(self._descend(site, true_goal), yaw), GRIPPER_OPEN))
        botch_yaw = self.botch[i, 3] if phase in (2, 3) else 0.0
        return np.append(self._ik(goal, yaw + botch_yaw), grip)

    def _descend(self, site: np.ndarray, goal: np.ndarray) -> np.ndarray:
        """The next waypoint toward ``goal`` (m [3]): the goal itself, or a step of ``descent_speed`` along the
        straight line to it (the jaws swing into no neighbour)."""
        if self.descent_speed is None:
            return goal
        step = goal - site
        return site + step * min(1.0, self.descent_speed / max(float(np.linalg.norm(step)), 1e-9))


class PickExpert(LiftExpert):
    """LiftExpert on the cube the instruction names, read from the ``target_onehot`` part; on a flawed episode it
    first goes above another cube, then turns to the named one."""

    parts = ("target_onehot", "pad_contacts", *(f"{cube_name(c)}_{p}" for c in COLOURS for p in ("pos", "quat")))
    descent_speed = 0.015

    def __init__(self, task: Task, num_envs: int, obs_spec: ObsSpec, **kwargs: Any) -> None:
        self.cube_idx = np.zeros(num_envs, dtype=int)  # the cube of the current attempt, index into COLOURS
        self.wrong = np.full(num_envs, -1)  # on a flawed episode: the shift from the named cube to the one visited
        super().__init__(task, num_envs, obs_spec, **kwargs)  # first (1 or 2); -1: none

    def _draw_task_flaws(self, ids: np.ndarray, on: np.ndarray) -> None:
        shift = self.rng.integers(1, len(COLOURS), len(ids))  # which of the other cubes, once the target is seen
        self.wrong[ids] = np.where(on, shift, -1)

    def _choose(self, i: int) -> None:
        named = int(np.argmax(self.seen["target_onehot"][i]))
        self.cube_idx[i] = (named + self.wrong[i]) % len(COLOURS) if self.wrong[i] > 0 else named

    def _approached(self, i: int) -> bool:
        if self.wrong[i] > 0:  # above the wrong cube: start over with the named one
            self.wrong[i], self.phase[i], self.timer[i] = -1, 0, 0
            return False
        return super()._approached(i)

    def _cube(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = int(self.cube_idx[i])
        name = cube_name(COLOURS[k])
        return self.seen[f"{name}_pos"][i], self.seen[f"{name}_quat"][i], self.seen["pad_contacts"][i, 2 * k:2 * k + 2]


class PushExpert(ScriptedExpert):
    """Cage the cube between the open jaws and push it with the fixed jaw's flat pad along the line to the goal.

    The jaw opening axis is laid along the push direction u, so the fixed pad (behind) is a 2.4 cm flat pusher
    and the moving jaw (ahead) keeps the cube from escaping forward. Waypoints advance at a capped Cartesian
    speed so the arm never flings the cube. The line is fixed when the approach starts; if the cube slides off
    it, the expert lifts straight up and lines up again.
    """

    parts = ("cube_pos", "goal_pos")
    approach_phases = (0, 1)  # lift clear, go above the cube; then down, push

    def _plan(self, i: int) -> np.ndarray:
        cube, goal = self.seen["cube_pos"][i], self.seen["goal_pos"][i]
        line = self.memo.setdefault("u", np.zeros((self.num_envs, 2)))
        site = self._site_pos()
        if self.phase[i] == 0:  # lift clear, then fix the push direction from where the cube is now
            d = goal - cube[:2]
            line[i] = d / max(float(np.linalg.norm(d)), 1e-6)
            if site[2] > 0.045 or self.timer[i] > 20:
                self._advance(i)
            else:
                return np.append(self._ik(site + [0, 0, 0.02], None), GRIPPER_OPEN)
        u = line[i]
        yaw = math.atan2(u[1], u[0])  # opening axis (fixed -> moving jaw) along the push
        # The fixed pad's face is ~1.5 cm behind the grasp site along the opening axis: with the site 4 mm behind
        # the cube's centre it clears the cube's back face by ~6 mm, and the open moving jaw its front by ~18 mm.
        start = cube[:2] - u * 0.004
        speed = 0.015  # m per control step
        if self.phase[i] == 1:  # above the cube, jaws open across it (beside it first, on a detour)
            goal_pos = np.array([*start, 0.06]) + self.detour[i]
            if (np.linalg.norm(site - goal_pos) < 0.01 or self.timer[i] > 60) and self._approached(i):
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
        return np.append(self._ik(waypoint, yaw), GRIPPER_OPEN)


EXPERTS: dict[str, type[ScriptedExpert]] = {"so101_reach": ReachExpert, "so101_lift": LiftExpert,
                                            "so101_push": PushExpert, "so101_pick": PickExpert}


def make_expert(env: MujocoFamilyEnv, quality: float = 1.0, seed: int = 0, **kwargs: Any) -> ScriptedExpert:
    """The scripted expert of ``env``'s task, for its size and observation spec (the env itself is not kept).

    Args:
        env: the env (or a ``LeRobotView``'s inner env, ``view.env``) whose task the expert solves.
        quality: in [0, 1]; 1.0 is the expert as written, lower mixes flawed episodes in (module docstring).
        seed: seeds the expert's flaws and action noise.
        **kwargs: ``ik_iters``, ``grasp_recovery`` (lift and pick; module docstring).
    """
    task = env.task
    if task.name not in EXPERTS:
        raise ValueError(f"no scripted expert for task {task.name!r}; experts exist for {sorted(EXPERTS)}")
    return EXPERTS[task.name](task, env.num_envs, env.obs_spec, quality=quality, seed=seed, **kwargs)
