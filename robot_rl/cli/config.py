"""Typed schemas for the CLI's Hydra configs: YAML composes, these dataclasses check (key names and types)."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import MISSING

from robot_rl.runners.common import RunLimits
from sim.randomization import RandomizationConfig


@dataclass
class TrainSettings(RunLimits):
    """Top-level keys of configs/train.yaml: the run's limits (``RunLimits``: total_steps, max_minutes,
    checkpoint_every, stop_success_rate, success_window, seed) and where and how it runs."""

    device: str = "cpu"  # learner device: cpu | cuda | cuda:<i> | auto (the env keeps sim.device)
    run_dir: str | None = None  # default: runs/<task>_<algo>_<YYYYmmdd_HHMMSS>; on resume: the checkpoint's run
    resume: str | None = None  # a run folder or checkpoint folder to continue from, exactly
    torch_threads: int = 1  # torch intra-op threads (the simulator has its own, sim.num_threads); flashsac.yaml sets 2
    # torch threads during an on-policy update (algo=ppo), when the simulator is idle; None: every core this process
    # may use. On 2 cores PPO trained 1.11x (so101_reach) and 1.07x (humanoid_walk) as fast as with one thread
    # throughout, env.step unchanged (benchmarks/results/torch_threads.json).
    update_threads: int | None = None
    deterministic: bool = False  # torch.use_deterministic_algorithms(True): bitwise-reproducible CPU runs

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {self.torch_threads}")
        if self.update_threads is not None and self.update_threads < 1:
            raise ValueError(f"update_threads must be >= 1 or null, got {self.update_threads}")


@dataclass
class CheckpointSettings:
    keep_last: int = 3  # complete checkpoints kept besides the best (the cadence is checkpoint_every)

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError(f"checkpoint.keep_last must be >= 1, got {self.keep_last}")


@dataclass
class DemoDatasetSettings:
    """``demo_dataset.*`` of ``robot-rl train``: a LeRobotDataset v3 whose transitions an off-policy learner mixes into
    every batch (RLPD; FlashSAC's ``algo.demo_fraction``, 0.5). It needs the env's own observation and action,
    recorded by ``robot-rl collect env_state=true`` (``robot_rl.data.demo_buffer``); it is only read."""

    root: str | None = None  # the dataset folder (None: no demonstrations)
    max_episodes: int | None = None  # use the first this many episodes (None: all)
    timing_check: bool = True  # leave out episodes recorded with late ticks (robot_rl.data.timing)

    def __post_init__(self) -> None:
        if self.max_episodes is not None and self.max_episodes < 1:
            raise ValueError(f"demo_dataset.max_episodes must be >= 1, got {self.max_episodes}")


@dataclass
class RewardSettings:
    """``reward.*`` of ``robot-rl train``: dense rewards by potential-based shaping (``robot_rl.rewards``): each step's
    reward gets ``scale`` x (γ Φ(o') − Φ(o)), Φ a progress model trained with ``robot-rl progress`` on demos of the
    task (``progress``: its folder). It leaves the optimal policy unchanged (Ng et al. 1999) and tells the learner at
    every step whether it got closer; the success rate and the return reported stay the task's own."""

    progress: str | None = None  # a progress model folder (robot-rl progress run_dir=...); None: no shaping
    scale: float = 10.0  # λ: reward units per unit of progress (so101_reach's success pays 10, so101_lift's 20)

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"reward.scale must be > 0, got {self.scale}")


@dataclass
class HilSettings:
    """``hil.*`` of ``robot-rl train``: a person watching the training may take over (HIL-SERL). In simulation the
    task's scripted expert plays them (``hil.person=expert``), and ``hil.judge`` says when they step in:
    ``deadline`` (the default), from step ``after`` of an episode the policy has not finished, to its end, planning
    afresh (``robot_rl.hil.Deadline``); ``gap``, watching every step, where the policy's action strays from theirs
    (RMS over the action's dimensions, env units) by more than ``gap`` on ``patience`` consecutive steps, for
    ``hold`` steps (``robot_rl.hil.ActionGap``). Their transitions are tagged in the replay and make up RLPD's
    offline half (``algo.demo_fraction``), beside the demos of ``demo_dataset`` where given. The run's rolling
    success rate, return and ``stop_success_rate`` count only the episodes the policy drove alone. Off-policy
    learners only (algo=flashsac)."""

    person: str | None = None  # expert: the task's scripted expert plays the person; None: nobody takes over
    # when the person steps in: deadline | gap. On flashsac_demos' so101_lift (3 seeds) gap reached 80 % sooner (a
    # median 50k env steps vs 70k) but its take-overs never faded (the expert drove 65 % of the steps at 250k with
    # the policy at 100 % alone); deadline's fell to 17-23 %, a third of the expert's steps over the run
    judge: str = "deadline"
    after: int = 50  # deadline: steps of an episode the policy has alone
    gap: float = 0.5  # RMS action gap (actions in [-1, 1]) the person does not let pass
    patience: int = 5  # consecutive steps over the gap before they take over
    hold: int = 15  # steps a take-over lasts before control goes back to the policy
    quality: float = 1.0  # the scripted expert's quality (sim.experts: 1.0 as written, lower adds its flaws)

    def __post_init__(self) -> None:
        if self.person not in (None, "expert"):
            raise ValueError(f"hil.person must be null or 'expert' (the task's scripted expert), got {self.person!r}")
        if self.judge not in ("gap", "deadline"):
            raise ValueError(f"hil.judge must be 'gap' or 'deadline', got {self.judge!r}")
        if self.after < 0:
            raise ValueError(f"hil.after must be >= 0 steps, got {self.after}")
        if self.gap < 0 or self.patience < 1 or self.hold < 1:
            raise ValueError(f"need hil.gap >= 0, hil.patience >= 1 and hil.hold >= 1, got {self.gap}, "
                             f"{self.patience}, {self.hold}")
        if not 0.0 <= self.quality <= 1.0:
            raise ValueError(f"hil.quality must lie in [0, 1], got {self.quality}")


@dataclass
class EvalSettings:
    """Final evaluation: seeded episodes, a video from a camera."""

    enabled: bool = True
    num_episodes: int = 100  # episodes summarized
    num_envs: int = 50  # envs stepped together for them
    seed: int = 10000  # env.reset seed of the evaluation
    video: bool = True
    video_episodes: int = 5  # episodes filmed (env 0)
    camera: str = "front"
    width: int = 320  # px
    height: int = 240  # px

    def __post_init__(self) -> None:
        if self.num_episodes < 1 or self.num_envs < 1 or self.video_episodes < 1:
            raise ValueError("eval.num_episodes, eval.num_envs and eval.video_episodes must be >= 1")
        if self.width < 16 or self.height < 16:
            raise ValueError(f"eval.width and eval.height must be >= 16 px, got {self.width}x{self.height}")


@dataclass
class EvalCommand(EvalSettings):
    """configs/eval.yaml: ``robot-rl eval`` (the evaluation's fields are ``EvalSettings``')."""

    checkpoint: str = MISSING  # a run folder or checkpoint folder (required)
    out_dir: str | None = None  # default: <run folder>/eval_<checkpoint name>[_<task>, offline-trained][_2, _3, ...: the first free]
    device: str = "cpu"  # cpu | cuda | cuda:<i> | auto
    num_threads: int = 2  # simulator threads
    # task=<name> (configs/task/, task.<field>=... overrides it): the task to evaluate a policy trained offline on
    task: Any = None
    # domain randomization of the evaluation, e.g. randomization.light_scale=[0.5,1.2] (visual DR); the keys set here
    # (those that differ from the defaults, which randomize nothing) override the run's own
    randomization: RandomizationConfig = dataclasses.field(default_factory=RandomizationConfig)
    # a chunking policy's actions executed per chunk in this evaluation, for every task (None: the policy's own,
    # per task where it keeps them); recorded in eval.json
    executed_steps: int | None = None
    # ACT's temporal-ensembling coefficient for a chunking policy in this evaluation (None: the policy's own);
    # recorded in eval.json
    temporal_ensemble: float | None = None
    # a sampling policy's (the flow VLA's) sampled chunks averaged per observation in this evaluation (None: the
    # policy's own); recorded in eval.json
    mean_of_samples: int | None = None
    # how a sampling policy's sampled chunks become one in this evaluation ("mean", "median", "medoid"; None: the
    # policy's own); recorded in eval.json
    sample_reduction: str | None = None
    # action features a sampling policy reduces by the median of its sampled chunks in this evaluation (e.g.
    # [wrist_roll.pos,gripper.pos]; None: the policy's own); recorded in eval.json
    median_actions: list[str] | None = None


def typed(cls: type, values: dict[str, Any], where: str) -> Any:
    """``cls(**values)`` through OmegaConf's type checks; errors name the key, the value and what is allowed."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

    prefix = f"{where}." if where else ""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), OmegaConf.create(values))
        return OmegaConf.to_object(merged)
    except MissingMandatoryValue as e:  # a setting without a default that the command line did not give
        key = f"{prefix}{getattr(e, 'full_key', None) or getattr(e, 'key', None) or ''}"
        raise ValueError(f"{key} is required: give it on the command line ({key}=...)") from None
    except OmegaConfBaseException as e:  # wrong type or unknown key: name it and say what is allowed
        key = f"{prefix}{getattr(e, 'full_key', None) or getattr(e, 'key', None) or ''}"
        msg = str(e).splitlines()[0]
        if isinstance(e, ConfigKeyError):
            names = [f.name for f in dataclasses.fields(cls)]
            leaf = str(getattr(e, "key", None) or "")
            msg += f"{did_you_mean(leaf, names, prefix)}; allowed keys{' under ' + where if where else ''}: {names}"
        raise ValueError(f"bad config key {key}: {msg}") from None
    except ValueError as e:  # the dataclass's own validation names the key and the allowed values
        raise ValueError(f"bad config: {e}") from None


def changed_settings(old: dict[str, Any], new: dict[str, Any], free: Iterable[str] = ()) -> dict[str, tuple[Any, Any]]:
    """The settings (dotted keys, sorted) whose value differs between two composed configs, each as (old, new);
    keys under a top-level name in ``free`` are left out. A resumed run compares its saved config with this one."""
    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(d, dict) or not d:
            return {prefix: d}
        return {k: v for key, sub in d.items() for k, v in flat(sub, f"{prefix}.{key}" if prefix else key).items()}

    a, b, free = flat(old), flat(new), set(free)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and k.split(".")[0] not in free}


def did_you_mean(name: str, options: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean 'a' or 'b'?)`` for the options spelled like ``name`` (``prefix`` put before each), else ''."""
    close = difflib.get_close_matches(name, [str(o) for o in options], n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(prefix + c) for c in close)}?)" if close else ""


