"""LeRobot plugin: ``--teleop.type=so101_sim_leader``, a simulated SO-101 leader played by the scripted expert of
the ``so101_sim`` robot's task (``real.sim_teleop``).

LeRobot's CLIs import this distribution at start-up; the import registers the teleoperator's config class.
"""

from real.sim_teleop import SO101SimLeader, SO101SimLeaderConfig

__all__ = ["SO101SimLeader", "SO101SimLeaderConfig"]
