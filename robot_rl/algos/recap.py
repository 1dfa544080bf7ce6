"""RECAP (π*0.6's advantage-conditioned policy extraction) on logged LeRobot frames.

1. **Value.** A distributional value model (``robot_rl.models.value``) is fitted to every logged frame's value
   target (demos, autonomous rollouts, interventions alike): y = −(steps to success)/M, failures −1
   (``robot_rl.data.labels``).
2. **Labels.** Its predictions give N-step advantages A_t = Σ_{k<N} r_{t+k} + V(o_{t+N}) − V(o_t); the indicator
   I_t = 1[A_t ≥ the task's (1 − positive_fraction) quantile], forced to 1 on intervention frames. Value, advantage
   and indicator are written to a sidecar in the run folder, never into the dataset.
3. **Extraction.** The flow VLA is trained by plain behaviour cloning (``robot_rl.algos.bc.BC``) on batches that
   carry the indicator as its conditioning input (``policies.flow_vla.CONDITION_KEY``; the policy drops it with
   probability ``cond_dropout`` so it also learns the unconditional velocity) and samples with classifier-free
   guidance v = v_u + β (v_c − v_u), β = ``guidance_beta`` saved in its config: the exported policy needs no value
   model at run time.

AWR (``robot_rl.algos.awr``) shares steps 1-2 and oversamples high-advantage frames instead of conditioning.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policies import keys
from policies.flow_vla import CONDITION_KEY
from robot_rl.algos.guard import NonFiniteGuard, guarded_step
from robot_rl.algos.optim import adamw
from robot_rl.algos.precision import bf16_autocast, check_bf16
from robot_rl.data.labels import (
    LabelConfig,
    Labels,
    compute_labels,
    intervention_frames,
    max_length,
    read_sidecar,
    solved_frames,
    targets_for,
    write_sidecar,
)
from robot_rl.models.value import ValueConfig, ValueModel
from robot_rl.models.voc import success_auc, value_order_correlation

VALUE_DIR, LABELS_DIR = "value", "labels"  # inside the run folder
VALUE_TARGET = "value_target"  # batch key of the value model's targets


@dataclass
class ValueTrainConfig:
    """How the value model is fitted (``algo.value.*``); its architecture is ``algo.value.model.*``."""

    steps: int = 2000  # gradient steps
    batch_size: int = 64  # frames per step
    learning_rate: float = 3e-4  # AdamW
    weight_decay: float = 1e-4
    max_grad_norm: float = 1.0
    seed: int = 0  # the generator drawing its frames (the policy's sampler stream is left untouched)
    eval_batch_size: int = 256  # frames per forward pass when labelling
    # A value model folder saved by an earlier run (``<run>/value`` of ``robot-rl offline algo=recap|awr`` or of a
    # ``robot-rl recap`` round) to label this dataset with, instead of fitting one here: e.g. a model fitted once on
    # everything logged, labelling a subset. It must read this dataset's cameras, image size, state size and task
    # words, and have been fitted to the same targets (algo.labels.max_episode_length, fail_penalty); the fitting
    # settings above are then unused. Copied into this run's ``value`` folder, so the run stays self-contained.
    pretrained: str | None = None
    # bf16 autocast of each update's forward pass, as ``algo.bf16`` for the policy (refused where the hardware would
    # emulate it); the logits' softmax and the loss stay float32.
    bf16: bool = False
    model: ValueConfig = field(default_factory=ValueConfig)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("value steps, batch_size and eval_batch_size must be >= 1")
        if self.learning_rate <= 0 or self.max_grad_norm <= 0:
            raise ValueError("value learning_rate and max_grad_norm must be > 0")


@dataclass
class RecapConfig:
    """How RECAP's extraction draws its frames (``algo.recap.*``)."""

    # Share of each batch drawn from frames with a positive indicator; None: as they come (π*0.6's recipe). With
    # few good frames in the data, the conditional velocity v_c sees them rarely at a fixed number of gradient steps
    # (benchmarks/recap.py: the expert's frames were 10 % of the mixed so101_lift data); 0.5 shows v_c and v_u
    # (the negatives and the dropped indicators) equally often. The indicator is still the input: the negatives
    # are learned as such, not thrown away as AWR's sampler nearly does.
    positive_share: float | None = None

    def __post_init__(self) -> None:
        if self.positive_share is not None and not 0.0 < self.positive_share < 1.0:
            raise ValueError(f"recap positive_share must be in (0, 1) or null, got {self.positive_share}")


