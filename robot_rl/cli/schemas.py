"""The typed schemas of ``robot-rl``'s configs, registered with Hydra's ConfigStore.

``configs/train.yaml`` and ``configs/eval.yaml`` start from these (``defaults: [train_schema, ...]``), so every
default lives once, in a dataclass, and a misspelled key is refused by Hydra at composition, naming it. The
``task``, ``sim`` and ``algo`` groups are typed when they are built (``robot_rl.cli.config.typed``, against each
task's, backend's and algorithm's own dataclass), where the group's choice decides the schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from robot_rl.cli.config import CheckpointSettings, EvalCommand, EvalSettings, TrainSettings
from robot_rl.logging import LoggerConfig


@dataclass
class TrainSchema(TrainSettings):
    """configs/train.yaml: the run's settings, the checkpoint / evaluation / logger sections, and the three
    groups chosen by name (``task=``, ``sim=``, ``algo=``)."""

    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    task: Any = None
    sim: Any = None
    algo: Any = None


_registered = False


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore (once per process)."""
    global _registered
    if _registered:
        return
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainSchema)
    cs.store(name="eval_schema", node=EvalCommand)
    for name, node in algo_schemas().items():  # configs/algo/<name>.yaml start from algo/<name>_schema
        cs.store(group="algo", name=f"{name}_schema", node=node)
    _registered = True


def algo_schemas() -> dict[str, dict[str, Any]]:
    """Each algorithm's config tree with every default, from its dataclasses: the learner's, its networks' (sizes
    that the env decides left out) and the runner's keys (``robot_rl.cli.build.ALGORITHMS``)."""
    from policies.gaussian import GaussianPolicyConfig
    from policies.tanh_gaussian import TanhGaussianPolicyConfig
    from robot_rl.algos.flashsac import FlashSACConfig
    from robot_rl.algos.ppo import PPOConfig
    from robot_rl.cli.build import ALGORITHMS
    from robot_rl.models.critics import CriticConfig
    from robot_rl.models.q_critics import CategoricalQConfig

    def runner(name: str) -> dict[str, Any]:
        entry = ALGORITHMS[name]
        return {k: v for k, v in defaults_of(entry.runner_config).items() if k in entry.runner_keys}

    return {
        "ppo": {"name": "ppo", **runner("ppo"), **defaults_of(PPOConfig),
                "policy": defaults_of(GaussianPolicyConfig, ("obs_dim", "action_dim")),
                "critic": defaults_of(CriticConfig, ("obs_dim", "obs_key"))},
        "flashsac": {"name": "flashsac", **runner("flashsac"), **defaults_of(FlashSACConfig),
                     "actor": defaults_of(TanhGaussianPolicyConfig, ("obs_dim", "action_dim")),
                     "critic": defaults_of(CategoricalQConfig, ("obs_dim", "action_dim", "obs_key", "num_bins",
                                                                "v_min", "v_max"))},
    }


def defaults_of(cls: type, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every field of a config dataclass that has a default, with it (fields without one are filled by a builder
    from the env, e.g. observation sizes)."""
    import dataclasses

    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out
