"""A success classifier: p(success | frame) from what a real SO-101 gives -- camera images, the six joint positions
``observation.state`` and the instruction -- so that a recording with no outcomes (a real arm cannot report success:
``robot-rl deploy`` and ``record`` write ``next.success`` false throughout) can feed ``robot-rl offline algo=recap``
(DESIGN.md §5, "a success classifier").

Labels: LeRobot's ``next.success`` column (true on frames where the task is solved). The encoders follow the value
model's and the flow VLA's design (``policies.flow_vla.encoders``: a small CNN + spatial softmax per camera,
FiLM-modulated by the instruction; a word-embedding text encoder), trained from scratch with their own weights; the
head reads image features, instruction and normalised joints and gives one logit. Successes are rare frames (an
episode ending on its success frame holds one), so each batch draws ``positive_fraction`` of its frames from the
positives (balanced sampling; the probability is then calibrated to that prior, not the data's).

Decision rule: a frame is *labelled* solved when it and the ``consecutive`` − 1 frames before it in its episode all
have p ≥ ``threshold`` (k = ``consecutive``; one flickering frame is not a success); an episode is predicted
successful iff some frame is labelled solved. Scored on held-out episodes (split by episode, successful and failed
ones held out alike): frame-level ROC AUC, precision/recall of p ≥ threshold, episode-level accuracy of the rule,
and how many frames the first labelled frame lies from the first true one.

    model, report = fit_success("data/lift", SuccessConfig(steps=1500))
    model.save("runs/success")
    label_dataset(load_success("runs/success"), "data/real", "data/real_labelled")   # next.success filled
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from policies import keys
from policies.flow_vla.encoders import (
    ImageEncoder,
    TextEncoder,
    build_vocab,
    random_shift,
    split_words,
    to_unit_range,
    tokenize,
    word_index,
)
from policies.safetensors_check import MalformedFileError
from robot_rl.data.column_copy import check_destination, write_column_copy
from robot_rl.data.lerobot_format import DatasetError, camera_key, feature_names, read_meta
from robot_rl.data.lerobot_loader import ChunkDatasetConfig, ChunkSampler
from robot_rl.rewards.model_folder import load_weights, write_model_folder

CONFIG_FILE, WEIGHTS_FILE = "success.json", "success.safetensors"
LABELS_FILE = "meta/success_labels.json"  # in a labelled copy: which model, rule and source made its next.success


class SuccessFileError(MalformedFileError):
    """A success classifier folder whose files are missing, not JSON, or hold the wrong tensors."""


@dataclass
class SuccessConfig:
    """The classifier, its training and its decision rule."""

    cameras: list[str] | None = None  # cameras read (names, "front"); None: every RGB camera of the training data
    image_size: list[int] = field(default_factory=lambda: [64, 64])  # [H, W] pixels the images are resized to
    use_state: bool = True  # also read observation.state (the joints, degrees)
    max_words: int = 16  # longest instruction, in words
    conv_channels: list[int] = field(default_factory=lambda: [16, 32, 32, 32])  # per 3x3 conv of each camera
    conv_strides: list[int] = field(default_factory=lambda: [2, 2, 2, 1])
    image_feature_dim: int = 64  # per-camera feature size
    text_dim: int = 32  # word embedding size
    hidden_dim: int = 128  # units of the head's hidden layer
    random_shift: int = 4  # pixels of DrQ random translation in training (0: off)
    state_std_min: float = 1.0  # degrees: floor of a joint's std (a joint constant in the data)
    steps: int = 1500  # gradient steps
    batch_size: int = 64
    lr: float = 3e-4  # Adam (the value model's)
    weight_decay: float = 1e-4
    max_grad_norm: float = 1.0  # gradients clipped to this L2 norm (at 1e-3 and no clip, 64x64 training collapsed)
    positive_fraction: float = 0.5  # share of each batch drawn from the success frames
    holdout: float = 0.25  # share of episodes held out for the scores (of the successful and of the failed ones)
    seed: int = 0
    threshold: float = 0.5  # p at or above which a frame counts as a hit
    consecutive: int = 3  # k: a frame is labelled solved when it and the k - 1 frames before it all hit

    def __post_init__(self) -> None:
        if self.cameras is not None and not self.cameras and not self.use_state:
            raise ValueError("success classifier: give it cameras or use_state=true, it reads nothing otherwise")
        if len(self.image_size) != 2 or min(self.image_size) < 8:
            raise ValueError(f"image_size must be [H, W] of at least 8 pixels each, got {self.image_size}")
        if len(self.conv_channels) != len(self.conv_strides) or not self.conv_channels:
            raise ValueError(f"conv_channels {self.conv_channels} and conv_strides {self.conv_strides} must have the "
                             "same, non-zero length")
        if self.steps < 1 or self.batch_size < 2 or self.lr <= 0 or self.random_shift < 0 or self.max_grad_norm <= 0:
            raise ValueError(f"need steps >= 1, batch_size >= 2, lr > 0, random_shift >= 0 and max_grad_norm > 0, got "
                             f"{self.steps}, {self.batch_size}, {self.lr}, {self.random_shift}, {self.max_grad_norm}")
        if not 0.0 < self.positive_fraction < 1.0 or not 0.0 <= self.holdout < 1.0:
            raise ValueError(f"positive_fraction must lie in (0, 1) and holdout in [0, 1), got "
                             f"{self.positive_fraction}, {self.holdout}")
        if not 0.0 < self.threshold < 1.0 or self.consecutive < 1:
            raise ValueError(f"threshold must lie in (0, 1) and consecutive be >= 1 frame, got {self.threshold}, "
                             f"{self.consecutive}")


# ------------------------------------------------------------------------------------------- the math
def consecutive_hits(hit: np.ndarray, episode: np.ndarray, k: int) -> np.ndarray:
    """bool [F]: frame t and the k − 1 frames before it in its episode all hit. Rows sorted by (episode, frame).

    run_t = run_{t−1} + 1 if hit_t (same episode) else 0; labelled_t = run_t ≥ k.
    """
    hit, episode = np.asarray(hit, dtype=bool).reshape(-1), np.asarray(episode).reshape(-1)
    run = np.zeros(len(hit), dtype=np.int64)
    for t in range(len(hit)):
        if hit[t]:
            run[t] = run[t - 1] + 1 if t > 0 and episode[t] == episode[t - 1] else 1
    return run >= k


def episode_any(flag: np.ndarray, episode: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(episode ids [E] sorted, whether any of its frames is flagged [E])."""
    eps = np.unique(episode)
    return eps, np.array([bool(flag[episode == e].any()) for e in eps], dtype=bool)