def explain_unknown_override(error: str, overrides: list[str], compose: Callable[[list[str]], Any],
                             usable: Callable[[str, str], bool] | None = None) -> str:
    """Hydra's "Could not override 'a.b'. To append to your config use +a.b=..." for a key the config does not have,
    as "unknown config key 'a.b' (did you mean 'a.c'?)" with the keys that stand there: the '+' Hydra suggests would
    only meet the schema's refusal next. ``compose(overrides)`` composes the command's config; other errors, and keys
    that do exist (Hydra refused the value), come back as they were. ``usable(group, choice)``: whether this command
    takes that choice of a config group (default: every one but the ``*_schema`` entries)."""
    from omegaconf import DictConfig

    group = re.search(r"Could not find '([^']+)/([^'/]+)'", error)
    if group is not None:  # an unknown choice of a config group (algo=bcc): its real choices, not the schemas
        name, choice = group.group(1), group.group(2)
        choices = [c for c in re.findall(r"^\t(\S+)$", error, re.MULTILINE) if not c.endswith("_schema")
                   and (usable is None or usable(name, c))]
        return f"unknown {name} {choice!r}{did_you_mean(choice, choices)}; the {name} choices are {choices}"
    m = re.match(r"Could not override '([^']+)'", error)
    if m is None:
        return error
    key = m.group(1)
    try:
        node = compose([o for o in overrides if o.lstrip("+~").split("=", 1)[0] != key])
    except Exception:  # noqa: BLE001 - another override is at fault too: Hydra's message stands
        return error
    parts, root = key.split("."), node
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth])
        if not isinstance(node, DictConfig):
            return f"unknown config key {key!r}: {where} is a value, not a group of keys"
        if part not in node:
            options = [str(k) for k in node]
            prefix = f"{where}." if where else ""
            # Nothing alike here: a key of that name elsewhere (eval.episodes given to `robot-rl eval`, whose
            # num_episodes stands at the top level).
            hint = did_you_mean(part, options, prefix) or _elsewhere(parts[-1], root)
            return f"unknown config key {key!r}{hint}; the keys under {where or 'the top level'} are {options}"
        node = node[part]
    return error


