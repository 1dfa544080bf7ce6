"""Training batches of action chunks from any LeRobotDataset v3 on disk (ours, or one recorded by LeRobot's tools).

Everything is read once at construction (``lerobot_format``: checked metadata and frame table; every camera decoded
file by file into a uint8 cache in RAM at the requested size), so ``sample()`` only gathers from RAM. Only reads:
nothing is ever written under the dataset's root. ``mix`` adds more datasets, read the same way and joined as one
sequence of episodes (``episode_offsets``).

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
import sys
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

__all__ = ["ChunkDatasetConfig", "ChunkSampler", "DatasetError", "DatasetMeta", "camera_key", "check_mixable",
           "episode_offsets", "numbered_episodes", "read_meta"]

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
    # More LeRobotDataset v3 folders whose episodes train beside root's, read in place (e.g. LeRobot-recorded demos
    # of a real arm and our simulated ones, or demos and a DAgger rollout): the same state and action sizes and
    # names, root's cameras at the same stored size (or set image_size). Episodes are numbered in one sequence:
    # root's as stored, then each mixed dataset's shifted past the one before (``episode_offsets``).
    mix: list[str] = field(default_factory=list)
    # Extra columns a dataset may lack, read there as zeros (False): e.g. ``intervention`` for demos recorded with
    # lerobot-record beside a rollout that has it. Every other extra column must be in every dataset.
    fill_missing: list[str] = field(default_factory=list)
    episodes: list[int] | None = None  # episode indices to load (a split; mixed datasets' as numbered); None: all
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
        metas = [read_meta(cfg.root), *(read_meta(r) for r in cfg.mix)]
        self.meta, self.metas = metas[0], metas
        self.repo_id = cfg.repo_id or Path(cfg.root).resolve().name
        cams = metas[0].camera_keys if cfg.cameras is None else [camera_key(c) for c in cfg.cameras]
        self.image_keys = cams
        extras = list(cfg.extra_columns)
        check_mixable(metas, cams, extras, cfg.fill_missing, cfg.image_size is None)
        # The element names of state and action ("shoulder_pan.pos", ...), for the policy's processor.
        self.names = {k: feature_names(metas[0].features[k]) for k in (keys.OBS_STATE, keys.ACTION_COL)}
        offsets = episode_offsets(metas)
        wanted = None if cfg.episodes is None else np.unique(np.asarray(cfg.episodes, dtype=np.int64))
        held = numbered_episodes(metas)
        if wanted is not None and len(np.setdiff1d(wanted, held)):
            raise DatasetError(f"dataset {cfg.root}{' (with the mixed ones)' if cfg.mix else ''} has no episode "
                               f"{int(np.setdiff1d(wanted, held)[0])} (episodes {int(held.min())}..{int(held.max())})")
        self.tasks: list[str] = []
        parts, self.timing_dropped, self._files = [], 0, []
        for m, offset in zip(metas, offsets):
            all_eps = m.episodes["episode_index"].astype(np.int64)
            episodes = all_eps if wanted is None else all_eps[np.isin(all_eps + offset, wanted)]
            selected = len(episodes)
            if cfg.timing_check:
                episodes = drop_late_episodes(m, episodes)
            self.timing_dropped += selected - len(episodes)  # episodes left out for late ticks
            present = [c for c in extras if c in m.features]
            frames = read_frames(m, episodes, [keys.OBS_STATE, keys.ACTION_COL, *present])
            parts.append((m, offset, frames, {}))
            self._files += [(len(parts) - 1, f) for f in sorted({*frames.files, *self._video_files(m, frames)})]
        for m, _, frames, _ in parts:  # one task list: root's order, then each new instruction as first met
            self.tasks += [t for t in m.tasks if t not in self.tasks]
        self.num_frames = sum(len(f.columns["index"]) for _, _, f, _ in parts)
        self.num_episodes = sum(len(np.unique(f.columns["episode_index"])) for _, _, f, _ in parts)
        if self.num_frames < cfg.batch_size:
            raise DatasetError(f"dataset {cfg.root} has {self.num_frames} frames, fewer than batch_size "
                               f"{cfg.batch_size}")
        # Where each dataset's episodes sit in the one numbering (what a user names episodes by in a mix)
        self.sources = [{"root": str(m.root), "offset": int(o), "episodes": len(np.unique(f.columns["episode_index"])),
                         "frames": len(f.columns["index"]), "first_episode": int(f.columns["episode_index"].min()) + o,
                         "last_episode": int(f.columns["episode_index"].max()) + o} for m, o, f, _ in parts]
        if cfg.mix:
            for src in self.sources:
                print(f"dataset.mix: {src['root']}: {src['episodes']} episodes, numbered {src['first_episode']}.."
                      f"{src['last_episode']} (its own + {src['offset']}), {src['frames']} frames", file=sys.stderr)
        rows = np.cumsum([0] + [len(f.columns["index"]) for _, _, f, _ in parts])
        self.images = self._image_cache()  # every dataset's frames decoded into their rows of one cache
        self.video_backend = None
        for (m, _, frames, _), r0, r1 in zip(parts, rows[:-1], rows[1:]):
            self._decode(m, frames, {k: cache[r0:r1] for k, cache in self.images.items()})
        # each dataset's global index shifted past the one before's: by its info.json total_frames (read_meta checked
        # it against the episodes), or past its highest index where info.json has none, so indices stay unique across
        # the mix (labels key frames by them)
        index_offsets = np.cumsum([0] + [max(int(m.info.get("total_frames", 0)),
                                             int(np.max(f.columns["index"], initial=-1)) + 1)
                                         for m, _, f, _ in parts[:-1]])
        cat = np.concatenate
        state = cat([f.columns[keys.OBS_STATE].astype(np.float32) for _, _, f, _ in parts])
        action = cat([f.columns[keys.ACTION_COL].astype(np.float32) for _, _, f, _ in parts])
        self.state, self.action = torch.from_numpy(state), torch.from_numpy(action)
        shift = {"episode_index": [o for _, o, _, _ in parts], "index": index_offsets.tolist(),
                 "frame_index": [0] * len(parts)}
        self.indices = {c: torch.from_numpy(cat([f.columns[c].astype(np.int64).reshape(-1) + shift[c][i]
                                                 for i, (_, _, f, _) in enumerate(parts)])) for c in INDEX_COLUMNS}
        self.task_index = cat([np.array([self.tasks.index(m.tasks[t]) for t in range(len(m.tasks))],
                                        dtype=np.int64)[f.columns["task_index"].astype(np.int64).reshape(-1)]
                               for m, _, f, _ in parts])
        self.extras = {c: self._extra(c, parts) for c in extras}
        self.ep_start = torch.from_numpy(cat([f.ep_start + r for (_, _, f, _), r in zip(parts, rows)]))
        self.ep_end = torch.from_numpy(cat([f.ep_end + r for (_, _, f, _), r in zip(parts, rows)]))
        self.stats: dict[str, dict[str, torch.Tensor]] = {}  # feature -> {"mean", "std", "min", "max": [D]}
        self.stats_source: dict[str, str] = {}  # feature -> "meta/stats.json" or "computed"
        for name, values in ((keys.OBS_STATE, state), (keys.ACTION_COL, action)):
            computed = compute_stats(values)
            # meta/stats.json covers every episode of one dataset
            every = cfg.episodes is None and not self.timing_dropped and not cfg.mix
            from_file = stats_from_file(self.meta, name, computed) if every else None
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
    def _extra(self, name: str, parts: list) -> torch.Tensor:
        """An extra column over every dataset; zeros (False) in those that lack it (``fill_missing``)."""
        have = [_extra_tensor(name, f.columns[name], m.features[name]) if name in m.features else None
                for m, _, f, _ in parts]
        like = next(t for t in have if t is not None)
        filled = [t if t is not None else torch.zeros(len(f.columns["index"]), *like.shape[1:], dtype=like.dtype)
                  for t, (_, _, f, _) in zip(have, parts)]
        return filled[0] if len(filled) == 1 else torch.cat(filled)

    def _image_cache(self) -> dict[str, torch.Tensor]:
        """uint8 [num_frames, 3, h, w] per camera, allocated once (at most ``max_cache_gib`` in all)."""
        cfg, meta, n = self.cfg, self.meta, self.num_frames
        sizes = {k: tuple(cfg.image_size) if cfg.image_size else image_hw(meta.features[k]) for k in self.image_keys}
        gib = sum(n * 3 * h * w for h, w in sizes.values()) / 2**30
        if gib > cfg.max_cache_gib:
            what = f"dataset {meta.root}" + (" with the mixed ones" if cfg.mix else "")
            raise DatasetError(f"{what}: {len(sizes)} cameras x {n} frames at {sorted(set(sizes.values()))} need "
                               f"{gib:.1f} GiB of RAM, over max_cache_gib={cfg.max_cache_gib}; set image_size smaller "
                               f"or select episodes")
        return {k: torch.empty(n, 3, h, w, dtype=torch.uint8) for k, (h, w) in sizes.items()}

    def _decode(self, meta: DatasetMeta, frames: Frames, images: dict[str, torch.Tensor]) -> None:
        """Decode one dataset's ``frames`` into ``images`` (camera -> its rows of the cache)."""
        cfg, n = self.cfg, len(frames.columns["index"])
        videos = [k for k in images if meta.features[k]["dtype"] == "video"]
        if videos and self.video_backend is None:
            try:
                self.video_backend = resolve_backend(cfg.video_backend)
            except DecodeError as e:
                raise DatasetError(str(e)) from None
        from tqdm import tqdm

        with tqdm(total=n * len(images), desc=f"decoding {meta.root.name}", unit="frame",
                  disable=not cfg.progress or not images, leave=False) as bar:
            for key, out in images.items():
                if key in videos:
                    decode_videos(meta, frames, key, out, self.video_backend, bar)
                else:
                    decode_images(meta, frames, key, out, bar)

    def _video_files(self, meta: DatasetMeta, frames: Frames) -> list[Path]:
        eps = meta.episodes
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
        files = [(i, m.root / name) for i, m in enumerate(self.metas) for name in (INFO_PATH, TASKS_PATH)]
        for i, path in sorted(files) + self._files:
            # relative to its dataset: a moved dataset keeps its fingerprint; a mixed one's paths carry its place
            rel = str(path.relative_to(self.metas[i].root))
            h.update((rel if i == 0 else f"mix{i}/{rel}").encode())
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
        hist = self._past_rows(idx, self._hist)  # [B, K]
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

    def state_lags(self, idx: torch.Tensor, lags: list[int] | tuple[int, ...]) -> torch.Tensor:
        """``observation.state`` of frames ``idx`` (int64 [B]) as it was ``lags`` (frames, each >= 1) earlier, the
        episode's first frame where the episode is younger: float32 [B, L, D] (``keys.OBS_STATE_LAGS``)."""
        lag = torch.as_tensor(list(lags), dtype=torch.long)
        if lag.numel() == 0 or bool((lag < 1).any()):
            raise ValueError(f"state lags must be frames back, each >= 1, got {list(lags)}")
        rows = self._past_rows(idx, -lag)  # [B, L]
        return self.state.index_select(0, rows.reshape(-1)).view(*rows.shape, -1)

    def _past_rows(self, idx: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Rows idx + offsets (offsets <= 0) [B, O], held at each frame's episode start (history and lags alike)."""
        return torch.maximum(idx[:, None] + offsets, self.ep_start[idx][:, None])

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


def check_mixable(metas: list[DatasetMeta], cameras: list[str], extras: list[str], fill_missing: list[str],
                  same_image_size: bool) -> None:
    """Raise one DatasetError naming the first dataset (root first, then ``mix``) that cannot train beside root: a
    feature it lacks (state, action, a camera, an extra column not in ``fill_missing``; an extra column no dataset
    has), another frame rate (a chunk of H frames would span another time), another state or action size or element
    names, or (``same_image_size``) another stored image size."""
    root, root_ft = metas[0].root, metas[0].features
    for c in extras:
        if not any(c in m.features for m in metas):
            where = f"dataset {root} and the mixed ones have" if len(metas) > 1 else f"dataset {root} has"
            raise DatasetError(f"{where} no column {c!r}")
    needed = [c for c in extras if c not in set(fill_missing)]
    metas[0].require(cameras=cameras, columns=[keys.OBS_STATE, keys.ACTION_COL, *needed])
    sizes = {k: int(root_ft[k]["shape"][0]) for k in (keys.OBS_STATE, keys.ACTION_COL)}
    for m in metas[1:]:
        if m.fps != metas[0].fps:
            raise DatasetError(f"dataset {m.root} was recorded at {m.fps:g} fps, {root} at {metas[0].fps:g}: an action "
                               "chunk of H frames would span another time in each; mix datasets of one rate")
        m.require(state=sizes[keys.OBS_STATE], action=sizes[keys.ACTION_COL], cameras=cameras, columns=needed)
        for k in sizes:
            if feature_names(m.features[k]) != feature_names(root_ft[k]):
                raise DatasetError(f"dataset {m.root} names {k!r} {feature_names(m.features[k])}, dataset {root} "
                                   f"{feature_names(root_ft[k])}: mixed datasets must hold the same quantities")
        for k in cameras if same_image_size else []:
            if image_hw(m.features[k]) != image_hw(root_ft[k]):
                raise DatasetError(f"dataset {m.root} stores {k!r} at {list(image_hw(m.features[k]))}, {root} at "
                                   f"{list(image_hw(root_ft[k]))}: set dataset.image_size to read both at one size")


def episode_offsets(metas: list[DatasetMeta]) -> list[int]:
    """What each dataset's episode_index is shifted by in a mix: 0 for the first; each next one starts after the
    highest episode index of the one before (as shifted). Example: episodes 0..9 and 0..4 -> offsets [0, 10]: the
    second dataset's episode 3 is episode 13."""
    out = [0]
    for m in metas[:-1]:
        out.append(out[-1] + int(np.max(m.episodes["episode_index"], initial=-1)) + 1)
    return out


def numbered_episodes(metas: list[DatasetMeta]) -> np.ndarray:
    """Every episode index of the datasets (root first), in the one numbering of a mix (``episode_offsets``)."""
    return np.concatenate([m.episodes["episode_index"].astype(np.int64).reshape(-1) + o
                           for m, o in zip(metas, episode_offsets(metas))])


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