def indicator_weights(indicator: np.ndarray, positive_share: float) -> torch.Tensor:
    """Per-frame sampling weights [F] float64 under which a draw is a positive frame with probability
    ``positive_share`` (uniform within the positives and within the negatives). Where every frame has the same
    indicator the weights are uniform.

    Example: indicator [1, 0, 0, 0], share 0.5 -> [0.5, 1/6, 1/6, 1/6].
    """
    pos = np.asarray(indicator).reshape(-1).astype(bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return torch.full((len(pos),), 1.0 / max(len(pos), 1), dtype=torch.float64)
    w = np.where(pos, positive_share / n_pos, (1.0 - positive_share) / n_neg)
    return torch.from_numpy(w.astype(np.float64))


@dataclass
class AdvantageConfig:
    """What RECAP and AWR share: the value model's training and the labels."""

    value: ValueTrainConfig = field(default_factory=ValueTrainConfig)
    labels: LabelConfig = field(default_factory=LabelConfig)


# ------------------------------------------------------------------------------------------- value learner
class ValueLearner:
    """Fits a ``ValueModel`` by cross-entropy to per-frame targets, on frames drawn uniformly from a sampler's rows
    with its own generator (``sampler.batch(rows)``).

    Args:
        model: the value model (statistics set).
        cfg: the training settings.
        device: where it trains.
    """

    def __init__(self, model: ValueModel, cfg: ValueTrainConfig, device: torch.device | str = "cpu") -> None:
        self.model, self.cfg, self.device = model.to(device), cfg, torch.device(device)
        check_bf16(cfg.bf16, self.device, "algo.value.bf16")
        self.optimizer = adamw(model.parameters(), cfg.learning_rate, cfg.weight_decay, self.device)
        self.guard = NonFiniteGuard(10)
        self.updates = 0

    def update(self, batch: dict[str, Any], target: torch.Tensor) -> dict[str, float]:
        """One AdamW step on a frame batch and its targets [B] (value units)."""
        self.model.train()
        with bf16_autocast(self.cfg.bf16, self.device):
            loss, metrics = self.model.loss(batch, target)
        self.updates += 1
        grad_norm = guarded_step(self.optimizer, self.model.parameters(), loss, self.cfg.max_grad_norm, self.guard)
        if grad_norm is None:
            return {"nonfinite_skips": float(self.guard.skipped)}
        return {**metrics, "value/grad_norm": float(grad_norm)}

    def fit(self, sampler: Any, targets: torch.Tensor, log: Callable[[int, dict[str, float]], None] | None = None,
            log_every: int = 100) -> dict[str, float]:
        """``cfg.steps`` updates on the sampler's rows with ``targets`` [num_frames]; the last log window's means."""
        gen = torch.Generator().manual_seed(self.cfg.seed)
        window: dict[str, float] = {}
        count = 0
        for step in range(self.cfg.steps):
            rows = torch.randint(0, sampler.num_frames, (self.cfg.batch_size,), generator=gen)
            for k, v in self.update(value_frames(self.model, sampler, rows), targets[rows]).items():
                window[k] = window.get(k, 0.0) + v
            count += 1
            if (step + 1) % log_every == 0 or step + 1 == self.cfg.steps:
                means = {k: v / count for k, v in window.items()}
                if log is not None:
                    log(step + 1, means)
                if step + 1 < self.cfg.steps:
                    window, count = {}, 0
        return {k: v / max(count, 1) for k, v in window.items()}


def value_frames(model: ValueModel, sampler: Any, rows: torch.Tensor) -> dict[str, Any]:
    """A sampler's frames ``rows`` as the value model reads them: with the joints' earlier readings
    (``keys.OBS_STATE_LAGS``) where it reads them (``state_lags``)."""
    frame = sampler.batch(rows)
    if model.cfg.state_lags:
        frame[keys.OBS_STATE_LAGS] = sampler.state_lags(rows, model.cfg.state_lags)
    return frame


@torch.no_grad()
def predict_values(model: ValueModel, sampler: Any, batch_size: int = 256) -> np.ndarray:
    """V(o) of every row of the sampler [num_frames] (eval mode, no augmentation)."""
    model.eval()
    out = np.empty(sampler.num_frames, dtype=np.float32)
    augment = sampler.cfg.augment
    sampler.cfg.augment = False
    try:
        for s in range(0, sampler.num_frames, batch_size):
            rows = torch.arange(s, min(s + batch_size, sampler.num_frames))
            out[s:s + len(rows)] = model.value(value_frames(model, sampler, rows)).cpu().numpy()
    finally:
        sampler.cfg.augment = augment
    return out


def save_value_model(model: ValueModel, folder: Path, meta: dict[str, Any]) -> Path:
    """The model as a checkpoint folder (safetensors + JSON, atomic): weights, its config and ``meta``."""
    from robot_rl.checkpoint import write_checkpoint

    return write_checkpoint(folder, {"model": model.state_dict()}, {**meta, "value_config": asdict(model.cfg)})


def load_value_model(folder: str | Path, device: torch.device | str = "cpu") -> tuple[ValueModel, dict[str, Any]]:
    """A model saved by ``save_value_model`` and its meta (no pickle: safetensors + JSON)."""
    from robot_rl.checkpoint import load_checkpoint

    ckpt = load_checkpoint(folder)
    model = ValueModel(ValueConfig(**ckpt.meta["value_config"]))
    model.load_state_dict(ckpt.state["model"])
    return model.to(device).eval(), ckpt.meta


# ------------------------------------------------------------------------------------------- the stage
def check_outcome_columns(metas: Any, labels: LabelConfig | None = None) -> None:
    """Refuse data whose outcomes ``labels`` cannot read (by default each dataset's ``next.success`` column) before
    anything is decoded or trained. ``metas``: one dataset's metadata, or a mix's (root first; episodes numbered
    as ``episode_offsets`` numbers them).

    Raises:
        ValueError: naming the dataset and column, and how to label the outcomes instead.
    """
    from robot_rl.data.lerobot_loader import numbered_episodes

    metas = metas if isinstance(metas, list) else [metas]
    labels = labels or LabelConfig()
    if labels.named_episodes is not None:
        name, listed = labels.named_episodes
        held = set(numbered_episodes(metas).tolist())
        outside = sorted(set(listed) - held)
        if outside:
            where = f"dataset {metas[0].root}" + (" and the mixed ones" if len(metas) > 1 else "")
            raise ValueError(f"algo.labels.{name} lists episodes {outside} that {where} does not hold "
                             f"(it has {len(held)}: {min(held, default=None)}..{max(held, default=None)})")
        return
    col = labels.success_column
    for meta in metas:
        if col in meta.features:
            continue
        hint = ""
        if col == keys.SUCCESS_COL and keys.REWARD_COL in meta.features:
            hint = (f" This dataset has {keys.REWARD_COL!r}: LeRobot's HIL-SERL recorder (gym_manipulator) writes 1.0 "
                    f"there on the frame success is flagged, and algo.labels.success_column={keys.REWARD_COL} reads "
                    f"success from it (frames >= algo.labels.success_threshold).")
        raise ValueError(
            f"dataset {meta.root} has no {col!r} column: RECAP and AWR need each episode's outcome (per frame, true "
            f"from the frame the task is solved, as lerobot-eval writes {keys.SUCCESS_COL!r}).{hint} Record with "
            f"`robot-rl collect` (it writes {keys.SUCCESS_COL!r} and {keys.INTERVENTION_COL!r}), name the episodes "
            f"that succeeded with algo.labels.successful_episodes=[...] or those that failed with "
            f"algo.labels.failed_episodes=[...] (a success is solved on its last frame), or add the "
            f"column to a copy of the dataset with lerobot.datasets.dataset_tools.add_features(dataset, "
            f"features={{{keys.SUCCESS_COL!r}: (values, {{'dtype': 'bool', 'shape': (1,), 'names': None}})}}, "
            f"output_dir=NEW_DIR); algo=bc needs no outcomes")


def check_some_success(sampler: Any, labels: LabelConfig) -> str:
    """Refuse frames in which no episode succeeds, as ``labels`` reads the outcomes: every value target would be -1
    and the advantages noise. The usual cause is a recording from a real arm, which cannot report success (our
    deploy and record write ``next.success`` false throughout there). Returns a one-line summary of the outcomes
    read (successes, episodes with corrections), for the user to check their labelling against.

    Raises:
        ValueError: naming the column read and how to name the successful episodes instead.
    """
    cols = _frame_table(sampler)
    solved = solved_frames(cols, labels)
    if solved.any():
        eps = cols["episode_index"].reshape(-1)
        n_eps, n_ok = len(np.unique(eps)), len(np.unique(eps[solved]))
        how = (f"algo.labels.{labels.named_episodes[0]}" if labels.named_episodes is not None else
               f"{labels.success_column} >= {labels.success_threshold:g}")
        line = f"outcomes: {n_ok} of {n_eps} episodes succeed ({how})"
        inter = intervention_frames(cols, labels)
        if inter is not None:
            line += f"; {len(np.unique(eps[inter]))} with {labels.intervention_column} frames"
        if labels.max_episode_length is None:  # M scales every value: the longest episode stands in for the task's
            # time limit, so that episode's first frame is valued -1 like a failure's (robot-rl recap passes the task's)
            line += (f"; value scale M = {max_length(eps, None)} frames, the longest episode (set "
                     f"algo.labels.max_episode_length to the task's time limit)")
        return line
    what = (f"algo.labels.{labels.named_episodes[0]} leaves none" if labels.named_episodes is not None else
            f"{labels.success_column!r} is never >= {labels.success_threshold} in its {sampler.num_episodes} "
            f"episodes")
    raise ValueError(_no_success(sampler.cfg.root, what))


def check_success_recorded(metas: Any, labels: LabelConfig) -> None:
    """Before anything is decoded: refuse datasets whose success column is never solved in any episode (read from
    the data files alone). ``check_some_success`` checks the frames actually loaded later (an episode subset, named
    episodes); this catches the common case (a real arm's recording) without decoding its videos first.

    Raises:
        ValueError: as ``check_some_success``.
    """
    from robot_rl.data.lerobot_format import read_frames

    if labels.named_episodes is not None:
        return
    col, episodes = labels.success_column, 0
    for m in metas:
        if col not in m.features:
            continue
        eps = np.asarray(m.episodes["episode_index"], dtype=np.int64)
        episodes += len(eps)
        values = read_frames(m, eps, [col]).columns[col].astype(np.float64)
        if (values >= labels.success_threshold).any():
            return
    raise ValueError(_no_success(metas[0].root, f"{col!r} is never >= {labels.success_threshold} in its {episodes} "
                                                f"episodes"))


def _no_success(root: Any, what: str) -> str:
    return (f"no episode of dataset {root} succeeds ({what}): RECAP and AWR learn from the difference between "
            f"successes and failures. A real arm cannot report success: name the episodes that succeeded with "
            f"algo.labels.successful_episodes=[...] or those that failed with algo.labels.failed_episodes=[...] (a "
            f"success is solved on its last frame); algo=bc needs no outcomes")


def outcome_columns(metas: Any, labels: LabelConfig | None = None) -> tuple[list[str], list[str]]:
    """(the extra columns the labels read, those of them some dataset of a mix may lack): the success column (none
    with outcomes named by episode) and, where any dataset has it, the intervention column, read as no correction
    (False) in a dataset without it (e.g. lerobot-record demos beside a DAgger rollout)."""
    metas = metas if isinstance(metas, list) else [metas]
    labels = labels or LabelConfig()
    cols = [] if labels.named_episodes is not None else [labels.success_column]
    have = [labels.intervention_column in m.features for m in metas]
    if any(have):
        cols.append(labels.intervention_column)
    return cols, ([labels.intervention_column] if any(have) and not all(have) else [])


def value_config_for(sampler: Any, base: ValueConfig) -> ValueConfig:
    """``base`` sized to a sampler's data: its cameras, image size and state size."""
    import dataclasses

    if not sampler.image_keys:
        raise ValueError(f"dataset {sampler.cfg.root}: no camera features; the value model reads images")
    img = sampler.features[sampler.image_keys[0]][0]
    return dataclasses.replace(base, cameras=[k[len(keys.OBS_IMAGES):] for k in sampler.image_keys],
                               image_size=[int(img[-2]), int(img[-1])],
                               state_dim=int(sampler.features[keys.OBS_STATE][0][-1]))


def target_settings(labels: LabelConfig) -> dict[str, Any]:
    """The label settings that fix a value model's targets (and so the scale of its values): M and C."""
    return {"max_episode_length": labels.max_episode_length, "fail_penalty": labels.fail_penalty}


def load_pretrained_value(folder: str | Path, sampler: Any, labels: LabelConfig,
                          device: torch.device | str = "cpu") -> tuple[ValueModel, dict[str, Any], str]:
    """``algo.value.pretrained``: a value model saved by an earlier run, checked against the data it is to label
    (``sampler``: the model's cameras present at its image size, its state size, every word of the instructions in
    its vocabulary) and against the targets the labels assume here (M and C as ``labels`` resolves them on this
    data: the scale of the values the N-step advantage adds to rewards). Returns the model, its saved meta and the
    sha256 of its manifest (its content's name).

    Raises:
        ValueError: no value model in ``folder``, or one that does not fit, naming every difference.
    """
    from policies.flow_vla.encoders import split_words
    from robot_rl.checkpoint import MANIFEST
    from robot_rl.data.labels import max_length

    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise ValueError(f"algo.value.pretrained={folder}: no value model there (expected the 'value' folder of an "
                         f"earlier `robot-rl offline algo=recap|awr` run, holding {MANIFEST})")
    model, meta = load_value_model(folder, device)
    digest = hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest()
    problems = []
    m = max_length(np.asarray(sampler.columns()["episode_index"]), labels.max_episode_length)
    here = (float(m), float(m if labels.fail_penalty is None else labels.fail_penalty))
    m_src = meta.get("max_episode_length")
    c_src = ((meta.get("settings") or {}).get("targets") or {}).get("fail_penalty")
    fitted = None if m_src is None else (float(m_src), float(m_src if c_src is None else c_src))
    if fitted != here:
        problems.append(f"it was fitted to targets with (M, C) = {fitted} frames and this data's labels use {here} "
                        "(set algo.labels.max_episode_length and algo.labels.fail_penalty to the model's)")
    for cam in model.cfg.cameras:
        feature = sampler.features.get(keys.lerobot_image_key(cam))
        if feature is None:
            problems.append(f"it reads camera {cam!r}, which the dataset lacks")
        elif [int(d) for d in feature[0][-2:]] != list(model.cfg.image_size):
            problems.append(f"it reads {cam!r} at {model.cfg.image_size} pixels, the dataset has "
                            f"{[int(d) for d in feature[0][-2:]]}")
    state_dim = int(sampler.features[keys.OBS_STATE][0][-1])
    if state_dim != model.cfg.state_dim:
        problems.append(f"it reads {model.cfg.state_dim} state values, the dataset has {state_dim}")
    unknown = sorted({w for task in sampler.tasks for w in split_words(task)} - set(model.cfg.vocab))
    if unknown:
        problems.append(f"the dataset's instructions hold words it was never trained on: {unknown[:10]}")
    if problems:
        raise ValueError(f"algo.value.pretrained={folder} cannot label {sampler.cfg.root}: " + "; ".join(problems))
    return model, meta, digest


def _frame_table(sampler: Any) -> dict[str, np.ndarray]:
    cols = {k: v.numpy() for k, v in sampler.columns().items() if k not in (keys.OBS_STATE, keys.ACTION_COL)}
    cols["task_index"] = np.asarray(sampler.task_index)
    return cols


def prepare_advantages(sampler: Any, cfg: AdvantageConfig, run_dir: Path, device: torch.device,
                       log: Callable[[int, dict[str, float]], None] | None = None,
                       pretrained: tuple[ValueModel, dict[str, Any], str] | None = None,
                       name: str = "recap") -> tuple[Labels, dict[str, Any]]:
    """Fit the value model on every frame of ``sampler`` (or take ``cfg.value.pretrained``'s), label them, and write
    ``<run_dir>/value`` and the sidecar ``<run_dir>/labels``. Either is reused when it exists for the same data
    (fingerprint) and settings, so a resumed run skips the stages it finished; the value model only needs the same
    value settings and targets (M, C), so a relabelling (another N or positive fraction) reuses it. Returns the labels
    and a summary (timings, VOC, AUC). ``pretrained``: ``load_pretrained_value``'s result for
    ``cfg.value.pretrained`` when the caller has already loaded (and so checked) it; ``name``: the algorithm, which
    starts its log lines."""
    fingerprint = sampler.fingerprint()
    targets_cfg = target_settings(cfg.labels)
    if not cfg.value.pretrained:
        pretrained = None
    elif pretrained is None:  # checked first: a model that does not fit fails before anything is written
        pretrained = load_pretrained_value(cfg.value.pretrained, sampler, cfg.labels, device)
    if pretrained is not None:
        # named by its content, not its path: another model saved at the same path is not mistaken for this one
        value_fields: dict[str, Any] = {"pretrained_manifest_sha256": pretrained[2]}
    else:
        value_fields = asdict(cfg.value)
    settings = {"value": value_fields, "labels": asdict(cfg.labels)}
    value_settings = {"value": value_fields, "targets": targets_cfg}
    summary: dict[str, Any] = {}
    success_col = keys.SUCCESS_COL
    cols = _frame_table(sampler)
    cols[success_col] = solved_frames(cols, cfg.labels)  # the outcome as cfg.labels reads it, whatever the column
    inter = intervention_frames(cols, cfg.labels)  # corrections as cfg.labels reads them (0/1 or bool)
    inter_col = None if inter is None else keys.INTERVENTION_COL
    if inter is not None:
        cols[inter_col] = inter
    labels_dir, value_dir = run_dir / LABELS_DIR, run_dir / VALUE_DIR
    if (labels_dir / "labels.json").is_file():
        labels, meta = read_sidecar(labels_dir)
        if meta.get("dataset") == fingerprint and meta.get("settings") == settings:
            print(f"{name}: reusing the labels in {labels_dir}", file=sys.stderr)
            return labels, meta.get("summary", {})
    targets, max_len = targets_for(cols, success_col, cfg.labels)
    model = None
    if (value_dir / "manifest.json").is_file():
        model, meta = load_value_model(value_dir, device)
        if meta.get("dataset") != fingerprint or meta.get("settings") != value_settings:
            model = None
        else:
            print(f"{name}: reusing the value model in {value_dir}", file=sys.stderr)
    if model is None and pretrained is not None:
        model, source_meta, digest = pretrained
        summary["value_pretrained"] = {"path": str(cfg.value.pretrained), "manifest_sha256": digest,
                                       "fitted_on_dataset": source_meta.get("dataset")}
        save_value_model(model, value_dir, {"dataset": fingerprint, "settings": value_settings,
                                            "max_episode_length": max_len, "pretrained": summary["value_pretrained"]})
        print(f"{name}: labelling with the pretrained value model {cfg.value.pretrained}", file=sys.stderr)
    elif model is None:
        start = time.perf_counter()
        model = ValueModel.from_stats(sampler.stats, sampler.tasks, value_config_for(sampler, cfg.value.model))
        learner = ValueLearner(model, cfg.value, device)
        final = learner.fit(sampler, torch.from_numpy(targets), log)
        summary["value_train_s"] = round(time.perf_counter() - start, 2)
        summary["value_final"] = final
        save_value_model(model, value_dir, {"dataset": fingerprint, "settings": value_settings,
                                            "max_episode_length": max_len})
    start = time.perf_counter()
    values = predict_values(model, sampler, cfg.value.eval_batch_size)
    labels = compute_labels(cols, values, success_col, cfg.labels, inter_col)
    summary["label_s"] = round(time.perf_counter() - start, 2)
    summary.update(value_scores(labels, cols[success_col]))
    write_sidecar(labels, labels_dir, {"dataset": fingerprint, "settings": settings, "summary": summary})
    print(f"{name}: labelled {len(values)} frames: {labels.positive_fraction:.2f} positive "
          f"({int(labels.intervention.sum())} correction frames), value MAE {summary['value_mae']:.3f}, "
          f"VOC {summary['voc']:.3f}, success AUC {summary['success_auc']:.3f}", file=sys.stderr)
    return labels, summary


def value_scores(labels: Labels, success: np.ndarray) -> dict[str, float]:
    """On the frames labelled: VOC on successful episodes, AUC of the first frame's value for success, MAE."""
    eps = labels.episode_index
    succ_frame = np.asarray(success).reshape(-1).astype(bool)
    ep_success = {int(e): bool(succ_frame[eps == e].any()) for e in np.unique(eps)}
    frame_ok = np.array([ep_success[int(e)] for e in eps])
    voc, _ = value_order_correlation(labels.value, eps, labels.frame_index, frame_ok)
    first = labels.frame_index == 0
    auc = success_auc(labels.value[first], frame_ok[first])
    return {"voc": voc, "success_auc": auc, "value_mae": float(np.abs(labels.value - labels.value_target).mean()),
            "episodes": len(ep_success), "successes": int(sum(ep_success.values()))}


# ------------------------------------------------------------------------------------------- extraction
class ConditionedSampler:
    """A ``ChunkSampler`` whose batches also carry the advantage indicator (``CONDITION_KEY``, float [B]) of each
    frame; everything else (order, state, resuming) is the wrapped sampler's. Its fingerprint covers the labels, so a
    resumed run refuses other labels."""

    def __init__(self, sampler: Any, indicator: np.ndarray) -> None:
        import hashlib

        self.sampler = sampler
        ind = torch.as_tensor(np.asarray(indicator), dtype=torch.float32).reshape(-1)
        if len(ind) != sampler.num_frames:
            raise ValueError(f"{len(ind)} indicators for {sampler.num_frames} frames")
        index = sampler.indices["index"]
        self._row_of = torch.full((int(index.max()) + 1,), -1, dtype=torch.long)
        self._row_of[index] = torch.arange(len(index))
        self.indicator = ind
        h = hashlib.sha256(sampler.fingerprint().encode())
        h.update(ind.numpy().tobytes())
        self._fingerprint = h.hexdigest()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)

    def fingerprint(self) -> str:
        return self._fingerprint

    def _add(self, batch: dict[str, Any]) -> dict[str, Any]:
        batch[CONDITION_KEY] = self.indicator[self._row_of[batch["index"]]]
        return batch

    def sample(self) -> dict[str, Any]:
        return self._add(self.sampler.sample())

    def batch(self, idx: torch.Tensor) -> dict[str, Any]:
        return self._add(self.sampler.batch(idx))

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.sampler.load_state_dict(sd)


def recap_policy_overrides(policy_raw: dict[str, Any]) -> dict[str, Any]:
    """The policy section with conditioning on (RECAP trains the conditional and unconditional velocities).

    Raises:
        ValueError: ``guidance_beta`` < 1 (RECAP samples toward the positive indicator).
    """
    beta = float(policy_raw.get("guidance_beta", 1.0))
    if beta < 1.0:
        raise ValueError(f"bad config: algo.policy.guidance_beta={beta}: RECAP samples with β >= 1")
    return {**policy_raw, "conditioning": True}
