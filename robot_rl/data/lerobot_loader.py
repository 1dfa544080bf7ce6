"""Training batches of action chunks from any LeRobotDataset v3 on disk (ours, or one recorded by LeRobot's tools).

Everything is read once at construction (``lerobot_format``: checked metadata and frame table; every camera decoded
file by file into a uint8 cache in RAM at the requested size), so ``sample()`` only gathers from RAM. Only reads:
nothing is ever written under the dataset's root.

Batches (B samples, K = history, H = horizon, A = action size):
    observation.state            float32 [B, D] (degrees for an SO-101), [B, K, D] when K > 1
    observation.images.<cam>     float32 [B, 3, h, w] in [0, 1], [B, K, 3, h, w] when K > 1
    task                         list[str] of B
    action                       float32 [B, H, A], the chunk starting at the frame; past the episode's end the
                                 last action repeats and action_is_pad (bool [B, H]) is True
    episode_index, frame_index, index   int64 [B]
    <extra column>               [B] (or [B, ...] for vector columns), the dataset's dtype (bool, int64, float32)
History frames before an episode's start repeat its first frame.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from policies import keys
from robot_rl.data.augment import gather_frames, random_shifts
from robot_rl.data.lerobot_format import (
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    DatasetError,
    DatasetMeta,
    Frames,
    camera_key,
    compute_stats,
    decode_images,
    decode_videos,
    feature_names,
    image_hw,
    read_frames,
    read_meta,
    stats_from_file,
)
from robot_rl.data.timing import drop_late_episodes
from robot_rl.data.video_decode import BACKENDS, DecodeError, resolve_backend

__all__ = ["ChunkDatasetConfig", "ChunkSampler", "DatasetError", "DatasetMeta", "camera_key", "read_meta"]

INDEX_COLUMNS = ("episode_index", "frame_index", "index")
Weights = torch.Tensor | Callable[[dict[str, torch.Tensor]], torch.Tensor]


@dataclass
class ChunkDatasetConfig:
    """Which dataset, and how its frames become training batches."""

    root: str  # folder of a LeRobotDataset v3 (holds meta/info.json)
    repo_id: str | None = None  # its name (None: the folder's name); informational
    horizon: int = 16  # H: action chunk length (frames)
    history: int = 1  # K: frames of observation history (K = 1: the current frame only, no K axis)
    cameras: list[str] | None = None  # camera names ("front") or keys; None: every RGB camera of the dataset
    image_size: list[int] | None = None  # [h, w] pixels the images are resized to at load; None: as stored
    augment: bool = True  # DrQ random shift (replicate-pad by augment_pad px, random crop) on every sample
    augment_pad: int = 4  # pixels
    batch_size: int = 64  # B
    seed: int = 0  # the sampler's generator (order and augmentation)
    video_backend: str = "auto"  # "auto" (PyAV, else torchcodec), "pyav" or "torchcodec"
    extra_columns: list[str] = field(default_factory=list)  # per-frame columns added to batches (next.success, ...)
    episodes: list[int] | None = None  # episode indices to load (a split); None: all
    # leave out episodes whose measured capture times show a stalled loop (robot_rl.data.timing; datasets without a
    # capture_time column, like simulated or LeRobot-recorded ones, have nothing to check)
    timing_check: bool = True
    max_cache_gib: float = 16.0  # refuse to decode more image bytes than this (GiB) into RAM
    progress: bool = True  # tqdm bar while decoding

    def __post_init__(self) -> None:
        if self.horizon < 1 or self.history < 1 or self.batch_size < 1 or self.augment_pad < 0:
            raise ValueError("dataset horizon, history and batch_size must be >= 1, augment_pad >= 0")
        if self.image_size is not None and (len(self.image_size) != 2 or min(self.image_size) < 1):
            raise ValueError(f"dataset image_size must be [h, w] with positive sizes, got {self.image_size}")
        if self.video_backend not in BACKENDS:
            raise ValueError(f"dataset video_backend must be one of {BACKENDS}, got {self.video_backend!r}")
        if self.max_cache_gib <= 0:
            raise ValueError("dataset max_cache_gib must be > 0")


# ------------------------------------------------------------------------------------------------ the sampler
class ChunkSampler:
    """Shuffled minibatches of (observation, action chunk) from a LeRobotDataset v3, all in RAM.

    The same interface as ``TensorSampler``, so ``OfflineRunner`` uses it unchanged: ``sample()``, ``epoch``,
    ``state_dict``/``load_state_dict`` (the generator that orders samples and draws augmentation shifts, the epoch's
    permutation and the position in it: a resumed run draws exactly the batches, shifts included, of an
    uninterrupted one) and ``fingerprint()``.

    Without weights, each epoch is a permutation of all frames (the last partial batch dropped). With per-frame
    weights w (a tensor [num_frames] or a callable on ``columns()``), each batch draws B frames with replacement,
    P(frame i) = w_i / Σ w (e.g. oversampling high-advantage frames), and ``epoch`` counts num_frames draws.

    Args:
        cfg: the dataset and how to sample it.
        weights: optional per-frame sampling weights (see ``set_weights``).

    Raises:
        DatasetError: the folder is not a v3 dataset, lacks a feature, holds NaN, a truncated file, ...
    """

    def __init__(self, cfg: ChunkDatasetConfig, weights: Weights | None = None) -> None:
        self.cfg = cfg
        self.meta = read_meta(cfg.root)
        self.repo_id = cfg.repo_id or Path(cfg.root).resolve().name
        meta = self.meta
        cams = meta.camera_keys if cfg.cameras is None else [camera_key(c) for c in cfg.cameras]
        meta.require(cameras=cams, columns=[keys.OBS_STATE, keys.ACTION_COL, *cfg.extra_columns])
        self.image_keys = cams
        all_eps = meta.episodes["episode_index"].astype(np.int64)
        episodes = all_eps if cfg.episodes is None else np.unique(np.asarray(cfg.episodes, dtype=np.int64))
        unknown = np.setdiff1d(episodes, all_eps)
        if len(unknown):
            raise DatasetError(f"dataset {meta.root} has no episode {int(unknown[0])} (episodes "
                               f"{int(all_eps.min())}..{int(all_eps.max())})")
        selected = len(episodes)
        if cfg.timing_check:
            episodes = drop_late_episodes(meta, episodes)
        self.timing_dropped = selected - len(episodes)  # episodes left out for late ticks
        frames = read_frames(meta, episodes, [keys.OBS_STATE, keys.ACTION_COL, *cfg.extra_columns])
        cols = frames.columns
        self.num_frames, self.num_episodes = len(cols["index"]), len(episodes)
        if self.num_frames < cfg.batch_size:
            raise DatasetError(f"dataset {meta.root} has {self.num_frames} frames, fewer than batch_size "
                               f"{cfg.batch_size}")
        self.tasks = list(meta.tasks)
        self.state = torch.from_numpy(cols[keys.OBS_STATE].astype(np.float32))
        self.action = torch.from_numpy(cols[keys.ACTION_COL].astype(np.float32))
        self.indices = {c: torch.from_numpy(cols[c].astype(np.int64).reshape(-1)) for c in INDEX_COLUMNS}
        self.task_index = cols["task_index"].astype(np.int64).reshape(-1)
        self.extras = {c: _extra_tensor(c, cols[c], meta.features[c]) for c in cfg.extra_columns}
        self.ep_start, self.ep_end = torch.from_numpy(frames.ep_start), torch.from_numpy(frames.ep_end)
        # The element names of state and action ("shoulder_pan.pos", ...), for the policy's processor.
        self.names = {k: feature_names(meta.features[k]) for k in (keys.OBS_STATE, keys.ACTION_COL)}
        self.images = self._decode(frames)
        self._files = sorted({*frames.files, *self._video_files(frames)})
        self.stats: dict[str, dict[str, torch.Tensor]] = {}  # feature -> {"mean", "std", "min", "max": [D]}
        self.stats_source: dict[str, str] = {}  # feature -> "meta/stats.json" or "computed"
        for name, values in ((keys.OBS_STATE, cols[keys.OBS_STATE]), (keys.ACTION_COL, cols[keys.ACTION_COL])):
            computed = compute_stats(values)
            every = cfg.episodes is None and not self.timing_dropped  # meta/stats.json covers every episode
            from_file = stats_from_file(meta, name, computed) if every else None
            self.stats_source[name] = STATS_PATH if from_file is not None else "computed"
            self.stats[name] = {s: torch.tensor(v, dtype=torch.float32) for s, v in (from_file or computed).items()}
        self._hist = torch.arange(-cfg.history + 1, 1)
        self._chunk = torch.arange(cfg.horizon)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.perm = torch.randperm(self.num_frames, generator=self.gen)
        self.pos, self.epoch, self.drawn = 0, 0, 0
        self._fingerprint = self._hash_sources()
        self.set_weights(weights)

    # -------------------------------------------------------------------------------------- construction
    def _decode(self, frames: Frames) -> dict[str, torch.Tensor]:
        meta, cfg = self.meta, self.cfg
        sizes = {k: tuple(cfg.image_size) if cfg.image_size else image_hw(meta.features[k]) for k in self.image_keys}
        gib = sum(self.num_frames * 3 * h * w for h, w in sizes.values()) / 2**30
        if gib > cfg.max_cache_gib:
            raise DatasetError(f"dataset {meta.root}: {len(sizes)} cameras x {self.num_frames} frames at "
                               f"{sorted(set(sizes.values()))} need {gib:.1f} GiB of RAM, over max_cache_gib="
                               f"{cfg.max_cache_gib}; set image_size smaller or select episodes")
        videos = [k for k in self.image_keys if meta.features[k]["dtype"] == "video"]
        self.video_backend = None
        if videos:
            try:
                self.video_backend = resolve_backend(cfg.video_backend)
            except DecodeError as e:
                raise DatasetError(str(e)) from None
        from tqdm import tqdm

        images = {}
        with tqdm(total=self.num_frames * len(sizes), desc=f"decoding {self.repo_id}", unit="frame",
                  disable=not cfg.progress or not sizes, leave=False) as bar:
            for key, (h, w) in sizes.items():
                images[key] = torch.empty(self.num_frames, 3, h, w, dtype=torch.uint8)
                if key in videos:
                    decode_videos(meta, frames, key, images[key], self.video_backend, bar)
                else:
                    decode_images(meta, frames, key, images[key], bar)
        return images

    def _video_files(self, frames: Frames) -> list[Path]:
        eps, meta = self.meta.episodes, self.meta
        sel = np.isin(eps["episode_index"], np.unique(frames.columns["episode_index"]))
        out = []
        for key in self.image_keys:
            if meta.features[key]["dtype"] == "video":
                chunks, files = eps[f"videos/{key}/chunk_index"][sel], eps[f"videos/{key}/file_index"][sel]
                pairs = zip(chunks.tolist(), files.tolist(), strict=True)
                out += [meta.root / meta.info["video_path"].format(video_key=key, chunk_index=c, file_index=f)
                        for c, f in set(pairs)]
        return out

    # -------------------------------------------------------------------------------------- what it holds
    @property
    def features(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Tensor entries of a batch -> (per-sample shape, dtype); the task strings are listed in ``tasks``."""
        k, h = self.cfg.history, self.cfg.horizon
        hist = (k,) if k > 1 else ()
        out = {keys.OBS_STATE: ((*hist, self.state.shape[1]), torch.float32)}
        out.update({key: ((*hist, *img.shape[1:]), torch.float32) for key, img in self.images.items()})
        out[keys.ACTION_COL] = ((h, self.action.shape[1]), torch.float32)
        out[keys.ACTION_IS_PAD] = ((h,), torch.bool)
        out.update({c: ((), torch.int64) for c in INDEX_COLUMNS})
        out.update({c: (tuple(t.shape[1:]), t.dtype) for c, t in self.extras.items()})
        return out

    def columns(self) -> dict[str, torch.Tensor]:
        """Every loaded frame, one row each ([num_frames, ...]): state, the frame's own action [N, A], the index
        columns and the extra columns (what a weights callable sees)."""
        return {keys.OBS_STATE: self.state, keys.ACTION_COL: self.action, **self.indices, **self.extras}

    def set_weights(self, weights: Weights | None) -> None:
        """Per-frame sampling weights: a tensor [num_frames] (>= 0, finite, not all 0), a callable mapping
        ``columns()`` to one, or None (uniform epochs). Resuming checks the weights are the same."""
        if callable(weights):
            weights = weights(self.columns())
        if weights is not None:
            weights = torch.as_tensor(weights, dtype=torch.float64).reshape(-1)
            if len(weights) != self.num_frames or not torch.isfinite(weights).all() or (weights < 0).any() \
                    or weights.sum() <= 0:
                raise ValueError(f"sampling weights must be [num_frames={self.num_frames}], finite, >= 0 and not all "
                                 f"zero (got shape {list(weights.shape)})")
        self.weights = weights
        self._weights_sha = "" if weights is None else hashlib.sha256(weights.numpy().tobytes()).hexdigest()

    def fingerprint(self) -> str:
        """sha256 of what batches are made of: the source files read (info, tasks, data and video bytes, hashed at
        construction) and the view of them (episodes, cameras, image size, horizon, history, extra columns)."""
        return self._fingerprint

    def _hash_sources(self) -> str:
        h, cfg = hashlib.sha256(), self.cfg
        view = {"episodes": np.unique(self.indices["episode_index"].numpy()).tolist(), "cameras": self.image_keys,
                "sizes": [list(t.shape[2:]) for t in self.images.values()], "horizon": cfg.horizon,
                "history": cfg.history, "extra_columns": list(cfg.extra_columns)}
        h.update(json.dumps(view, sort_keys=True).encode())
        for path in [self.meta.root / INFO_PATH, self.meta.root / TASKS_PATH, *self._files]:
            h.update(str(path.relative_to(self.meta.root)).encode())
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
        return h.hexdigest()

    # -------------------------------------------------------------------------------------- sampling
    def _next_indices(self) -> torch.Tensor:
        b = self.cfg.batch_size
        if self.weights is not None:
            idx = torch.multinomial(self.weights, b, replacement=True, generator=self.gen)
            self.drawn += b
            self.epoch = self.drawn // self.num_frames
            return idx
        if self.pos + b > self.num_frames:
            self.perm = torch.randperm(self.num_frames, generator=self.gen)
            self.pos, self.epoch = 0, self.epoch + 1
        idx = self.perm[self.pos:self.pos + b]
        self.pos += b
        return idx

    def sample(self) -> dict[str, Any]:
        """The next batch (see the module docstring for its entries and shapes)."""
        return self.batch(self._next_indices())

    def batch(self, idx: torch.Tensor) -> dict[str, Any]:
        """The batch of frames ``idx`` (int64 [B]); augmentation shifts come from the sampler's generator."""
        squeeze = self.cfg.history == 1
        hist = torch.maximum(idx[:, None] + self._hist, self.ep_start[idx][:, None])  # [B, K]
        last = self.ep_end[idx][:, None]
        chunk = idx[:, None] + self._chunk  # [B, H]
        is_pad = chunk > last
        state = self.state.index_select(0, hist.reshape(-1)).view(*hist.shape, -1)
        out: dict[str, Any] = {keys.OBS_STATE: state[:, 0] if squeeze else state}
        for key, cache in self.images.items():
            shifts = random_shifts(len(idx), self.cfg.augment_pad, self.gen) if self.cfg.augment else None
            img = gather_frames(cache, hist, shifts, self.cfg.augment_pad)
            out[key] = img[:, 0] if squeeze else img
        out[keys.TASK] = [self.tasks[t] for t in self.task_index[idx.numpy()].tolist()]
        out[keys.ACTION_COL] = self.action.index_select(0, torch.minimum(chunk, last).reshape(-1)).view(
            *chunk.shape, -1)
        out[keys.ACTION_IS_PAD] = is_pad
        out.update({c: t[idx] for c, t in self.indices.items()})
        out.update({c: t[idx] for c, t in self.extras.items()})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"gen": self.gen.get_state(), "perm": self.perm.clone(), "pos": self.pos, "epoch": self.epoch,
                "drawn": self.drawn, "weights": self._weights_sha}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if len(sd["perm"]) != self.num_frames:
            raise ValueError(f"the sampler state is for {len(sd['perm'])} frames, this dataset has {self.num_frames}")
        if sd.get("weights", "") != self._weights_sha:
            raise ValueError("the sampler state was drawn with other sampling weights (set the same weights first)")
        self.gen.set_state(sd["gen"])
        self.perm, self.pos, self.epoch, self.drawn = sd["perm"].clone(), int(sd["pos"]), int(sd["epoch"]), \
            int(sd["drawn"])


def _extra_tensor(name: str, values: np.ndarray, ft: dict) -> torch.Tensor:
    """A per-frame column as a tensor: [N] for shape-[1] features, [N, ...] otherwise; bool, int64 or float32."""
    kind = values.dtype.kind
    if kind not in "biuf":
        raise DatasetError(f"extra column {name!r} has dtype {ft.get('dtype')!r}: only numbers and bools batch")
    shape = tuple(ft.get("shape") or (1,))
    if values.size != len(values) * int(np.prod(shape)):
        raise DatasetError(f"extra column {name!r} holds {values.size // max(len(values), 1)} values per frame, "
                           f"meta/info.json says shape {list(shape)}")
    values = values.reshape(len(values), *shape)
    if shape == (1,):
        values = values[:, 0]
    dtype = np.bool_ if kind == "b" else np.int64 if kind in "iu" else np.float32
    return torch.from_numpy(np.ascontiguousarray(values.astype(dtype)))
