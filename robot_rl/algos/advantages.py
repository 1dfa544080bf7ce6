"""The advantage stage RECAP and AWR share: fit the value model on every frame (``robot_rl.algos.value_learning``),
then label the frames (``robot_rl.data.labels``): N-step advantages A_t = Σ_{k<N} r_{t+k} + V(o_{t+N}) − V(o_t) and
the indicator I_t = 1[A_t ≥ the task's (1 − positive_fraction) quantile], forced to 1 on intervention frames. Value,
advantage and indicator are written to a sidecar in the run folder, never into the dataset.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policies import keys
from robot_rl.algos.value_learning import (
    ValueLearner,
    ValueTrainConfig,
    load_pretrained_value,
    load_value_model,
    predict_values,
    save_value_model,
    target_settings,
    value_config_for,
)
from robot_rl.data.labels import (
    LabelConfig,
    Labels,
    compute_labels,
    intervention_frames,
    read_sidecar,
    solved_frames,
    targets_for,
    write_sidecar,
)
from robot_rl.data.outcomes import frame_table
from robot_rl.models.value import ValueModel
from robot_rl.models.voc import success_auc, value_order_correlation

VALUE_DIR, LABELS_DIR = "value", "labels"  # inside the run folder


@dataclass
class AdvantageConfig:
    """What RECAP and AWR share: the value model's training and the labels."""

    value: ValueTrainConfig = field(default_factory=ValueTrainConfig)
    labels: LabelConfig = field(default_factory=LabelConfig)


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
    cols = frame_table(sampler)
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
    targets, scales = targets_for(cols, success_col, cfg.labels, sampler.tasks)
    max_len = {sampler.tasks[t]: m for t, m in scales.items()}  # M by instruction: what a reuse elsewhere compares
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
    labels = compute_labels(cols, values, success_col, cfg.labels, inter_col, sampler.tasks)
    summary["label_s"] = round(time.perf_counter() - start, 2)
    summary.update(value_scores(labels, cols[success_col]))
    write_sidecar(labels, labels_dir, {"dataset": fingerprint, "settings": settings, "summary": summary})
    print(f"{name}: labelled {len(values)} frames: {labels.positive_fraction:.2f} positive "
          f"({int(labels.intervention.sum())} correction frames), value MAE {summary['value_mae']:.3f}, "
          f"VOC {_score(summary['voc'], 'no successful episode')}, "
          f"success AUC {_score(summary['success_auc'], 'needs successes and failures')}", file=sys.stderr)
    return labels, summary


def _score(value: float, why_none: str) -> str:
    """A score for the log, or why there is none (NaN: the episodes it needs are not in the data)."""
    return f"{value:.3f}" if np.isfinite(value) else f"n/a ({why_none})"


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
