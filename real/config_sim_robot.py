"""``SO101SimRobotConfig``: the simulated SO-101 follower, registered with LeRobot as ``--robot.type=so101_sim``.

Kept apart from ``real/sim_robot.py`` because LeRobot finds a third-party device by name from its config class:
``make_device_from_device_class`` strips ``Config`` (``SO101SimRobot``) and, for a config in ``<pkg>.config_<x>``,
looks in ``<pkg>.<x>`` (``real.sim_robot``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lerobot.robots.config import RobotConfig

TASKS = ("so101_reach", "so101_lift", "so101_push", "so101_pick")
CAMERAS = ("front", "wrist")


@RobotConfig.register_subclass("so101_sim")
@dataclass(kw_only=True)
class SO101SimRobotConfig(RobotConfig):
    """The simulated SO-101 follower: our MuJoCo arm and the scene of one task, stepped once per ``send_action``
    (the task's control period, 1/30 s), seen by two cameras rendered from the scene.

    Units as LeRobot's ``so101_follower`` with ``use_degrees=True``: body joints in degrees, the gripper 0..100
    (``real.features``). Physical parameters scale the model's nominal values (1.0: as trained by default);
    together with ``action_latency_steps`` they make a "real" arm that differs from the training simulator.
    """

    task: str = "so101_lift"  # the scene: so101_reach | so101_lift | so101_push | so101_pick
    camera_names: list[str] = field(default_factory=lambda: list(CAMERAS))  # of "front", "wrist"; [] for none
    image_height: int = 96  # px, every camera
    image_width: int = 128  # px, every camera
    seed: int = 0  # seeds the first scene; later scenes continue its generator (a seed fixes the whole sequence)
    # Like so101_follower: cap on |goal - present| per send_action, one value (degrees; gripper 0..100 units) or
    # one per motor name ({"shoulder_pan": 5.0, ...}); None: no cap beyond the simulated servo's own speed.
    max_relative_target: float | dict[str, float] | None = None
    # A get_observation more than this many seconds after the last send_action starts a new scene: what LeRobot's
    # recorders do between episodes (saving one) is a person resetting the scene. None: never. Measured with
    # lerobot-record at 30 fps (2 cameras, 128x96): inside its loop the gap is at most 0.025 s; saving a 1.5 s
    # episode takes 0.38-0.44 s, so the 0.5 s this was before missed it (CI, 2026-12-02).
    idle_reset_s: float | None = 0.2
    # Control steps after which the scene's task counts as timed out and the next send_action starts a new scene;
    # None: no time limit (LeRobot's episode_time_s bounds episodes).
    time_limit_steps: int | None = None
    friction_scale: float = 1.0  # x every geom's sliding friction
    mass_scale: float = 1.0  # x every body's mass and inertia
    damping_scale: float = 1.0  # x joint damping
    armature_scale: float = 1.0  # x joint armature (rotor inertia)
    actuator_gain_scale: float = 1.0  # x the position servos' kp
    action_latency_steps: int = 0  # control steps between send_action and the servos applying it
    # torch's intra-op threads, set at connect (the scene's tensors are tiny: on a few loaded cores a second thread
    # made a control step ~5x slower, 25 vs 4.6 ms); None leaves the process's setting alone
    torch_threads: int | None = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task not in TASKS:
            raise ValueError(f"robot.task={self.task!r}: so101_sim has the scenes {list(TASKS)}")
        bad = [c for c in self.camera_names if c not in CAMERAS]
        if bad or len(set(self.camera_names)) != len(self.camera_names):
            raise ValueError(f"robot.camera_names={self.camera_names}: distinct names of {list(CAMERAS)}")
        if self.image_height < 1 or self.image_width < 1:
            raise ValueError(f"robot.image_height/width must be >= 1 px, got {self.image_height}x{self.image_width}")
        if self.idle_reset_s is not None and self.idle_reset_s <= 0:
            raise ValueError(f"robot.idle_reset_s must be > 0 s or None, got {self.idle_reset_s}")
        if self.time_limit_steps is not None and self.time_limit_steps < 1:
            raise ValueError(f"robot.time_limit_steps must be >= 1 or None, got {self.time_limit_steps}")
        for name in ("friction_scale", "mass_scale", "damping_scale", "armature_scale", "actuator_gain_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"robot.{name} must be > 0, got {getattr(self, name)}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"robot.torch_threads must be >= 1 or None, got {self.torch_threads}")
        if self.action_latency_steps < 0:
            raise ValueError(f"robot.action_latency_steps must be >= 0, got {self.action_latency_steps}")
        cap = self.max_relative_target
        if isinstance(cap, dict):
            from sim.so101 import JOINT_NAMES

            if set(cap) != set(JOINT_NAMES) or not all(float(v) > 0 for v in cap.values()):
                raise ValueError(f"robot.max_relative_target as a dict needs a positive value for each of "
                                 f"{list(JOINT_NAMES)}, got {cap}")
        elif cap is not None and not float(cap) > 0:
            raise ValueError(f"robot.max_relative_target must be > 0 or None, got {cap}")