def _elsewhere(name: str, root: Any) -> str:
    """`` (did you mean 'x.y'?)`` for the keys anywhere under ``root`` whose last part is spelled like ``name``."""
    from omegaconf import DictConfig

    paths: dict[str, list[str]] = {}

    def walk(node: Any, prefix: str) -> None:
        for k in node:
            path = f"{prefix}{k}"
            paths.setdefault(str(k), []).append(path)
            child = node._get_node(k)  # not node[k]: a missing value (???) must not raise here
            if isinstance(child, DictConfig):
                walk(child, f"{path}.")

    walk(root, "")
    close = difflib.get_close_matches(name, list(paths), n=3, cutoff=0.6)
    found = [p for c in close for p in paths[c]][:3]
    return f" (did you mean {' or '.join(map(repr, found))}?)" if found else ""


def resolve_device(name: str) -> torch.device:
    """cpu | cuda | cuda:<i> | auto -> a device that exists here, else a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"bad config: device={name!r}; allowed: cpu, cuda, cuda:<index>, auto") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"bad config: device={name!r}; allowed: cpu, cuda, cuda:<index>, auto")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"bad config: device={name!r} but CUDA is not available here; use device=cpu (with sim=mjx "
                         "or sim=warp also sim.device=cpu, for tiny runs only)")
    return dev
