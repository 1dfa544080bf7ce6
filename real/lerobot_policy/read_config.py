"""Read the policy config of a local LeRobot ``pretrained_model`` folder without leaving a file behind.

LeRobot 0.6.1's ``PreTrainedConfig.from_pretrained`` strips the ``type`` tag from ``config.json``, writes the rest to a
``NamedTemporaryFile(delete=False)`` for draccus to parse and never removes it: every load leaves a ``/tmp/tmp*.json``
(246 had piled up on one of our machines after a few days of benchmarks). ``read_policy_config`` parses the same way,
from a temporary folder that is removed on return. LeRobot's own tools (``lerobot-eval``, ``lerobot-rollout``) still
go through theirs.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

CONFIG_NAME = "config.json"


def read_policy_config(path: str | Path) -> Any:
    """The ``PreTrainedConfig`` subclass instance saved in ``path/config.json`` (any registered policy type: ACT,
    Diffusion, ``robot_rl``, ...), as ``PreTrainedConfig.from_pretrained(path)`` returns it for a local folder."""
    import draccus
    import lerobot.policies  # noqa: F401 - registers LeRobot's policy config types ("act", "diffusion", ...)
    from lerobot.configs.policies import PreTrainedConfig

    import real.lerobot_policy  # noqa: F401 - registers ours ("robot_rl")

    path = Path(path)
    file = path / CONFIG_NAME
    if not file.is_file():
        raise FileNotFoundError(f"{path}: not a LeRobot pretrained_model folder (no {CONFIG_NAME})")
    raw = json.loads(file.read_text())
    policy_type = raw.pop("type", None)
    if policy_type is None:
        raise ValueError(f"{file}: no 'type' field, so the policy's config class is unknown")
    try:
        config_cls = PreTrainedConfig.get_choice_class(policy_type)
    except Exception as e:  # draccus raises its own error types for an unknown choice
        raise ValueError(f"{file}: policy type {policy_type!r} is not registered; known: "
                         f"{sorted(PreTrainedConfig.get_known_choices())}") from e
    with tempfile.TemporaryDirectory(prefix="robot_rl_config_") as tmp:
        untagged = Path(tmp) / CONFIG_NAME
        untagged.write_text(json.dumps(raw))
        with draccus.config_type("json"):
            return draccus.parse(config_cls, str(untagged), args=[])
