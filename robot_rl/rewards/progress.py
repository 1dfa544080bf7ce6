"""A progress model: per-frame task completion in [0, 1], learned from logged episodes, the potential Φ of dense
rewards (``robot_rl.rewards.shaping``, DESIGN.md §5).

It reads what a state-based learner observes (the env's ``policy`` group, recorded as LeRobot's
``observation.environment_state`` by ``robot-rl collect env_state=true``) and, where the data holds several
instructions, which one the episode was given (a learned embedding of the dataset's task set). Targets:

- a successful episode's frame t, t* its first ``next.success`` frame: y = 1 − (t* − t) / H, clipped to [0, 1]
  (``target="time_to_go"``, the default: the steps still to go, as the value model counts them, a function of the
  state wherever the expert keeps its pace; H = ``horizon``, by default the slowest success in the data), or y =
  min(1, t / t*) (``target="fraction"``, which also depends on where the episode started);
- a failed episode's frames: ``failure_label`` (0 by default: no progress counts toward a task never finished, so
  states that lead nowhere score below those on the way to a success; None leaves failed episodes out);
- synthesized failures: a ``perturb_fraction`` of each batch is moved off its trajectory by Gaussian noise of a
  random fraction f of ``perturb_std`` stds of each feature and keeps (1 − f) of its target, so Φ falls away from
  the demonstrated states and rises toward them (trained on the demonstrated states alone, an MLP scores states no
  demo visits at random: on so101_lift a random policy's states reached Φ 0.98); and, where the data holds several
  instructions, a ``mismatch_fraction`` pairs frames with another instruction than their episode's, target 0 (the
  arm moving the blue cube makes no progress on "pick up the red cube").

Scored by value-order correlation (``robot_rl.models.voc``) on held-out successful episodes: the rank correlation of
Φ with time, 1 for a progress that only rises. Stalls and reversals, the other failures a video model is shown, teach
a per-frame model of the state nothing: a frame seen again has the same state and the same label.

    model, report = fit_progress("data/lift", ProgressConfig(steps=3000))
    model.save("runs/progress")                    # robot-rl train ... reward.progress=runs/progress
    phi = load_progress("runs/progress").potential(obs)   # [N] in [0, 1]
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from policies import keys
from policies.safetensors_check import MalformedFileError
from robot_rl.data.lerobot_format import DatasetError, read_frames, read_meta
from robot_rl.data.timing import drop_late_episodes
from robot_rl.models.voc import value_order_correlation
from robot_rl.rewards.model_folder import load_weights, write_model_folder

CONFIG_FILE, WEIGHTS_FILE = "progress.json", "progress.safetensors"
HOW_TO_ADD = "record it with `robot-rl collect task=<task> env_state=true dataset.root=DIR ...`"


class ProgressFileError(MalformedFileError):
    """A progress model folder whose files are missing, not JSON, or hold the wrong tensors."""


@dataclass
class ProgressConfig:
    """The model and its training."""

    hidden_dims: list[int] = dataclasses.field(default_factory=lambda: [256, 256])  # ELU MLP
    task_dim: int = 16  # instruction embedding size (used where the data holds several instructions)
    steps: int = 3000  # gradient steps
    batch_size: int = 512
    lr: float = 1e-3  # Adam
    weight_decay: float = 1e-4
    failure_label: float | None = 0.0  # target of a failed episode's frames; None: leave failed episodes out
    # "time_to_go": 1 - (steps to the first success) / horizon, a function of the state wherever the expert's pace
    # is (the value model's count); "fraction": t / t*, which also depends on where the episode started
    target: str = "time_to_go"
    horizon: int | None = None  # H of time_to_go; None: the longest time to success in the data
    mismatch_fraction: float = 0.25  # share of a batch given another instruction, target 0 (several instructions)
    perturb_fraction: float = 0.25  # share of a batch moved off its trajectory, keeping (1 - f) of its target
    perturb_std: float = 2.0  # the largest move (f = 1): Gaussian noise of this many stds of each feature
    holdout: float = 0.1  # share of the successful episodes held out for VOC (at least one where there are two)
    seed: int = 0
    state_std_min: float = 1e-3  # floor of a feature's std (a feature constant in the data)
    # Parts of the env state not read (by the column's names, "<part>.<i>"): the arm's joints, velocities and last
    # command tell where along a demonstration a frame lies (the expert starts still, speeds up, slows down), not
    # how close the task is to done, and a policy moving otherwise than the expert was scored by them; the task-space
    # parts (end effector, object, target) stay. With this and time-to-go targets, shaped PPO runs on so101_reach went
    # from slower than unshaped ones to 0.20x their env steps (benchmarks/results/dense_rewards.json).
    exclude_parts: list[str] = dataclasses.field(default_factory=lambda: ["joint_pos", "joint_vel", "last_action"])

    def __post_init__(self) -> None:
        if not self.hidden_dims or min(self.hidden_dims) < 1:
            raise ValueError(f"hidden_dims must be a non-empty list of positive sizes, got {self.hidden_dims}")
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"need steps >= 1, batch_size >= 1 and lr > 0, got {self.steps}, {self.batch_size}, "
                             f"{self.lr}")
        if self.failure_label is not None and not 0.0 <= self.failure_label <= 1.0:
            raise ValueError(f"failure_label must be null or in [0, 1], got {self.failure_label}")
        if self.target not in ("time_to_go", "fraction"):
            raise ValueError(f"target must be 'time_to_go' or 'fraction', got {self.target!r}")
        if self.horizon is not None and self.horizon < 1:
            raise ValueError(f"horizon must be >= 1 step or null, got {self.horizon}")
        if self.perturb_std <= 0:
            raise ValueError(f"perturb_std must be > 0 (stds of each feature), got {self.perturb_std}")
        if not 0.0 <= self.mismatch_fraction < 1.0 or not 0.0 <= self.perturb_fraction < 1.0 \
                or not 0.0 <= self.holdout < 1.0:
            raise ValueError(f"mismatch_fraction, perturb_fraction and holdout must lie in [0, 1), got "
                             f"{self.mismatch_fraction}, {self.perturb_fraction}, {self.holdout}")


def progress_targets(episode: np.ndarray, frame: np.ndarray, success: np.ndarray,
                     failure_label: float | None = 0.0, horizon: int | None = None) -> np.ndarray:
    """Per-frame targets (module docstring): in a successful episode min(1, t / t*), or with a ``horizon`` H
    max(0, 1 − (t* − t) / H) (the steps still to go, as the value model counts them); ``failure_label`` (NaN where
    None: no target) in a failed one.

    Args:
        episode, frame: episode and frame index per row [F].
        success: the row's ``next.success`` [F] (bool).
    """
    episode, frame, success = np.asarray(episode), np.asarray(frame), np.asarray(success).astype(bool)
    out = np.full(len(episode), np.nan if failure_label is None else failure_label, dtype=np.float64)
    for e in np.unique(episode[success]):
        rows = episode == e
        first = int(frame[rows & success].min())
        if horizon is not None:
            out[rows] = np.clip(1.0 - (first - frame[rows]) / horizon, 0.0, 1.0)
        else:
            out[rows] = np.minimum(1.0, frame[rows] / first) if first > 0 else 1.0
    return out


class ProgressModel(nn.Module):
    """Φ(o) in [0, 1]: an MLP over the normalised state (and the instruction's embedding, with several)."""

    def __init__(self, cfg: ProgressConfig, obs_dim: int, tasks: list[str], keep: list[int] | None = None) -> None:
        super().__init__()
        if obs_dim < 1 or not tasks:
            raise ValueError(f"a progress model needs obs_dim >= 1 and at least one task, got {obs_dim}, {tasks}")
        keep = list(range(obs_dim)) if keep is None else [int(i) for i in keep]
        if not keep or min(keep) < 0 or max(keep) >= obs_dim or len(set(keep)) != len(keep):
            raise ValueError(f"keep must list distinct features of the {obs_dim}, got {keep}")
        self.cfg, self.obs_dim, self.tasks, self.keep = cfg, int(obs_dim), list(tasks), keep
        self._task_ids = {t: i for i, t in enumerate(self.tasks)}
        # the features read; progress.json's "keep" is its one record (not saved with the weights)
        self.register_buffer("keep_index", torch.tensor(keep, dtype=torch.int64), persistent=False)
        self.register_buffer("mean", torch.zeros(len(keep)))
        self.register_buffer("std", torch.ones(len(keep)))
        self.embed = nn.Embedding(len(tasks), cfg.task_dim) if len(tasks) > 1 else None
        dims = [len(keep) + (cfg.task_dim if self.embed is not None else 0), *cfg.hidden_dims]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(dims):
            layers += [nn.Linear(a, b), nn.ELU()]
        self.net = nn.Sequential(*layers, nn.Linear(dims[-1], 1))
        self.metrics: dict[str, Any] = {}

    def task_index(self, instructions: list[str]) -> torch.Tensor:
        """int64 [B] of instructions, refusing one the model was not trained on (naming it and those it knows)."""
        unknown = sorted({t for t in instructions if t not in self._task_ids})
        if unknown:
            raise ValueError(f"the progress model knows the instructions {self.tasks}, not {unknown}")
        return torch.tensor([self._task_ids[t] for t in instructions], dtype=torch.int64, device=self.mean.device)

    def forward(self, state: torch.Tensor, task: torch.Tensor | None = None) -> torch.Tensor:
        """Progress [B] in [0, 1] of states [B, obs_dim] (task: int64 [B] indices into ``tasks``)."""
        if state.dim() != 2 or state.shape[1] != self.obs_dim:
            raise ValueError(f"the progress model reads states [B, {self.obs_dim}], got {list(state.shape)}")
        x = (state.to(self.mean.device).float()[:, self.keep_index] - self.mean) / self.std
        if self.embed is not None:
            if task is None:
                raise ValueError(f"this progress model was trained on {len(self.tasks)} instructions: give each "
                                 f"state's")
            x = torch.cat([x, self.embed(task.to(x.device))], dim=-1)
        return torch.sigmoid(self.net(x).squeeze(-1))

    @torch.no_grad()
    def potential(self, obs: dict[str, torch.Tensor], instructions: list[str] | None = None) -> torch.Tensor:
        """Φ [N] of an env's observation groups (its ``policy`` group); ``instructions`` per env where the model
        knows several."""
        task = self.task_index(instructions) if self.embed is not None and instructions is not None else None
        return self(obs[keys.POLICY], task)

    def save(self, path: str | Path) -> Path:
        """``progress.json`` (config, sizes, task set, scores) and ``progress.safetensors`` into the folder."""
        meta = {"config": dataclasses.asdict(self.cfg), "obs_dim": self.obs_dim, "obs_column": keys.ENV_STATE_COL,
                "keep": self.keep, "tasks": self.tasks, "metrics": self.metrics}
        return write_model_folder(path, self, meta, CONFIG_FILE, WEIGHTS_FILE)


def load_progress(path: str | Path, device: str | torch.device = "cpu") -> ProgressModel:
    """A saved progress model (``ProgressModel.save``); ``ProgressFileError`` for a damaged folder."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{path} holds no progress model ({CONFIG_FILE}); train one with "
                                f"`robot-rl progress dataset.root=DIR run_dir={path}`")
    try:
        meta = json.loads((path / CONFIG_FILE).read_text())
        cfg = ProgressConfig(**meta["config"])
        model = ProgressModel(cfg, int(meta["obs_dim"]), list(meta["tasks"]), meta.get("keep"))
    except (ValueError, KeyError, TypeError) as e:
        raise ProgressFileError(path / CONFIG_FILE, f"not a progress model's config ({type(e).__name__}: {e})") from None
    load_weights(model, path / WEIGHTS_FILE, ProgressFileError)
    model.metrics = dict(meta.get("metrics", {}))
    return model.to(device).eval()


@dataclass
class ProgressData:
    """A dataset's frames for a progress model: states float32 [F, D] and their feature names (None: the column has
    none), task index int64 [F] into ``tasks``, episode and frame index [F], per-frame episode success [F] (bool),
    targets [F] (NaN: not trained on)."""

    state: np.ndarray
    names: list[str] | None
    task: np.ndarray
    tasks: list[str]
    episode: np.ndarray
    frame: np.ndarray
    succeeded: np.ndarray
    target: np.ndarray
    horizon: int | None = None  # time_to_go's H (None: fraction targets)


def read_progress_data(root: str | Path, failure_label: float | None = 0.0, timing_check: bool = True,
                       target: str = "time_to_go", horizon: int | None = None) -> ProgressData:
    """The frames of the LeRobotDataset v3 at ``root`` with their targets (only read; nothing is written there).

    Raises:
        DatasetError: no ``observation.environment_state`` or ``next.success`` column (naming it and how to record
            it), no successful episode, NaN states (naming the episode, file and frame), or any malformed file.
    """
    meta = read_meta(root)
    missing = [c for c in (keys.ENV_STATE_COL, keys.SUCCESS_COL) if c not in meta.features]
    if missing:
        raise DatasetError(f"dataset {meta.root} cannot train a progress model: no column {missing[0]!r} "
                           f"({'the env state it reads' if missing[0] == keys.ENV_STATE_COL else 'whether the task is solved'}"
                           f"): {HOW_TO_ADD}")
    episodes = np.asarray(meta.episodes["episode_index"], dtype=np.int64)
    if timing_check:
        episodes = drop_late_episodes(meta, episodes, what="timing_check")
    cols = read_frames(meta, episodes, [keys.ENV_STATE_COL, keys.SUCCESS_COL]).columns
    state = np.asarray(cols[keys.ENV_STATE_COL], dtype=np.float32)  # finite: read_frames checks every value
    episode, frame = np.asarray(cols["episode_index"]), np.asarray(cols["frame_index"])
    success = cols[keys.SUCCESS_COL].reshape(-1).astype(bool)
    won = np.unique(episode[success])
    if not len(won):
        raise DatasetError(f"dataset {meta.root} holds no successful episode ({keys.SUCCESS_COL!r} never true): a "
                           f"progress model learns from episodes that reach the goal")
    if target == "time_to_go" and horizon is None:  # the slowest success starts at 0
        horizon = max(1, max(int(frame[(episode == e) & success].min()) for e in won))
    names = meta.features[keys.ENV_STATE_COL].get("names")
    h = horizon if target == "time_to_go" else None
    return ProgressData(state=state, names=list(names) if names else None,
                        task=np.asarray(cols["task_index"], dtype=np.int64), tasks=list(meta.tasks), episode=episode,
                        frame=frame, succeeded=np.isin(episode, won),
                        target=progress_targets(episode, frame, success, failure_label, h), horizon=h)


def kept_features(names: list[str] | None, exclude_parts: list[str]) -> list[int]:
    """Indices of the features whose part (the name before its first '.') is not in ``exclude_parts`` (a part the
    column does not hold excludes nothing: the default names the SO-101 arm's; the report lists the parts read).

    Raises:
        DatasetError: parts to exclude but no names to find them by, or nothing left.
    """
    if not exclude_parts:
        return list(range(len(names))) if names else []
    if names is None:
        raise DatasetError(f"the column {keys.ENV_STATE_COL!r} names no features, so the parts {exclude_parts} "
                           f"(exclude_parts) cannot be left out: record the dataset again with `robot-rl collect "
                           f"env_state=true` (it names them), or read every feature with exclude_parts=[]")
    part = [n.split(".")[0] for n in names]
    keep = [i for i, p in enumerate(part) if p not in exclude_parts]
    if not keep:
        raise DatasetError(f"exclude_parts {exclude_parts} leaves none of {keys.ENV_STATE_COL!r}'s parts "
                           f"{list(dict.fromkeys(part))}")
    return keep


def split_episodes(data: ProgressData, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row masks (train, held out): ``holdout`` of the successful episodes (at least one where there are two or
    more; none at 0) are held out, chosen by ``seed``; failed episodes always train."""
    won = np.unique(data.episode[data.succeeded])
    n_out = 0 if holdout <= 0 or len(won) < 2 else max(1, round(holdout * len(won)))
    rng = np.random.default_rng(seed)
    out = rng.choice(won, size=n_out, replace=False) if n_out else np.zeros(0, dtype=won.dtype)
    held = np.isin(data.episode, out)
    return ~held, held


def fit_progress(root: str | Path, cfg: ProgressConfig, device: str | torch.device = "cpu",
                 progress: Any = None, timing_check: bool = True) -> tuple[ProgressModel, dict[str, Any]]:
    """Train a progress model on the dataset at ``root``; returns it (scores in ``model.metrics``) and the scores.

    ``progress``: an optional callable (step, loss) -> None, called every 100 steps (a progress bar);
    ``timing_check``: leave out episodes recorded with late ticks (``robot_rl.data.timing``).
    """
    data = read_progress_data(root, cfg.failure_label, timing_check, cfg.target, cfg.horizon)
    train, held = split_episodes(data, cfg.holdout, cfg.seed)
    rows = np.flatnonzero(train & ~np.isnan(data.target))
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    keep = kept_features(data.names, cfg.exclude_parts) or None
    model = ProgressModel(cfg, data.state.shape[1], data.tasks, keep).to(device)
    state = torch.as_tensor(data.state[rows], device=device)
    std = state.std(0, unbiased=False).clamp_min(cfg.state_std_min)
    model.mean.copy_(state[:, model.keep_index].mean(0))
    model.std.copy_(std[model.keep_index])
    task = torch.as_tensor(data.task[rows], device=device)
    target = torch.as_tensor(data.target[rows], dtype=torch.float32, device=device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    mismatch = cfg.mismatch_fraction if len(data.tasks) > 1 else 0.0
    loss_v = math.nan
    model.train()
    for step in range(cfg.steps):
        idx = torch.randint(len(rows), (cfg.batch_size,), generator=gen).to(device)
        x, t, y = state[idx], task[idx], target[idx]
        if cfg.perturb_fraction > 0:  # moved off the demonstrated states: the further, the less progress kept
            off = torch.rand(cfg.batch_size, generator=gen).to(device) < cfg.perturb_fraction
            frac = torch.rand(cfg.batch_size, generator=gen).to(device)  # of perturb_std
            noise = torch.randn(x.shape, generator=gen).to(device) * (frac * cfg.perturb_std)[:, None] * std
            x, y = torch.where(off[:, None], x + noise, x), torch.where(off, y * (1.0 - frac), y)
        if mismatch > 0:  # another instruction than the episode's: no progress on it
            swap = torch.rand(cfg.batch_size, generator=gen).to(device) < mismatch
            other = (t + torch.randint(1, len(data.tasks), (cfg.batch_size,), generator=gen).to(device)) % len(data.tasks)
            t, y = torch.where(swap, other, t), torch.where(swap, torch.zeros_like(y), y)
        loss = ((model(x, t) - y) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_v = float(loss.detach())
        if progress is not None and (step + 1) % 100 == 0:
            progress(step + 1, loss_v)
    model.eval()
    parts = list(dict.fromkeys(data.names[i].split(".")[0] for i in model.keep)) if data.names else None
    report = {"loss": loss_v, "frames": len(rows), "horizon": data.horizon, "parts_read": parts,
              "episodes": len(np.unique(data.episode)),
              "successful_episodes": len(np.unique(data.episode[data.succeeded])), "tasks": data.tasks}
    for name, mask in (("train", train), ("held_out", held)):
        if not mask.any():
            continue
        with torch.no_grad():
            phi = model(torch.as_tensor(data.state[mask], device=device),
                        torch.as_tensor(data.task[mask], device=device)).cpu().numpy()
        voc, per_ep = value_order_correlation(phi, data.episode[mask], data.frame[mask], data.succeeded[mask])
        report[f"{name}_voc"] = voc
        report[f"{name}_episodes"] = sorted(int(e) for e in np.unique(data.episode[mask]))
        if name == "held_out":
            report["held_out_voc_per_episode"] = {str(k): v for k, v in per_ep.items()}
            report["held_out_curves"] = {str(int(e)): phi[data.episode[mask] == e].round(4).tolist()
                                         for e in np.unique(data.episode[mask])[:8]}
    model.metrics = {k: v for k, v in report.items() if k != "held_out_curves"}
    return model, report
