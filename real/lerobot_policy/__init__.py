"""Our exported policies as LeRobot policies (type ``robot_rl``): importing this package registers the config, so
LeRobot's factories find ``modeling_robot_rl.RobotRLPolicy`` and ``processor_robot_rl`` by their naming convention.
``export_for_lerobot`` (``real.lerobot_policy.export``) writes a folder ``--policy.path`` loads."""

from real.lerobot_policy.configuration_robot_rl import RobotRLConfig

__all__ = ["RobotRLConfig", "export_for_lerobot"]


def __getattr__(name: str):  # the exporter imports the model code: only when asked for
    if name == "export_for_lerobot":
        from real.lerobot_policy.export import export_for_lerobot

        return export_for_lerobot
    raise AttributeError(name)
