"""``robot-rl offline``: train a policy on a LeRobotDataset v3 on disk, with no simulator.

    robot-rl offline algo=bc|recap|awr dataset.root=DIR [steps=N] [max_minutes=M] [run_dir=DIR] [resume=RUN]

The dataset may be ours (``robot-rl collect``) or any LeRobotDataset v3 with SO-101-style features (recorded by
LeRobot's own tools). The policy is the flow-matching VLA (``policies.flow_vla``), sized from the dataset: its
cameras, state and action sizes, normalisation statistics and task vocabulary; its own settings are
``algo.policy.*``. Progress bar, TensorBoard, a learning curve, checkpoints that resume exactly (the data's
fingerprint is checked), and the exported policy in every checkpoint (``<run>/checkpoints/<it>/policy``), which
``robot-rl eval checkpoint=<run> task=<task>`` evaluates in simulation.

``algo=recap`` and ``algo=awr`` (``robot_rl.algos.recap``, ``robot_rl.algos.awr``) first fit a value model on every
frame and label the frames (``robot_rl.algos.advantages``: ``<run>/value``, the sidecar ``<run>/labels``; a resumed run
reuses them), then train the same policy for ``steps`` gradient steps: RECAP conditioned on the advantage indicator
(sampled with CFG β = ``algo.policy.guidance_beta``), AWR on a sampler that oversamples high-advantage frames. Both
need the dataset's ``next.success`` column and refuse a dataset without it before decoding anything. The dataset is
only read. What each learner adds to behaviour cloning is its entry in ``robot_rl.cli.offline_algos``.
"""

from __future__ import annotations

import datetime
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from robot_rl.cli.config import CheckpointSettings, resolve_device, typed
from robot_rl.cli.offline_algos import OFFLINE_ALGO_SPECS, OFFLINE_ALGOS
from robot_rl.logging import LoggerConfig


@dataclass
class OfflineSettings:
    """Top-level keys of configs/offline.yaml."""

    seed: int = 0
    device: str = "cpu"  # cpu | cuda | cuda:<i> | auto
    run_dir: str | None = None  # default: runs/offline_<algo>_<YYYYmmdd_HHMMSS>; on resume: the checkpoint's run
    resume: str | None = None  # a run or checkpoint folder to continue from, exactly
    # An exported policy (or a run / checkpoint folder) whose network weights start this training: fine-tuning, e.g.
    # the RECAP loop's next round from the last one. Its architecture must match; the normalisation statistics are
    # this dataset's; the optimizer and the schedule start afresh. Ignored on resume (the checkpoint holds weights).
    init_policy: str | None = None
    steps: int | None = 20_000  # gradient steps (None: only max_minutes)
    max_minutes: float | None = None  # wall-clock limit of the training (summed over resumes)
    updates_per_iteration: int = 100  # gradient steps between log points
    checkpoint_every: int = 10  # iterations between checkpoints (the last one is always saved)
    torch_threads: int = 2  # torch intra-op threads

    def __post_init__(self) -> None:
        if self.steps is None and self.max_minutes is None:
            raise ValueError("set steps or max_minutes: the run needs a stopping rule")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {self.torch_threads}")


def offline_schema() -> dict[str, Any]:
    """configs/offline.yaml's schema: the settings, the dataset, checkpoint and logger sections, and ``algo=``."""
    from robot_rl.cli.schemas import defaults_of

    return {**defaults_of(OfflineSettings), "dataset": dataset_schema(), "checkpoint": defaults_of(CheckpointSettings),
            "logger": defaults_of(LoggerConfig), "algo": None}


def dataset_schema() -> dict[str, Any]:
    """The ``dataset`` section's keys and defaults (``ChunkDatasetConfig``)."""
    from robot_rl.cli.schemas import defaults_of
    from robot_rl.data.lerobot_loader import ChunkDatasetConfig

    # horizon and history are the policy's (algo.policy.horizon); augmentation is the policy's own random shift
    # (algo.policy.random_shift), so the loader's is off by default here
    return {"root": None, **defaults_of(ChunkDatasetConfig, ("root", "horizon", "history")), "augment": False}