def roc_auc(score: np.ndarray, label: np.ndarray) -> float | None:
    """Frame-level ROC AUC = P(score of a random positive > that of a random negative), ties counting ½
    (Mann-Whitney: (Σ ranks of positives − P(P + 1)/2) / (P·N), average ranks for ties); None without both classes."""
    score, label = np.asarray(score, dtype=np.float64).reshape(-1), np.asarray(label, dtype=bool).reshape(-1)
    n_pos, n_neg = int(label.sum()), int((~label).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(score, kind="stable")
    ranks = np.empty(len(score), dtype=np.float64)
    sorted_scores = score[order]
    start = 0
    while start < len(score):  # average rank over each run of equal scores
        end = start
        while end + 1 < len(score) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return float((ranks[label].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def confusion(pred: np.ndarray, label: np.ndarray) -> dict[str, Any]:
    """tp, fp, fn, tn, precision = tp/(tp+fp), recall = tp/(tp+fn), f1, accuracy (None where a ratio is 0/0)."""
    pred, label = np.asarray(pred, dtype=bool).reshape(-1), np.asarray(label, dtype=bool).reshape(-1)
    tp, fp = int((pred & label).sum()), int((pred & ~label).sum())
    fn, tn = int((~pred & label).sum()), int((~pred & ~label).sum())
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = 2 * precision * recall / (precision + recall) if precision and recall else None
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "precision": precision, "recall": recall, "f1": f1,
            "accuracy": (tp + tn) / len(pred) if len(pred) else None}


def split_by_episode(episode: np.ndarray, success: np.ndarray, holdout: float,
                     seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row masks (train, held out): ``holdout`` of the successful episodes and of the failed ones (each rounded, at
    least one of a kind that has two or more; none at 0), chosen by ``seed``."""
    rng = np.random.default_rng(seed)
    eps, won = episode_any(success, episode)
    out = []
    for group in (eps[won], eps[~won]):
        n = 0 if holdout <= 0 or len(group) < 2 else max(1, round(holdout * len(group)))
        out += rng.choice(group, size=n, replace=False).tolist() if n else []
    held = np.isin(episode, np.asarray(out, dtype=np.int64))
    return ~held, held


def score_frames(p: np.ndarray, label: np.ndarray, episode: np.ndarray, threshold: float,
                 consecutive: int) -> dict[str, Any]:
    """The scores of predictions p [F] against labels [F] (rows sorted by episode, frame): frame AUC, the
    confusion of p ≥ threshold, a precision/recall table, and the episode rule's accuracy and onset error."""
    p, label = np.asarray(p, dtype=np.float64), np.asarray(label, dtype=bool)
    labelled = consecutive_hits(p >= threshold, episode, consecutive)
    eps, truth = episode_any(label, episode)
    _, guess = episode_any(labelled, episode)
    onset = [int(np.argmax(labelled[episode == e])) - int(np.argmax(label[episode == e]))
             for e, t, g in zip(eps, truth, guess, strict=True) if t and g]  # frames late (> 0) or early (< 0)
    out = {"frames": len(p), "positive_frames": int(label.sum()), "episodes": [int(e) for e in eps],
           "auc": roc_auc(p, label), **confusion(p >= threshold, label),
           "pr_table": [{"threshold": t, **{k: v for k, v in confusion(p >= t, label).items()
                                            if k in ("precision", "recall")}} for t in (0.1, 0.3, 0.5, 0.7, 0.9)],
           "episode": confusion(guess, truth),
           "onset_error_frames": {"mean_abs": float(np.mean(np.abs(onset))) if onset else None,
                                  "mean": float(np.mean(onset)) if onset else None}}
    out["episode_accuracy"] = out["episode"]["accuracy"]
    return out


# ------------------------------------------------------------------------------------------- the model
class SuccessClassifier(nn.Module):
    """logit [B] of p(success | frame): ``observation.state`` float [B, P] (degrees), ``observation.images.<camera>``
    uint8 [B, 3, H, W] or float [0, 1], ``task`` list[str] of B (or one string).

    Args:
        cfg: architecture and decision rule.
        cameras: the camera names it reads (resolved from the data).
        state_names: the joints of ``observation.state`` ("shoulder_pan.pos", ...; checked against data it labels).
        tasks: the instructions of its training data (their words are its vocabulary).
    """

    def __init__(self, cfg: SuccessConfig, cameras: list[str], state_names: list[str], tasks: list[str]) -> None:
        super().__init__()
        longest = max((len(split_words(t)) for t in tasks), default=0)
        if longest > cfg.max_words or not tasks:
            raise ValueError(f"a success classifier needs instructions of 1 to max_words={cfg.max_words} words, got "
                             f"{tasks}")
        if not cameras and not cfg.use_state:
            raise ValueError("a success classifier needs cameras or use_state=true")
        self.cfg, self.cameras, self.state_names, self.tasks = cfg, list(cameras), list(state_names), list(tasks)
        self.vocab = build_vocab(self.tasks)
        self._word_ids = word_index(self.vocab)
        self.text = TextEncoder(len(self.vocab), cfg.max_words, cfg.text_dim)
        self.images = nn.ModuleDict({cam: ImageEncoder(cfg.conv_channels, cfg.conv_strides, cfg.image_feature_dim,
                                                       cfg.text_dim) for cam in self.cameras})
        p = len(self.state_names) if cfg.use_state else 0
        d_in = len(self.cameras) * cfg.image_feature_dim + cfg.text_dim + p
        self.head = nn.Sequential(nn.Linear(d_in, cfg.hidden_dim), nn.LayerNorm(cfg.hidden_dim), nn.SiLU(),
                                  nn.Linear(cfg.hidden_dim, 1))
        self.register_buffer("state_mean", torch.zeros(len(self.state_names)))  # degrees
        self.register_buffer("state_std", torch.ones(len(self.state_names)))  # degrees
        self.metrics: dict[str, Any] = {}

    @property
    def device(self) -> torch.device:
        return self.state_mean.device

    def forward(self, frame: dict[str, Any]) -> torch.Tensor:
        state = frame[keys.OBS_STATE].to(self.device).float()
        if state.dim() != 2 or state.shape[1] != len(self.state_names):
            raise ValueError(f"{keys.OBS_STATE} has shape {list(state.shape)}, the success classifier reads "
                             f"[B, {len(self.state_names)}] ({self.state_names})")
        b = state.shape[0]
        tasks = [frame[keys.TASK]] * b if isinstance(frame[keys.TASK], str) else list(frame[keys.TASK])
        task = self.text(tokenize(tasks, self._word_ids, self.cfg.max_words).to(self.device))
        parts = []
        for cam in self.cameras:
            name = keys.lerobot_image_key(cam)
            if name not in frame:
                raise ValueError(f"the success classifier reads {name!r}; the frame has {sorted(frame)}")
            img = to_unit_range(frame[name].to(self.device))
            if list(img.shape[1:]) != [3, *self.cfg.image_size]:
                raise ValueError(f"{name} has shape {list(img.shape)}, the success classifier reads "
                                 f"[B, 3, {self.cfg.image_size[0]}, {self.cfg.image_size[1]}]")
            if self.training and self.cfg.random_shift > 0:
                img = random_shift(img, self.cfg.random_shift)
            parts.append(self.images[cam](img, task))
        parts.append(task)
        if self.cfg.use_state:
            parts.append((state - self.state_mean) / self.state_std)
        return self.head(torch.cat(parts, dim=-1)).squeeze(-1)

    @torch.no_grad()
    def probability(self, frame: dict[str, Any]) -> torch.Tensor:
        """p(success) [B] in [0, 1]."""
        return torch.sigmoid(self(frame))

    def save(self, path: str | Path) -> Path:
        """``success.json`` (config, cameras, joints, instructions, scores) and ``success.safetensors``."""
        meta = {"config": dataclasses.asdict(self.cfg), "cameras": self.cameras, "state_names": self.state_names,
                "tasks": self.tasks, "metrics": self.metrics}
        return write_model_folder(path, self, meta, CONFIG_FILE, WEIGHTS_FILE)


def load_success(path: str | Path, device: str | torch.device = "cpu") -> SuccessClassifier:
    """A saved success classifier (``SuccessClassifier.save``); ``SuccessFileError`` for a damaged folder."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{path} holds no success classifier ({CONFIG_FILE}); train one with "
                                f"`robot-rl success dataset.root=DIR run_dir={path}`")
    try:
        meta = json.loads((path / CONFIG_FILE).read_text())
        model = SuccessClassifier(SuccessConfig(**meta["config"]), list(meta["cameras"]), list(meta["state_names"]),
                                  list(meta["tasks"]))
    except (ValueError, KeyError, TypeError) as e:
        raise SuccessFileError(path / CONFIG_FILE, f"not a success classifier's config ({type(e).__name__}: {e})") \
            from None
    load_weights(model, path / WEIGHTS_FILE, SuccessFileError)
    model.metrics = dict(meta.get("metrics", {}))
    return model.to(device).eval()


# ------------------------------------------------------------------------------------------- data
def load_frames(root: str | Path, cameras: list[str], image_size: list[int], extra: tuple[str, ...] | list[str] = (),
                timing_check: bool = False, progress: bool = False) -> ChunkSampler:
    """Every frame of the dataset in RAM, sorted by (episode, frame) (``ChunkSampler``: checked, the cameras decoded at
    ``image_size``; ``extra`` columns in its ``extras``); what ``predict`` scores."""
    return ChunkSampler(ChunkDatasetConfig(root=str(root), horizon=1, cameras=cameras, image_size=list(image_size),
                                           augment=False, batch_size=1, extra_columns=list(extra),
                                           timing_check=timing_check, progress=progress))


def _frames(data: ChunkSampler, cameras: list[str], rows: torch.Tensor) -> dict[str, Any]:
    out: dict[str, Any] = {keys.OBS_STATE: data.state[rows],
                           keys.TASK: [data.tasks[t] for t in data.task_index[rows.numpy()].tolist()]}
    for cam in cameras:
        out[keys.lerobot_image_key(cam)] = data.images[camera_key(cam)][rows]
    return out


@torch.no_grad()
def predict(model: SuccessClassifier, data: ChunkSampler, batch_size: int = 512) -> np.ndarray:
    """p(success) of every frame of ``data`` [F] (its row order: by episode, frame)."""
    model.eval()
    out = [model.probability(_frames(data, model.cameras, torch.arange(s, min(s + batch_size, data.num_frames))))
           for s in range(0, data.num_frames, batch_size)]
    return torch.cat(out).cpu().numpy()


def fit_success(root: str | Path, cfg: SuccessConfig, device: str | torch.device = "cpu", progress: Any = None,
                timing_check: bool = True, decode_progress: bool = False) -> tuple[SuccessClassifier, dict[str, Any]]:
    """Train a success classifier on the dataset at ``root`` (only read); returns it (scores in ``model.metrics``)
    and the report (with per-frame curves of up to 8 held-out episodes).

    ``progress``: an optional callable (step, loss) -> None, called every 50 steps (a progress bar).

    Raises:
        DatasetError: no ``next.success`` column, a camera or the joints missing, no success frame or no other frame,
            NaN values (naming episode, file and frame), or any malformed file; all before anything is trained.
    """
    meta = read_meta(root)
    if keys.SUCCESS_COL not in meta.features:
        raise DatasetError(f"dataset {meta.root} has no {keys.SUCCESS_COL!r} column, the labels a success classifier "
                           f"learns from: train on episodes with outcomes (e.g. `robot-rl collect task=so101_lift "
                           f"task.terminate_on_success=false ...` in simulation, or lerobot-eval's recordings)")
    if keys.OBS_STATE not in meta.features:
        raise DatasetError(f"dataset {meta.root} has no {keys.OBS_STATE!r} column (the joints)")
    cams = [c.removeprefix(keys.OBS_IMAGES) for c in meta.camera_keys] if cfg.cameras is None else list(cfg.cameras)
    meta.require(cameras=cams)
    data = load_frames(root, cams, cfg.image_size, [keys.SUCCESS_COL], timing_check, decode_progress)
    label = data.extras[keys.SUCCESS_COL].numpy().astype(np.float64).reshape(-1) >= 0.5
    episode = data.indices["episode_index"].numpy()
    if not label.any() or label.all():
        raise DatasetError(f"dataset {meta.root}: {keys.SUCCESS_COL!r} is {'false' if not label.any() else 'true'} "
                           f"on every one of its {len(label)} frames; a classifier needs frames of both kinds (a real "
                           f"arm's recordings hold no successes: label those with a classifier trained elsewhere)")
    train, held = split_by_episode(episode, label, cfg.holdout, cfg.seed)
    if not label[train].any():
        raise DatasetError(f"dataset {meta.root}: no success frame is left to train on after holding out episodes; "
                           f"record more successful episodes or lower holdout")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    names = feature_names(meta.features[keys.OBS_STATE]) or [f"state.{i}" for i in range(data.state.shape[1])]
    model = SuccessClassifier(cfg, cams, names, data.tasks)
    state = data.state[torch.as_tensor(train)]
    model.state_mean.copy_(state.mean(0))
    model.state_std.copy_(state.std(0, unbiased=False).clamp_min(cfg.state_std_min))
    model.to(device).train()
    pos = torch.as_tensor(np.flatnonzero(train & label))
    neg = torch.as_tensor(np.flatnonzero(train & ~label))
    n_pos = max(1, min(cfg.batch_size - 1, round(cfg.positive_fraction * cfg.batch_size)))
    target = torch.cat([torch.ones(n_pos), torch.zeros(cfg.batch_size - n_pos)]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss_v = math.nan
    for step in range(cfg.steps):
        rows = torch.cat([pos[torch.randint(len(pos), (n_pos,), generator=gen)],
                          neg[torch.randint(len(neg), (cfg.batch_size - n_pos,), generator=gen)]])
        loss = F.binary_cross_entropy_with_logits(model(_frames(data, cams, rows)), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
        loss_v = float(loss.detach())
        if progress is not None and (step + 1) % 50 == 0:
            progress(step + 1, loss_v)
    p = predict(model, data)
    report: dict[str, Any] = {"dataset": str(meta.root), "loss": loss_v, "frames": int(data.num_frames),
                              "episodes": int(data.num_episodes), "positive_frames": int(label.sum()),
                              "successful_episodes": int(episode_any(label, episode)[1].sum()), "cameras": cams,
                              "tasks": data.tasks, "threshold": cfg.threshold, "consecutive": cfg.consecutive,
                              "timing_dropped": int(data.timing_dropped)}
    for name, mask in (("train", train), ("held_out", held)):
        if mask.any():
            report[name] = score_frames(p[mask], label[mask], episode[mask], cfg.threshold, cfg.consecutive)
    if held.any():
        report["held_out_curves"] = {str(int(e)): {"p": p[episode == e].round(4).tolist(),
                                                   "success": label[episode == e].astype(int).tolist()}
                                     for e in np.unique(episode[held])[:8]}
    model.metrics = {k: v for k, v in report.items() if k != "held_out_curves"}
    return model.eval(), report


def check_fits(model: SuccessClassifier, root: str | Path) -> None:
    """Refuse a dataset whose frames the classifier cannot read: a camera it lacks, other joints.

    Raises:
        DatasetError: naming the dataset, what the model reads and what the dataset holds.
    """
    meta = read_meta(root)
    meta.require(cameras=model.cameras)
    if keys.OBS_STATE not in meta.features:
        raise DatasetError(f"dataset {meta.root} has no {keys.OBS_STATE!r} column; the success classifier reads "
                           f"{model.state_names}")
    names = feature_names(meta.features[keys.OBS_STATE])
    size = int(np.prod(meta.features[keys.OBS_STATE].get("shape") or [0]))
    if size != len(model.state_names) or (names and names != model.state_names
                                          and not model.state_names[0].startswith("state.")):
        raise DatasetError(f"dataset {meta.root} holds {keys.OBS_STATE!r} {names or f'of {size} values'}; the success "
                           f"classifier was trained on {model.state_names}")


def label_dataset(model: SuccessClassifier, src: str | Path, out: str | Path, threshold: float | None = None,
                  consecutive: int | None = None, model_path: str | None = None,
                  decode_progress: bool = False) -> dict[str, Any]:
    """Write a copy of the dataset at ``src`` to ``out`` whose ``next.success`` is the classifier's decision rule
    (``consecutive_hits`` of p ≥ threshold; the model's own threshold and k unless given). ``src`` is only read;
    everything is checked before ``out`` is made. Returns the summary also written into the copy (``LABELS_FILE``).

    Raises:
        ValueError: ``out`` exists or overlaps ``src``; DatasetError: ``src`` lacks what the model reads, holds NaN,
            or is malformed.
    """
    thr = model.cfg.threshold if threshold is None else float(threshold)
    k = model.cfg.consecutive if consecutive is None else int(consecutive)
    if not 0.0 < thr < 1.0 or k < 1:
        raise ValueError(f"threshold must lie in (0, 1) and consecutive be >= 1, got {thr}, {k}")
    check_destination(src, out)
    check_fits(model, src)
    data = load_frames(src, model.cameras, model.cfg.image_size, [], False, decode_progress)
    unknown = sorted({w for t in data.tasks for w in split_words(t)} - set(model.vocab))
    if unknown:
        print(f"success labels: the instructions of {src} hold words the classifier never saw ({unknown}); it was "
              f"trained on {model.tasks}", file=sys.stderr)
    p = predict(model, data)
    episode = data.indices["episode_index"].numpy()
    solved = consecutive_hits(p >= thr, episode, k)
    eps, won = episode_any(solved, episode)
    firsts = {str(int(e)): int(np.argmax(solved[episode == e])) for e, w in zip(eps, won, strict=True) if w}
    summary = {"source": str(Path(src).resolve()), "model": model_path, "threshold": thr, "consecutive": k,
               "frames": int(data.num_frames), "episodes": len(eps), "successful_episodes": int(won.sum()),
               "solved_frames": int(solved.sum()), "first_success_frame": firsts, "unknown_words": unknown}
    write_column_copy(src, out, keys.SUCCESS_COL, data.indices["index"].numpy(), solved,
                      {LABELS_FILE: (json.dumps(summary, indent=2) + "\n").encode()})
    return summary
