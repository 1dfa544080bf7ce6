"""LeRobot plugin: policy type ``robot_rl``, robot-rl's exported policies (flow VLA, Gaussian) in LeRobot's
deployment path (``real.lerobot_policy``; write a folder with ``python -m real.lerobot_policy.export``).

LeRobot's CLIs import this distribution at start-up; the import registers the policy's config class.
"""

from real.lerobot_policy import RobotRLConfig

__all__ = ["RobotRLConfig"]