def offline_algo_schemas() -> dict[str, dict[str, Any]]:
    """configs/algo/<name>.yaml of the offline learners: the learner's keys and the policy's (sizes that the
    dataset decides left out)."""
    from omegaconf import OmegaConf

    from policies.flow_vla import FlowVLAConfig
    from robot_rl.algos.bc import BCConfig
    from robot_rl.algos.value_learning import ValueTrainConfig
    from robot_rl.cli.schemas import defaults_of
    from robot_rl.data.labels import LabelConfig
    from robot_rl.models.value import ValueConfig

    policy = defaults_of(FlowVLAConfig, DATA_SIZED)
    # instruction -> steps: the keys are the user's task strings, so this one map is open (struct off)
    policy["executed_steps_by_task"] = OmegaConf.create({}, flags={"struct": False})
    policy["temporal_ensemble_by_task"] = OmegaConf.create({}, flags={"struct": False})  # instruction -> m or None
    bc = {**defaults_of(BCConfig, ("total_updates",)), "policy": policy}
    advantages = {"value": {**defaults_of(ValueTrainConfig, ("model",)),
                            "model": defaults_of(ValueConfig, VALUE_SIZED)},
                  "labels": {**defaults_of(LabelConfig),  # instruction -> M: the user's task strings, an open map
                             "max_episode_length_by_task": OmegaConf.create({}, flags={"struct": False})}}
    schemas = {}
    for name, spec in OFFLINE_ALGO_SPECS.items():
        node = {"name": name, **bc, "policy": {k: v for k, v in policy.items() if k not in spec.policy_keys}}
        if spec.uses_advantages:
            node.update(advantages)
        if spec.section is not None:
            node[spec.section] = defaults_of(spec.config)
        schemas[name] = node
    return schemas


DATA_SIZED = ("cameras", "image_size", "state_dim", "action_dim")  # FlowVLAConfig fields the dataset decides
VALUE_SIZED = ("cameras", "image_size", "state_dim", "vocab")  # ValueConfig fields the dataset decides


@dataclass
class OfflineTraining:
    """A built ``robot-rl offline`` run."""

    config: dict[str, Any]
    settings: OfflineSettings
    sampler: Any
    algo: Any
    runner: Any
    logger: Any
    run_dir: Path


def build_policy(policy_raw: dict[str, Any], sampler: Any) -> Any:
    """The flow VLA sized from the dataset: its cameras, image size, state and action sizes, joint names,
    normalisation statistics and task vocabulary."""
    from policies import keys
    from policies.flow_vla import FlowVLAConfig, FlowVLAPolicy
    from policies.flow_vla.config import RELATIVE_STATS_KEY
    from policies.flow_vla.policy import relative_chunk_stats

    feats = sampler.features
    if not sampler.image_keys:
        raise ValueError(f"dataset {sampler.cfg.root}: no camera features ({keys.OBS_IMAGES}<camera>); the flow "
                         f"VLA needs at least one (features: {sorted(feats)})")
    img = feats[sampler.image_keys[0]][0]
    sized = {"cameras": [k[len(keys.OBS_IMAGES):] for k in sampler.image_keys],
             "image_size": [int(img[-2]), int(img[-1])], "state_dim": int(feats[keys.OBS_STATE][0][-1]),
             "action_dim": int(feats[keys.ACTION_COL][0][-1])}
    cfg = typed(FlowVLAConfig, {**policy_raw, **sized}, "algo.policy")
    stats = dict(sampler.stats)
    if cfg.relative_actions:  # the statistics of chunks relative to the joints, over the frames the sampler holds
        stats[RELATIVE_STATS_KEY] = relative_chunk_stats(sampler.state, sampler.action, sampler.ep_end, cfg.horizon)
    return FlowVLAPolicy.from_stats(stats, sampler.tasks, cfg, state_names=sampler.names[keys.OBS_STATE],
                                    action_names=sampler.names[keys.ACTION_COL])


def init_weights(policy: Any, path: str) -> None:
    """Copy the network weights of the policy exported at ``path`` (or a run / checkpoint folder's latest export)
    into ``policy``; its processor (this dataset's statistics) stays.

    Raises:
        ValueError: the policy there is of another type or its weights do not fit (names or shapes).
    """
    from policies.persistence import PROCESSOR_PREFIX
    from robot_rl.cli.deploy import load_any_policy

    source = load_any_policy(path, "cpu")
    if type(source) is not type(policy):
        raise ValueError(f"bad config: init_policy={path} is a {source.type_name!r} policy, this run trains a "
                         f"{policy.type_name!r} one")
    ours = {k: v for k, v in policy.state_dict().items() if not k.startswith(PROCESSOR_PREFIX)}
    theirs = {k: v for k, v in source.state_dict().items() if not k.startswith(PROCESSOR_PREFIX)}
    misfit = sorted(k for k in ours.keys() | theirs.keys()
                    if k not in ours or k not in theirs or ours[k].shape != theirs[k].shape)
    if misfit:
        raise ValueError(f"bad config: init_policy={path} does not fit this run's policy ({len(misfit)} weights "
                         f"differ in name or shape, e.g. {misfit[:3]}); it must have the same config and the "
                         f"dataset the same cameras, sizes and tasks")
    policy.load_state_dict({**policy.state_dict(), **theirs})


