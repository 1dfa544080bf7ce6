"""LeRobot plugin: ``--robot.type=so101_sim``, our simulated SO-101 follower (``real.sim_robot``).

LeRobot's CLIs import this distribution at start-up; the import registers the robot's config class.
It also makes LeRobot's calibration saves atomic (``real.calibration_file``: a kill mid-save leaves the old or
the new file, whole).
"""

from real import calibration_file
from real.sim_robot import SO101SimRobot, SO101SimRobotConfig

calibration_file.install()

__all__ = ["SO101SimRobot", "SO101SimRobotConfig"]
