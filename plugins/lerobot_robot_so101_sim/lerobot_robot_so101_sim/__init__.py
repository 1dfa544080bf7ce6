"""LeRobot plugin: ``--robot.type=so101_sim``, our simulated SO-101 follower (``real.sim_robot``).

LeRobot's CLIs import this distribution at start-up; the import registers the robot's config class.
"""

from real.sim_robot import SO101SimRobot, SO101SimRobotConfig

__all__ = ["SO101SimRobot", "SO101SimRobotConfig"]
