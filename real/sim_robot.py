"""``SO101SimRobot``: a LeRobot ``Robot`` (``--robot.type=so101_sim``) on our MuJoCo SO-101 and a task scene, so
LeRobot's own tools (``lerobot-teleoperate``, ``lerobot-record``, ``lerobot-rollout``) and ours drive a simulated arm
exactly as they drive ``so101_follower``.

    robot = SO101SimRobot(SO101SimRobotConfig(task="so101_lift", max_relative_target=5.0))
    robot.connect()                                   # builds the scene (one env) and starts it
    obs = robot.get_observation()                     # {"shoulder_pan.pos": deg, ..., "gripper.pos": 0..100,
                                                      #  "front": uint8 (H, W, 3), "wrist": uint8 (H, W, 3)}
    sent = robot.send_action({"shoulder_pan.pos": 10.0, ...})   # one control step (1/30 s of simulated time);
                                                      # returns the goals really written (after max_relative_target)
    robot.task_success(), robot.instruction           # our tools' view of the task (not a LeRobot feature)
    robot.reset_scene()                               # a new scene (a person putting the cube back)
    robot.disconnect()

Features and units are ``so101_follower``'s (``use_degrees=True``): the five body joints in degrees (0 at our model's
zero pose, the "new calibration" zero of LeRobot's SO-101), the gripper 0..100 over its range (-10 deg closed ..
100 deg open; ``real.features``). A goal is a joint position target: the simulated STS3215 servos move toward it at
most the task's ``max_delta`` per control step (0.08 rad = 4.6 deg body, 0.15 rad = 8.6 deg gripper: ~140 deg/s), and
the action returned is the goal written, as the follower returns its ``Goal_Position``.

Time: each ``send_action`` advances the scene one control step, whatever the wall clock says (lerobot-record's loop
paces itself at ``fps``; keep ``--dataset.fps=30``, the task's rate). The scene is one continuous world: success does
not end it and there is no time limit unless ``time_limit_steps`` is set. A new scene starts at ``connect``, on
``reset_scene()``, and when a ``get_observation`` comes more than ``idle_reset_s`` after the last ``send_action``
(LeRobot's recorders pause there while they save an episode -- lerobot-record took 0.38-0.44 s to save a 1.5 s
episode of two 96x128 cameras, while gaps inside its 30 fps loop stayed under 0.025 s -- and the simulated person
resets the scene then, so every recorded episode after the first starts from a fresh scene; time a loop spends
between reading and acting, a slow policy, never counts). LeRobot has no reset hook for robots, so this is a timing
rule: set ``idle_reset_s`` below the save time when it is quicker (``--dataset.streaming_encoding=true``), or None.

Connected instances are listed by ``live_robots()``: the simulated leader (``real.sim_teleop``) finds its robot there.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from functools import cached_property
from typing import Any

import numpy as np
import torch
from lerobot.robots.robot import Robot
from lerobot.robots.utils import ensure_safe_goal_position
from lerobot.utils.decorators import check_if_already_connected, check_if_not_connected

from policies import keys
from real import features
from real.config_sim_robot import SO101SimRobotConfig
from sim import so101
from sim.config import SimConfig
from sim.lerobot_view import LeRobotView
from sim.randomization import RandomizationConfig

log = logging.getLogger(__name__)
SO101SimConfig = SO101SimRobotConfig  # the short name
NO_TIME_LIMIT = 2**62  # control steps: an episode length no session reaches

_INSTANCES: weakref.WeakSet[SO101SimRobot] = weakref.WeakSet()


def live_robots() -> list[SO101SimRobot]:
    """Every ``SO101SimRobot`` constructed in this process and not yet garbage-collected, oldest first."""
    return sorted(_INSTANCES, key=lambda r: r._serial)


class SO101SimRobot(Robot):
    """The simulated SO-101 follower (module docstring). Thread-safe: one lock serialises every call.

    Args:
        config: the robot's config.
        task_cfg: optional typed task config (``sim.registry.task_config(config.task, {...})``) for our own tools;
            default: the task's defaults. Its cameras, time limit and success termination are set by the robot.

    Attributes:
        cameras: camera name -> (H, W) px.
        gripper_range: the degrees the gripper's 0..100 spans (``real.features.sim_gripper_range``).
        lock: the re-entrant lock every call holds (the simulated leader holds it while it reads the scene).
        scene_index, scene_step: the current scene (0 after connect) and its control steps.
        total_steps, scenes_solved: control steps and solved scenes since connect.
    """

    config_class = SO101SimRobotConfig
    name = "so101_sim"
    _count = 0

    def __init__(self, config: SO101SimRobotConfig, task_cfg: Any | None = None) -> None:
        super().__init__(config)
        self.config = config
        self._task_cfg = task_cfg
        self.cameras: dict[str, tuple[int, int]] = {c: (config.image_height, config.image_width)
                                                    for c in config.camera_names}  # name -> (H, W)
        self.lock = threading.RLock()  # held by every call; the simulated leader holds it to read the scene
        self._view: LeRobotView | None = None
        self._obs: dict[str, Any] | None = None  # this step's observation, rendered on first read
        self._success = False
        self._ended = False
        self._solved = False  # the current scene's task was solved at some step
        self._last_send: float | None = None  # time.monotonic() at the end of the last send_action
        self.scene_index = -1  # scenes started since connect, minus one (the current scene's index)
        self.scene_step = 0  # control steps in the current scene
        self.total_steps = 0  # control steps since connect
        self.scenes_solved = 0  # scenes whose task was solved at some step, since connect
        self.gripper_range = features.sim_gripper_range()
        SO101SimRobot._count += 1
        self._serial = SO101SimRobot._count
        _INSTANCES.add(self)

    # ------------------------------------------------------------------------------------------- features
    @cached_property
    def observation_features(self) -> dict[str, type | tuple]:
        h, w = self.config.image_height, self.config.image_width
        return {**dict.fromkeys(features.POS_FEATURES, float), **{c: (h, w, 3) for c in self.cameras}}

    @cached_property
    def action_features(self) -> dict[str, type]:
        return dict.fromkeys(features.POS_FEATURES, float)

    # ------------------------------------------------------------------------------------------ lifecycle
    @property
    def is_connected(self) -> bool:
        return self._view is not None

    @property
    def is_calibrated(self) -> bool:
        return True  # a simulated arm's encoders are exact

    def calibrate(self) -> None:
        """Nothing to calibrate."""

    def configure(self) -> None:
        """Nothing to configure (the servos' gains are the model's)."""

    @check_if_already_connected
    def use_task_config(self, task_cfg: Any) -> None:
        """Build the scene from ``task_cfg`` (a typed config of ``config.task``: e.g. a run's own, so a state policy's
        actions map to joint targets as in training) at ``connect``; refused once connected."""
        if self.is_connected:
            raise RuntimeError(f"{self}: the scene is built at connect; set its task config before")
        self._task_cfg = task_cfg

    def connect(self, calibrate: bool = True) -> None:
        """Build the scene (one env of ``config.task`` on the CPU MuJoCo backend) and start it."""
        import dataclasses

        from sim.registry import make_env, task_config

        c = self.config
        if c.torch_threads is not None:
            torch.set_num_threads(c.torch_threads)
        task_cfg = self._task_cfg if self._task_cfg is not None else task_config(c.task)
        changes: dict[str, Any] = {"cameras": [], "episode_length": c.time_limit_steps or NO_TIME_LIMIT}
        if hasattr(task_cfg, "terminate_on_success"):
            changes["terminate_on_success"] = False
        task_cfg = dataclasses.replace(task_cfg, **changes)
        lat = c.action_latency_steps
        dr = RandomizationConfig(friction=[c.friction_scale] * 2, mass=[c.mass_scale] * 2,
                                 joint_damping=[c.damping_scale] * 2, armature=[c.armature_scale] * 2,
                                 actuator_gain=[c.actuator_gain_scale] * 2, action_latency=[lat, lat])
        sim_cfg = SimConfig(num_envs=1, num_threads=1, seed=c.seed, autoreset=False, randomization=dr)
        env = make_env(c.task, sim_cfg, task_cfg)
        with self.lock:
            self._view = LeRobotView(env, cameras=tuple(c.camera_names) or ("front",),
                                     image_size=(c.image_height, c.image_width))
            self._warm_up(c.seed)
            self.scene_index, self.total_steps, self.scenes_solved = -1, 0, 0
            self._reset(seed=c.seed)

    def _warm_up(self, seed: int) -> None:
        """One render and one control step, undone by the seeded reset that follows: the renderer's set-up and the
        first step's one-off costs (~0.2 s and ~0.3 s here) would otherwise land in the first tick of a control
        loop, tripping its watchdog and flagging the first episode's timing (RELIABILITY C4)."""
        view = self._view
        view.reset(seed=seed)
        if self.config.camera_names:
            view.render_many(list(self.cameras))
        hold = so101.rad_to_deg(view.env_obs[keys.PROPRIO].double()).float()  # [1, 6] where the arm is
        view.step(hold.to(view.device))

    @check_if_not_connected
    def disconnect(self) -> None:
        with self.lock:
            view, self._view, self._obs = self._view, None, None
            view.close()
        log.info("%s disconnected: %d control steps in %d scenes, %d solved", self, self.total_steps,
                 self.scene_index + 1, self.scenes_solved)

    # -------------------------------------------------------------------------------------------- control
    @check_if_not_connected
    def get_observation(self) -> dict[str, Any]:
        """The joints (body degrees, gripper 0..100) and one uint8 (H, W, 3) image per camera, of the scene now."""
        with self.lock:
            self._reset_if_idle()
            if self._obs is None:
                view = self._view
                rad = view.env_obs[keys.PROPRIO][0]
                robot_units = features.deg_to_robot(so101.rad_to_deg(rad.double()).float(), self.gripper_range)
                obs: dict[str, Any] = features.dict_from_vector(robot_units)
                for cam, img in view.render_many(list(self.cameras)).items():  # uint8 [1, 3, H, W] -> [H, W, 3]
                    obs[cam] = np.ascontiguousarray(img[0].permute(1, 2, 0).cpu().numpy())
                self._obs = obs
            return dict(self._obs)

    @check_if_not_connected
    def send_action(self, action: dict[str, Any]) -> dict[str, float]:
        """Write goal positions (``<motor>.pos``: body degrees, gripper 0..100) and advance one control step.

        Motors left out keep their current goal, like a follower whose ``Goal_Position`` was not written; keys
        without ``.pos`` are ignored (as the follower does).

        Returns:
            The goals written, after ``max_relative_target`` (``|goal - present|`` capped per motor), only for the
            motors given.

        Raises:
            KeyError: a ``.pos`` key that is no SO-101 motor.
            ValueError: a goal that is not a finite number (nothing is written, the scene does not advance).
        """
        goal = {k: v for k, v in action.items() if k.endswith(".pos")}
        unknown = sorted(set(goal) - set(features.POS_FEATURES))
        if unknown:
            raise KeyError(f"so101_sim has no motor(s) {unknown}; its action keys are {list(features.POS_FEATURES)}")
        for k, v in goal.items():
            try:
                ok = np.isfinite(float(v))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"so101_sim: goal {k}={v!r} is not a finite number; nothing was written")
        with self.lock:
            if self._ended:  # the scene's task timed out or failed: a person sets up the next one
                self._reset()
            present = self._present()
            goal = {k: float(v) for k, v in goal.items()}
            cap = self.config.max_relative_target
            if cap is not None:
                cap = {f"{m}.pos": float(x) for m, x in cap.items()} if isinstance(cap, dict) else float(cap)
                if isinstance(cap, dict):
                    cap = {k: cap[k] for k in goal}
                goal = ensure_safe_goal_position({k: (g, present[k]) for k, g in goal.items()}, cap)
            held = features.dict_from_vector(self._held_goal())
            target = features.vector_from_dict({**held, **goal}, "action")
            target_deg = features.robot_to_deg(target, self.gripper_range)[None]
            view = self._view
            view.render_ids = False  # images are rendered when read
            _, _, terminated, truncated, info = view.step(target_deg.to(view.device))
            success = bool(info[keys.SUCCESS][0])
            self.scenes_solved += success and not self._solved
            self._solved |= success
            self._success = success
            self._ended = bool(terminated[0] or truncated[0])
            self._goal = target
            self._obs = None
            self.scene_step += 1
            self.total_steps += 1
            self._last_send = time.monotonic()
            return goal

    # ---------------------------------------------------------------------------------------- our tools
    @check_if_not_connected
    def reset_scene(self, seed: int | None = None) -> None:
        """Start a new scene (arm at home, objects re-placed; ``seed`` reseeds the scene generator)."""
        with self.lock:
            self._reset(seed)

    def task_success(self) -> bool:
        """Whether the scene's task is solved after the last ``send_action`` (False before any)."""
        return self._success

    @property
    def instruction(self) -> str:
        """The current scene's language instruction (e.g. "Pick up the red cube and lift it.")."""
        self._require_connected()
        return self._view.instructions[0]

    @property
    def view(self) -> LeRobotView:
        """The scene as our ``LeRobotView`` (one env): what the simulated leader's expert reads. Connected only."""
        self._require_connected()
        return self._view

    @property
    def control_dt(self) -> float:
        """Seconds of simulated time per ``send_action`` (1/30)."""
        self._require_connected()
        return self._view.control_dt

    # ------------------------------------------------------------------------------------------ internals
    def _require_connected(self) -> None:
        if self._view is None:
            raise ConnectionError(f"{self} is not connected. Run `.connect()` first.")

    def _reset(self, seed: int | None = None) -> None:
        view = self._view
        view.render_ids = False
        view.reset(seed=seed)
        self._goal = self._measured_robot_units()
        self._obs, self._success, self._ended, self._solved = None, False, False, False
        self.scene_index += 1
        self.scene_step = 0
        self._last_send = None
        log.info("%s: scene %d of %s (%s)", self, self.scene_index, self.config.task, view.instructions[0])

    def _reset_if_idle(self) -> None:
        """A new scene when more than ``idle_reset_s`` passed since the last ``send_action`` (module docstring).
        Only the gap from a ``send_action`` to the next ``get_observation`` counts: a control loop's own work between
        reading and acting (a slow policy) never resets the scene."""
        idle = self.config.idle_reset_s
        if idle is None or self._last_send is None:
            return
        gap = time.monotonic() - self._last_send
        if gap > idle:
            log.info("%s: %.2f s since the last action (> idle_reset_s %.2f): a new scene", self, gap, idle)
            self._reset()

    def _measured_robot_units(self) -> torch.Tensor:
        rad = self._view.arm.qpos(self._view.env.physics.state.qpos)[0].cpu()
        return features.deg_to_robot(so101.rad_to_deg(rad.double()).float(), self.gripper_range)

    def _present(self) -> dict[str, float]:
        """Present positions in robot units (what the follower reads back before capping a goal)."""
        return features.dict_from_vector(self._measured_robot_units())

    def _held_goal(self) -> torch.Tensor:
        """float32 [6] robot units: the goals last written (the pose at the scene's start before any)."""
        return self._goal