def build_offline(cfg: Any) -> OfflineTraining:
    """Build (and, with ``resume=``, restore) a ``robot-rl offline`` run from its composed config."""
    from omegaconf import OmegaConf

    from policies.flow_vla import FlowVLAConfig
    from robot_rl.algos.bc import BC, BCConfig
    from robot_rl.checkpoint import (
        CHECKPOINTS_DIR,
        CheckpointManager,
        check_new_run_dir,
        check_resume_compatible,
        load_checkpoint,
        remove_partial_writes,
    )
    from robot_rl.cli.build import seed_everything
    from robot_rl.data.lerobot_loader import ChunkDatasetConfig, ChunkSampler
    from robot_rl.logging import RunLogger
    from robot_rl.runners.offline import OfflineRunner, OfflineRunnerConfig

    full = OmegaConf.to_container(cfg, resolve=True)
    raw = json.loads(json.dumps(full))
    data_raw, algo_raw = raw.pop("dataset"), dict(raw.pop("algo"))
    ckpt_s = typed(CheckpointSettings, raw.pop("checkpoint"), "checkpoint")
    log_s = typed(LoggerConfig, raw.pop("logger"), "logger")
    s = typed(OfflineSettings, raw, "")
    algo_name = algo_raw.pop("name")
    if algo_name not in OFFLINE_ALGOS:
        raise ValueError(f"bad config: algo={algo_name!r} for robot-rl offline; allowed: {list(OFFLINE_ALGOS)}")
    spec = OFFLINE_ALGO_SPECS[algo_name]
    ckpt = load_checkpoint(s.resume) if s.resume else None
    if ckpt is not None and not data_raw.get("root"):  # resume=RUN alone: the data the run was trained on
        trained_on = ckpt.meta.get("config", {}).get("dataset", {})
        for key in ("root", "mix", "episodes"):
            if not data_raw.get(key) and trained_on.get(key):
                data_raw[key] = full["dataset"][key] = trained_on[key]  # and so in this run's records
                OmegaConf.update(cfg, f"dataset.{key}", trained_on[key], merge=False)
        if data_raw.get("root"):
            print(f"resume: dataset.root={data_raw['root']} (the run's)", file=sys.stderr)
    if not data_raw.get("root"):
        raise ValueError("bad config: dataset.root is required (a LeRobotDataset v3 folder)")
    device = resolve_device(s.device)
    seed_everything(s.seed)
    torch.set_num_threads(s.torch_threads)
    if ckpt is None and s.run_dir:  # before anything is decoded
        check_new_run_dir(s.run_dir)
    policy_raw = algo_raw.pop("policy", {})
    adv_cfg, algo_cfg = None, None  # settings and the outcome column checked before anything is decoded
    if spec.uses_advantages:
        from robot_rl.algos.advantages import AdvantageConfig

        adv_cfg = typed(AdvantageConfig, {"value": algo_raw.pop("value"), "labels": algo_raw.pop("labels")}, "algo")
    if spec.section is not None:
        algo_cfg = typed(spec.config, algo_raw.pop(spec.section), f"algo.{spec.section}")
    if spec.policy_overrides is not None:
        policy_raw = spec.policy_overrides(policy_raw)
    if adv_cfg is not None:
        from robot_rl.data.lerobot_loader import read_meta
        from robot_rl.data.outcomes import check_outcome_columns, check_success_recorded, outcome_columns

        metas = [read_meta(r) for r in [data_raw["root"], *(data_raw.get("mix") or [])]]
        check_outcome_columns(metas, adv_cfg.labels)
        check_success_recorded(metas, adv_cfg.labels)
        columns, fill = outcome_columns(metas, adv_cfg.labels)
        extra, filled = list(data_raw.get("extra_columns") or []), list(data_raw.get("fill_missing") or [])
        data_raw["extra_columns"] = extra + [c for c in columns if c not in extra]
        data_raw["fill_missing"] = filled + [c for c in fill if c not in filled]
    horizon = int(policy_raw.get("horizon", FlowVLAConfig.horizon))  # the chunks the policy learns to predict
    sampler = ChunkSampler(typed(ChunkDatasetConfig, {**data_raw, "horizon": horizon, "history": 1}, "dataset"))
    if adv_cfg is not None:  # outcomes that say nothing (no episode succeeds) are refused before any write
        from robot_rl.data.outcomes import check_some_success

        print(check_some_success(sampler, adv_cfg.labels), file=sys.stderr)
    pretrained = None  # a value model that does not fit: refused before any write (loaded once, used below)
    if adv_cfg is not None and adv_cfg.value.pretrained:
        from robot_rl.algos.value_learning import load_pretrained_value

        pretrained = load_pretrained_value(adv_cfg.value.pretrained, sampler, adv_cfg.labels, device)
    policy = build_policy(policy_raw, sampler)
    if s.init_policy and ckpt is None:
        init_weights(policy, s.init_policy)
    bc_cfg = typed(BCConfig, {**algo_raw, "total_updates": s.steps}, "algo")
    if ckpt is not None:
        run_dir = Path(s.run_dir) if s.run_dir else ckpt.path.parent.parent
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
        run_dir = Path(s.run_dir or f"runs/offline_{algo_name}_{stamp}")
    sources = [data_raw["root"], *(data_raw.get("mix") or [])]
    for root in sources if adv_cfg is not None else []:
        if run_dir.resolve().is_relative_to(Path(root).resolve()):
            raise ValueError(f"bad config: run_dir={run_dir} lies inside the dataset {root}; the value model and the "
                             "labels are written into the run folder and the dataset is never written to")
    remove_partial_writes(run_dir / CHECKPOINTS_DIR)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    meta = {"algo": algo_name, "policy_type": policy.type_name, "dataset_root": str(data_raw["root"]),
            "config": full, "init_policy": s.init_policy}
    if adv_cfg is not None:
        sampler, meta["labels"] = _advantage_sampler(algo_name, sampler, adv_cfg, algo_cfg, run_dir, device,
                                                    pretrained)
    algo = BC(policy, bc_cfg, device)
    runner_cfg = OfflineRunnerConfig(total_updates=s.steps, max_minutes=s.max_minutes,
                                     updates_per_iteration=s.updates_per_iteration,
                                     checkpoint_every=s.checkpoint_every)
    start = int(ckpt.meta.get("updates", 0)) if ckpt is not None else 0
    logger = RunLogger(run_dir, log_s, s.steps, start, config=full)
    runner = OfflineRunner(algo, sampler, runner_cfg, logger, CheckpointManager(run_dir / CHECKPOINTS_DIR,
                                                                                ckpt_s.keep_last), meta)
    if ckpt is not None:
        check_resume_compatible(ckpt.meta, runner.meta)
        runner.restore(ckpt)
        logger.truncate_curve(runner.iteration)
        print(f"resumed from {ckpt.path} at update {runner.updates}", file=sys.stderr)
    else:  # the points of a run that stopped here before its first checkpoint are not this run's
        logger.truncate_curve(0)
    return OfflineTraining(full, s, sampler, algo, runner, logger, run_dir)


