"""Names to objects, for the CLI and the gymnasium adapter (the library itself passes built objects)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from robot_rl.env import VecEnv
from sim.config import SimConfig
from sim.env import MujocoFamilyEnv
from sim.task import Task


def _tasks() -> dict[str, tuple[type, type]]:
    from sim.tasks.humanoid_walk import HumanoidWalkConfig, HumanoidWalkTask
    from sim.tasks.so101_lift import LiftConfig, LiftTask
    from sim.tasks.so101_pick import PickConfig, PickTask
    from sim.tasks.so101_push import PushConfig, PushTask
    from sim.tasks.so101_reach import ReachConfig, ReachTask

    return {
        "so101_reach": (ReachTask, ReachConfig),
        "so101_lift": (LiftTask, LiftConfig),
        "so101_push": (PushTask, PushConfig),
        "so101_pick": (PickTask, PickConfig),
        "humanoid_walk": (HumanoidWalkTask, HumanoidWalkConfig),
    }


def _mujoco_physics(task: Task, cfg: SimConfig):
    from sim.mujoco_cpu import MujocoPhysics

    return MujocoPhysics(task.build_spec().compile(), cfg.num_envs, cfg.num_threads, cfg.randomization)


def _mjx_physics(task: Task, cfg: SimConfig):
    from sim.mjx import MjxPhysics

    return MjxPhysics(task.build_spec().compile(), cfg.num_envs, cfg.device, cfg.randomization)


def _warp_physics(task: Task, cfg: SimConfig):
    try:
        from sim.warp import WarpPhysics  # imports mujoco_warp: the optional ``warp`` extra
    except ModuleNotFoundError as e:
        raise ImportError(f"sim=warp needs MuJoCo Warp: pip install -e '.[warp]' ({e})") from e

    return WarpPhysics(task.build_spec().compile(), cfg.num_envs, cfg.device, cfg.randomization)


BACKENDS: dict[str, Callable[[Task, SimConfig], Any]] = {"mujoco": _mujoco_physics, "mjx": _mjx_physics,
                                                         "warp": _warp_physics}
ISAACLAB = "isaaclab"  # task=isaaclab with sim.backend=isaaclab: an Isaac Lab task through sim/isaaclab.py


def task_names() -> list[str]:
    return sorted(_tasks())


def task_config(name: str, overrides: dict[str, Any] | None = None) -> Any:
    """The typed config of a task, with overrides applied; unknown names and fields are clear errors."""
    tasks = _tasks()
    if name not in tasks:
        raise ValueError(f"unknown task {name!r}; available tasks: {sorted(tasks)}")
    cfg_cls = tasks[name][1]
    overrides = dict(overrides or {})
    fields = {f.name for f in dataclasses.fields(cfg_cls)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"task {name!r} has no option(s) {unknown}; its options are {sorted(fields)}")
    return cfg_cls(**overrides)


def make_task(name: str, cfg: Any | None = None) -> Task:
    tasks = _tasks()
    if name not in tasks:
        raise ValueError(f"unknown task {name!r}; available tasks: {sorted(tasks)}")
    task_cls, cfg_cls = tasks[name]
    return task_cls(cfg if cfg is not None else cfg_cls())


def make_env(task: str | Task, sim: SimConfig | None = None, task_cfg: Any | None = None) -> VecEnv:
    """Build a batched env: ``make_env("so101_lift", SimConfig(num_envs=64))``."""
    sim = sim or SimConfig()
    if ISAACLAB in (sim.backend, task):
        return _isaaclab_env(task, sim, task_cfg)
    if sim.backend not in BACKENDS:
        raise ValueError(f"unknown sim backend {sim.backend!r}; available backends: {sorted([*BACKENDS, ISAACLAB])}")
    task_obj = make_task(task, task_cfg) if isinstance(task, str) else task
    physics = BACKENDS[sim.backend](task_obj, sim)
    return MujocoFamilyEnv(task_obj, physics, sim)


def _isaaclab_env(task: Any, sim: SimConfig, cfg: Any) -> VecEnv:
    """``make_isaaclab_env`` from ``task=isaaclab`` (an ``IsaacLabTaskConfig``) and ``sim=isaaclab``."""
    from sim.isaaclab import IsaacLabTaskConfig, make_isaaclab_env
    from sim.randomization import RandomizationConfig

    if task != ISAACLAB or sim.backend != ISAACLAB:
        name = task if isinstance(task, str) else type(task).__name__
        raise ValueError(f"task={name} with sim={sim.backend}: Isaac Lab tasks need sim=isaaclab and sim=isaaclab runs "
                         "only them; use sim=isaaclab task=isaaclab task.id=<gymnasium id, e.g. Isaac-Cartpole>")
    if not isinstance(cfg, IsaacLabTaskConfig):
        raise TypeError(f"task=isaaclab needs an IsaacLabTaskConfig, got {type(cfg).__name__}")
    if sim.on_nonfinite_action != "raise" or sim.randomization != RandomizationConfig() or not sim.autoreset:
        raise ValueError("sim=isaaclab: sim.on_nonfinite_action must be 'raise', sim.autoreset true (Isaac Lab resets "
                         "ended envs itself) and sim.randomization empty (Isaac Lab randomizes through the task's own "
                         "event terms: set them with task.overrides)")
    return make_isaaclab_env(cfg.id, sim.num_envs, sim.device, cfg.overrides, sim.seed, cfg.launcher_args,
                             cfg.action_scale, cfg.success)


def config_from_dict(name: str, values: dict[str, Any]) -> Any:
    """Typed task config from a plain dict (Hydra's ``cfg.task`` minus ``name``), via OmegaConf's type checks."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    tasks = _tasks()
    if name == ISAACLAB:
        from sim.isaaclab import IsaacLabTaskConfig

        if values.get("id", "???") == "???":
            raise ValueError("task=isaaclab needs task.id=<a gymnasium id of isaaclab_tasks, e.g. Isaac-Cartpole>")
        schema = OmegaConf.structured(IsaacLabTaskConfig)
    elif name not in tasks:
        raise ValueError(f"unknown task {name!r}; available tasks: {sorted([*tasks, ISAACLAB])}")
    else:
        schema = OmegaConf.structured(tasks[name][1])
    try:
        return OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.create(values)))
    except (OmegaConfBaseException, ValueError, TypeError) as e:  # ValidationError / ConfigKeyError / MissingMandatoryValue name the key
        raise ValueError(f"bad config for task {name!r}: {e}") from None


def sim_config_from_dict(values: dict[str, Any]) -> SimConfig:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(OmegaConf.structured(SimConfig), OmegaConf.create(values))
        return OmegaConf.to_object(merged)
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        raise ValueError(f"bad sim config: {e}") from None
