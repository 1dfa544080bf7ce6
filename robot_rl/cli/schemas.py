"""The typed schemas of ``robot-rl``'s configs, registered with Hydra's ConfigStore.

Every yaml in ``configs/`` starts from one of these (``defaults: [train_schema, ...]``, ``[ppo_schema]``,
``[so101_reach_schema]``, ``[sim_schema]``, ``[deploy_schema, ...]``, ``[so101_sim_schema]``), so every default lives
once, in a dataclass, each key is there to be overridden without Hydra's '+', and a misspelled key is refused at
composition, naming it. The groups' values are type-checked when they are built (``robot_rl.cli.config.typed`` and
the sim registry, against each algorithm's, task's and backend's own dataclass; LeRobot's parser for the robot and
teleoperator groups).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from robot_rl.cli.config import (
    CheckpointSettings,
    DemoDatasetSettings,
    EvalCommand,
    EvalSettings,
    HilSettings,
    RewardSettings,
    TrainSettings,
)
from robot_rl.logging import LoggerConfig
from robot_rl.remote.settings import RemoteSettings


@dataclass
class TrainSchema(TrainSettings):
    """configs/train.yaml: the run's settings, the checkpoint / evaluation / logger / demo_dataset / hil / reward sections,
    and the three groups chosen by name (``task=``, ``sim=``, ``algo=``)."""

    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    demo_dataset: DemoDatasetSettings = field(default_factory=DemoDatasetSettings)
    hil: HilSettings = field(default_factory=HilSettings)
    reward: RewardSettings = field(default_factory=RewardSettings)
    remote: RemoteSettings = field(default_factory=RemoteSettings)
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
    from robot_rl.cli.collect import CollectCommand

    cs.store(name="collect_schema", node=CollectCommand)
    from robot_rl.cli.actor import ActorCommand

    cs.store(name="actor_schema", node=ActorCommand)
    for name, node in algo_schemas().items():  # configs/algo/<name>.yaml start from algo/<name>_schema
        cs.store(group="algo", name=f"{name}_schema", node=node)
    for name, node in task_schemas().items():  # configs/task/<name>.yaml start from task/<name>_schema
        cs.store(group="task", name=f"{name}_schema", node=node)
    from robot_rl.cli.offline import offline_algo_schemas, offline_schema

    cs.store(name="offline_schema", node=offline_schema())
    for name, node in offline_algo_schemas().items():  # configs/algo/bc.yaml: the offline learners
        cs.store(group="algo", name=f"{name}_schema", node=node)
    from robot_rl.cli.deploy import DeployCommand
    from robot_rl.cli.progress import ProgressCommand
    from robot_rl.cli.recap import RecapCommand
    from robot_rl.cli.record import RecordCommand
    from robot_rl.cli.success import SuccessCommand

    cs.store(name="progress_schema", node=ProgressCommand)
    cs.store(name="recap_schema", node=RecapCommand)
    cs.store(name="deploy_schema", node=DeployCommand)
    cs.store(name="record_schema", node=RecordCommand)
    cs.store(name="success_schema", node=SuccessCommand)
    for group, options in device_schemas().items():  # configs/robot/<name>.yaml start from robot/<name>_schema
        for name, node in options.items():
            cs.store(group=group, name=f"{name}_schema", node=node)
    from sim.config import SimConfig
    from sim.randomization import RandomizationConfig

    cs.store(group="sim", name="sim_schema", node=defaults_of(SimConfig, ("randomization",)))
    cs.store(group="sim/randomization", name="none", node=defaults_of(RandomizationConfig))  # randomizes nothing
    _registered = True


def task_schemas() -> dict[str, dict[str, Any]]:
    """Each task's config tree with every default, from its dataclass (a nested robot description is its own
    group, ``task/robot``)."""
    import dataclasses

    from sim.registry import _tasks

    out = {}
    for name, (_, cfg_cls) in _tasks().items():
        nested = tuple(f.name for f in dataclasses.fields(cfg_cls)
                       if f.default_factory is not dataclasses.MISSING
                       and dataclasses.is_dataclass(f.default_factory()))
        out[name] = {"name": name, **defaults_of(cfg_cls, nested)}
    return out


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


def device_schemas() -> dict[str, dict[str, dict[str, Any]]]:
    """The ``robot`` and ``teleop`` groups of deploy / record: group -> option (``robot_rl.cli.deploy.DEVICE_GROUPS``)
    -> ``type`` and every field of that LeRobot device config class that has a default, with it (a required field,
    e.g. a real arm's ``port``, is the option's yaml to give). Plain dicts, not structured nodes: LeRobot's classes
    hold unions and camera registries OmegaConf cannot type; ``robot_rl.cli.deploy`` decodes them with LeRobot's own
    parser (draccus), which refuses a key the class does not have. Empty without LeRobot installed (the lerobot extra):
    then deploy and record cannot be composed, every other command can."""
    try:
        from robot_rl.cli.deploy import DEVICE_GROUPS, device_classes

        classes = {kind: device_classes(kind) for kind in DEVICE_GROUPS}
    except ImportError:
        return {}
    return {kind: {option: {"type": type_name, **defaults_of(classes[kind][type_name])}
                   for option, type_name in options.items()}
            for kind, options in DEVICE_GROUPS.items()}


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
