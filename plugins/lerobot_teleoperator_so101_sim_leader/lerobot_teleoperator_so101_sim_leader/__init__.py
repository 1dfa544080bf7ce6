"""LeRobot plugin: ``--teleop.type=so101_sim_leader``, a simulated SO-101 leader played by the scripted expert of
the ``so101_sim`` robot's task (``real.sim_teleop``).

LeRobot's CLIs import this distribution at start-up; the import registers the teleoperator's config class.
It also makes LeRobot's calibration saves atomic (``real.calibration_file``: a kill mid-save leaves the old or
the new file, whole).
"""

from real import calibration_file
from real.sim_teleop import SO101SimLeader, SO101SimLeaderConfig

calibration_file.install()

__all__ = ["SO101SimLeader", "SO101SimLeaderConfig"]