def _advantage_sampler(algo_name: str, sampler: Any, adv_cfg: Any, algo_cfg: Any, run_dir: Path,
                       device: torch.device, pretrained: Any = None) -> tuple[Any, dict[str, Any]]:
    """The advantage stage (value model, labels, both reused on resume) and the sampler the policy then trains on,
    which the learner's table entry makes from the labels (e.g. RECAP's batches with the indicator, AWR's frames drawn
    by advantage weights). Returns it and a summary."""
    from robot_rl.algos.advantages import prepare_advantages

    def log(step: int, scalars: dict[str, float]) -> None:
        if step % 500 == 0 or step == adv_cfg.value.steps:
            print(f"value model: step {step}/{adv_cfg.value.steps}: " + ", ".join(
                f"{k} {v:.4f}" for k, v in scalars.items()), file=sys.stderr)

    labels, summary = prepare_advantages(sampler, adv_cfg, run_dir, device, log, pretrained, algo_name)
    summary = {**summary, "positive_fraction": labels.positive_fraction,
               "thresholds": {str(k): v for k, v in labels.thresholds.items()}}
    return OFFLINE_ALGO_SPECS[algo_name].labels_sampler(sampler, labels, algo_cfg), summary


def offline(cfg: Any) -> Path:
    """``robot-rl offline``: train, then say where the exported policy is."""
    from robot_rl.checkpoint import POLICY_DIR

    run = build_offline(cfg)
    try:
        run.runner.learn()
    finally:
        run.logger.close()
    latest = run.runner.checkpoints.latest()
    print(f"trained {run.runner.updates} gradient steps in {run.runner.elapsed_s:.1f} s on "
          f"{run.sampler.num_frames} frames ({run.sampler.num_episodes} episodes); exported policy: "
          f"{latest / POLICY_DIR if latest else None}; evaluate with: robot-rl eval checkpoint={run.run_dir} "
          f"task=<task>", file=sys.stderr)
    return run.run_dir

