"""LeRobot plugin: policy type ``robot_rl``, robot-rl's exported policies (flow VLA, Gaussian) in LeRobot's
deployment path (``real.lerobot_policy``; write a folder with ``python -m real.lerobot_policy.export``).

LeRobot's CLIs import this distribution at start-up; the import registers the policy's config class.
It also makes LeRobot's calibration saves atomic (``real.calibration_file``: a kill mid-save leaves the old or
the new file, whole).
"""

from real import calibration_file
from real.lerobot_policy import RobotRLConfig

calibration_file.install()

__all__ = ["RobotRLConfig"]
