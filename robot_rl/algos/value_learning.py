"""The value model's training: fit a distributional ``ValueModel`` (``robot_rl.models.value``) to every logged frame's
value target (demos, autonomous rollouts, interventions alike): y = −(steps to success)/M, failures −1
(``robot_rl.data.labels``); predict V(o) of every frame; save and load the model (safetensors + JSON), and check a
model saved by an earlier run against the data it is to label. The first stage of RECAP and AWR
(``robot_rl.algos.advantages``); the value model never ships to the robot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policies import keys
from robot_rl.algos.guard import NonFiniteGuard, guarded_step
from robot_rl.algos.optim import adamw
from robot_rl.algos.precision import bf16_autocast, check_bf16
from robot_rl.data.labels import LabelConfig, task_scales
from robot_rl.models.value import ValueConfig, ValueModel


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


def value_config_for(sampler: Any, base: ValueConfig) -> ValueConfig:
    """``base`` sized to a sampler's data: its cameras, image size and state size."""
    if not sampler.image_keys:
        raise ValueError(f"dataset {sampler.cfg.root}: no camera features; the value model reads images")
    img = sampler.features[sampler.image_keys[0]][0]
    return replace(base, cameras=[k[len(keys.OBS_IMAGES):] for k in sampler.image_keys],
                   image_size=[int(img[-2]), int(img[-1])],
                   state_dim=int(sampler.features[keys.OBS_STATE][0][-1]))


def target_settings(labels: LabelConfig) -> dict[str, Any]:
    """The label settings that fix a value model's targets (and so the scale of its values): M (per task) and C."""
    out = {"max_episode_length": labels.max_episode_length, "fail_penalty": labels.fail_penalty}
    if labels.max_episode_length_by_task:  # only then: the settings of models saved before it existed still match
        out["max_episode_length_by_task"] = dict(labels.max_episode_length_by_task)
    return out


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

    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise ValueError(f"algo.value.pretrained={folder}: no value model there (expected the 'value' folder of an "
                         f"earlier `robot-rl offline algo=recap|awr` run, holding {MANIFEST})")
    model, meta = load_value_model(folder, device)
    digest = hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest()
    problems = []
    scales = task_scales(np.asarray(sampler.columns()["episode_index"]), np.asarray(sampler.task_index),
                         sampler.tasks, labels)
    m_src = meta.get("max_episode_length")  # by instruction; one number for every task in models saved before
    c_src = ((meta.get("settings") or {}).get("targets") or {}).get("fail_penalty")
    # a task it was not fitted on is held to the model's one M when all its tasks share one (else only its words
    # must be known, below)
    shared = (next(iter(set(m_src.values()))) if isinstance(m_src, dict) and len(set(m_src.values())) == 1
              else None)
    for t, m in sorted(scales.items()):
        task = sampler.tasks[t]
        src = m_src.get(task, shared) if isinstance(m_src, dict) else m_src
        if src is None and isinstance(m_src, dict):
            continue
        here = (float(m), float(m if labels.fail_penalty is None else labels.fail_penalty))
        fitted = None if src is None else (float(src), float(src if c_src is None else c_src))
        if fitted != here:
            problems.append(f"for {task!r} it was fitted to targets with (M, C) = {fitted} frames and this data's "
                            f"labels use {here} (set algo.labels.max_episode_length, max_episode_length_by_task and "
                            "fail_penalty to the model's)")
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
