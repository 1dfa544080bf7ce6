"""``SO101SimLeaderConfig``: the simulated SO-101 leader, registered with LeRobot as ``--teleop.type=so101_sim_leader``
(kept apart from ``real/sim_teleop.py`` for LeRobot's device lookup; see ``real/config_sim_robot.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from lerobot.teleoperators.config import TeleoperatorConfig


@TeleoperatorConfig.register_subclass("so101_sim_leader")
@dataclass(kw_only=True)
class SO101SimLeaderConfig(TeleoperatorConfig):
    """The simulated person at an SO-101 leader arm: the scripted expert of the simulated robot's task."""

    quality: float = 1.0  # in [0, 1]: 1 the expert as written; lower mixes flawed episodes in (sim.experts)
    seed: int = 0  # seeds the expert's flaws and action noise
    # The --robot.id of the so101_sim robot to follow; None: the only so101_sim robot of this process.
    robot_id: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.quality <= 1.0:
            raise ValueError(f"teleop.quality must lie in [0, 1], got {self.quality}")
