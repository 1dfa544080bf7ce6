"""``SO101SimLeader``: a LeRobot ``Teleoperator`` (``--teleop.type=so101_sim_leader``) that plays the person at an
SO-101 leader arm from the scripted expert of the simulated robot's task (``sim.experts``).

It is tied to a simulated follower of the same process (``real.sim_robot.live_robots()``): on ``connect`` it
attaches to the ``so101_sim`` robot whose ``id`` is ``config.robot_id`` (or the only one), which may connect later
(LeRobot's scripts connect the teleoperator first). Each ``get_action`` watches the robot's current scene like a
person would (the expert reads the scene's observation) and answers the leader's joint positions in the follower's
action features and units (body degrees, gripper 0..100). A new scene on the robot starts a new expert episode.

    robot = SO101SimRobot(SO101SimRobotConfig(task="so101_lift"))
    leader = SO101SimLeader(SO101SimLeaderConfig())
    leader.connect(); robot.connect()
    robot.get_observation(); robot.send_action(leader.get_action())
"""

from __future__ import annotations

import weakref
from functools import cached_property
from typing import Any

from lerobot.teleoperators.teleoperator import Teleoperator
from lerobot.utils.decorators import check_if_already_connected, check_if_not_connected
from lerobot.utils.errors import DeviceNotConnectedError

from real import features
from real.config_sim_teleop import SO101SimLeaderConfig
from real.sim_robot import SO101SimRobot, live_robots


class SO101SimLeader(Teleoperator):
    """The simulated leader arm (module docstring)."""

    config_class = SO101SimLeaderConfig
    name = "so101_sim_leader"

    def __init__(self, config: SO101SimLeaderConfig) -> None:
        super().__init__(config)
        self.config = config
        self._robot: weakref.ref[SO101SimRobot] | None = None
        self._expert: Any = None
        self._expert_env: Any = None  # the env the expert was made for (a reconnected robot has a new one)
        self._episode = -1

    @cached_property
    def action_features(self) -> dict[str, type]:
        return dict.fromkeys(features.POS_FEATURES, float)

    @cached_property
    def feedback_features(self) -> dict[str, type]:
        return {}

    @property
    def is_connected(self) -> bool:
        return self._robot is not None and self._robot() is not None

    @property
    def is_calibrated(self) -> bool:
        return True

    def calibrate(self) -> None:
        """Nothing to calibrate."""

    def configure(self) -> None:
        """Nothing to configure."""

    @check_if_already_connected
    def connect(self, calibrate: bool = True) -> None:
        """Attach to the simulated follower (``config.robot_id``, or the only ``so101_sim`` robot).

        Raises:
            ConnectionError: no ``so101_sim`` robot exists in this process, none has that id, or several exist and
                ``robot_id`` does not say which.
        """
        robots = live_robots()
        if self.config.robot_id is not None:
            robots = [r for r in robots if r.id == self.config.robot_id]
        if not robots:
            which = f" with id {self.config.robot_id!r}" if self.config.robot_id is not None else ""
            raise ConnectionError(f"so101_sim_leader plays the person at a simulated SO-101 and found no so101_sim robot"
                                  f"{which} in this process: create one (--robot.type=so101_sim) before connecting")
        if len(robots) > 1:
            raise ConnectionError(f"so101_sim_leader: {len(robots)} so101_sim robots exist (ids "
                                  f"{[r.id for r in robots]}); say which with --teleop.robot_id=<its --robot.id>")
        self._robot = weakref.ref(robots[0])

    @property
    def robot(self) -> SO101SimRobot:
        """The simulated follower this leader plays for."""
        robot = self._robot() if self._robot is not None else None
        if robot is None:
            raise DeviceNotConnectedError("SO101SimLeader is not connected. Run `.connect()` first.")
        return robot

    @check_if_not_connected
    def get_action(self) -> dict[str, float]:
        """The leader's joint positions (``<motor>.pos``: body degrees, gripper 0..100): where the expert wants the
        follower's joints after this control step, from the robot's scene now.

        Raises:
            DeviceNotConnectedError: the simulated follower is not connected.
        """
        from sim.experts import make_expert

        robot = self.robot
        if not robot.is_connected:
            raise DeviceNotConnectedError(f"so101_sim_leader: its robot {robot} is not connected; connect it before "
                                          "asking for actions")
        with robot.lock:
            view = robot.view
            if self._expert is None or self._expert_env is not view.env:
                self._expert = make_expert(view.env, quality=self.config.quality, seed=self.config.seed)
                self._expert_env, self._episode = view.env, robot.scene_index
            elif self._episode != robot.scene_index:
                self._expert.reset()
                self._episode = robot.scene_index
            target_deg = view.to_target(self._expert.act(view.env_obs))  # float32 [1, 6] degrees
            return features.action_to_robot(target_deg[0], robot.gripper_range)

    def send_feedback(self, feedback: dict[str, Any]) -> None:
        """The simulated leader has no motors to drive: feedback is ignored."""

    @check_if_not_connected
    def disconnect(self) -> None:
        self._robot, self._expert, self._expert_env = None, None, None
