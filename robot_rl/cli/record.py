"""``robot-rl record``: teleoperated demonstrations into a LeRobotDataset v3, each episode saved as it ends.

    robot-rl record robot=so101 robot.port=/dev/ttyACM0 robot.id=my_arm teleop=so101_leader teleop.port=/dev/ttyACM1 \
        teleop.id=my_leader dataset.root=data/demos episodes=20 instruction="pick up the cube"
    robot-rl record robot=so101_sim robot.task=so101_pick teleop=so101_sim_leader dataset.root=data/sim_demos episodes=5

The person drives through the teleoperator; every command passes ``real.safety.SafetyFilter`` (the same limits as
deploy) and the command really sent is what is recorded (``action``; ``intervention`` is set: a person acted).
Episodes are written by ``robot_rl.data.recorder.EpisodeRecorder`` as each ends and committed, so a crash, Ctrl-C or
SIGTERM loses at most the episode being recorded; torque goes off before the dataset is finalised. Exit statuses as
``robot-rl deploy``'s (robot_rl/cli/deploy.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from robot_rl.cli.deploy import SessionSettings
from robot_rl.data.recorder import RecorderConfig


@dataclass
class RecordCommand(SessionSettings):
    """configs/record.yaml: ``robot-rl record`` (``robot`` and ``teleop`` are the groups chosen by name)."""

    episodes: int = 10  # episodes to record
    episode_s: float = 20.0  # s, an episode's time limit
    dataset: RecorderConfig = field(default_factory=RecorderConfig)
    robot: Any = None
    teleop: Any = None


def record(cfg: Any) -> Any:
    """``robot-rl record`` from a composed ``record`` config (module docstring). Returns the ``SessionResult``."""
    from omegaconf import OmegaConf

    from real.safety import SafetyFilter, limits_from_robot
    from real.teleop import AlwaysHuman, guarded_session
    from robot_rl.cli.config import typed
    from robot_rl.cli.deploy import (
        build_robot,
        build_teleop,
        check_dataset_root,
        connect_all,
        episode_mark,
        recorder_factory,
        run_guarded,
        session_kwargs,
        summary,
    )

    raw = OmegaConf.to_container(cfg, resolve=True)
    robot_raw, teleop_raw = raw.pop("robot"), raw.pop("teleop", None)
    c = typed(RecordCommand, raw, "")
    if not teleop_raw:
        raise ValueError("robot-rl record needs a teleoperator: teleop=<device> (configs/teleop/)")
    check_dataset_root(c.dataset.root, c.dataset.append)
    robot = build_robot(robot_raw)
    teleop = build_teleop(teleop_raw, robot)
    safety = SafetyFilter(c.safety, limits_from_robot(robot, c.safety.margin_deg))
    kwargs = session_kwargs(c, robot)
    mark = episode_mark(c)  # keys that cannot be read here fail before anything moves
    connect_all(robot, teleop, safety)
    make_recorder = recorder_factory(dataclasses.replace(c.dataset), c, robot, robot_raw["type"], kwargs["cameras"])

    def body() -> Any:
        try:
            return guarded_session(robot, safety, kwargs, c.episodes, teleop=teleop, takeover=AlwaysHuman(),
                                   make_recorder=make_recorder, stop_on_success=c.stop_on_success, seed=c.seed,
                                   mark=mark)
        finally:
            if mark is not None:
                mark.close()
            if getattr(teleop, "is_connected", False):
                teleop.disconnect()

    res = run_guarded("record", body)
    summary("record", res, c.dataset.root)
    return res
