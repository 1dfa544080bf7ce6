"""Reading a LeRobotDataset v3 from disk, checked: metadata, the frame table, camera frames, statistics.

The v3 layout, as LeRobot 0.6.1 writes it (read here with pyarrow and PyAV, without LeRobot's Hub machinery, so
a folder that is not a dataset fails at once instead of trying a download):

    meta/info.json                          fps, features {name: dtype, shape, names}, data_path, video_path
    meta/stats.json                         per-feature mean/std/min/max (optional)
    meta/tasks.parquet                      task string -> task_index
    meta/episodes/chunk-*/file-*.parquet    one row per episode: length, data file, per camera its video file and
                                            from/to timestamps (several episodes share one file)
    data/chunk-*/file-*.parquet             one row per frame: episode_index, frame_index, index, timestamp,
                                            task_index, observation.state, action, extra columns
    videos/<key>/chunk-*/file-*.mp4         several episodes back to back

Every problem is a ``DatasetError`` whose one-line message names the file, the episode and the field. Nothing is
ever written under the dataset's root.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from policies import keys
from robot_rl.data.decode_process import decode_file
from robot_rl.data.video_decode import DecodeError, FileTargets, decode_image_bytes

log = logging.getLogger(__name__)

INFO_PATH, STATS_PATH, TASKS_PATH = "meta/info.json", "meta/stats.json", "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"


class DatasetError(ValueError):
    """A dataset that cannot be trained on. The message is one line naming the file, episode and field."""


def camera_key(camera: str) -> str:
    """A camera's feature key: "front" -> "observation.images.front" (keys pass through)."""
    return camera if camera.startswith(keys.OBS_IMAGES) else keys.lerobot_image_key(camera)


# ------------------------------------------------------------------------------------------------ metadata
@dataclass
class DatasetMeta:
    """What ``meta/`` says about a dataset: cheap to read, enough to check it against a policy before decoding."""

    root: Path
    info: dict[str, Any]  # meta/info.json
    episodes: dict[str, np.ndarray]  # meta/episodes columns (stats/* left out), [E] each, sorted by episode_index
    tasks: list[str]  # by task_index
    stats: dict[str, Any] | None  # meta/stats.json, None when absent or unreadable

    @property
    def fps(self) -> float:
        return float(self.info["fps"])

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return self.info["features"]

    @property
    def camera_keys(self) -> list[str]:
        """RGB cameras, stored as video or as images (depth maps left out)."""
        return [k for k, ft in self.features.items() if ft.get("dtype") in ("video", "image") and not _is_depth(ft)]

    def require(self, state: int | None = None, action: int | None = None, cameras: Sequence[str] = (),
                columns: Sequence[str] = ()) -> None:
        """Raise one DatasetError listing everything a policy needs that the dataset lacks or shapes differently.

        Args:
            state: the size of ``observation.state`` the policy reads (None: not checked).
            action: the action size it writes.
            cameras: cameras it reads (names or keys).
            columns: other per-frame columns it needs (``next.success``, ``intervention``, ...).
        """
        problems = []
        for name, size in ((keys.OBS_STATE, state), (keys.ACTION_COL, action)):
            if size is None:
                continue
            if name not in self.features:
                problems.append(f"no {name!r} feature (the policy needs {size} values)")
            elif tuple(self.features[name].get("shape", ())) != (size,):
                problems.append(f"{name!r} has shape {list(self.features[name].get('shape', ()))}, the policy needs "
                                f"[{size}]")
        for cam in cameras:
            if camera_key(cam) not in self.camera_keys:
                problems.append(f"no camera {camera_key(cam)!r} (RGB cameras: {self.camera_keys or 'none'})")
        problems += [f"no column {c!r}" for c in columns if c not in self.features]
        if problems:
            raise DatasetError(f"dataset {self.root} does not fit: " + "; ".join(problems))


def read_meta(root: str | Path) -> DatasetMeta:
    """Read and check ``meta/`` of a v3 dataset; DatasetError naming the file when it is not one."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} does not exist")
    info_path = root / INFO_PATH
    if not info_path.is_file():
        raise DatasetError(f"{root} is not a LeRobotDataset v3 folder: {INFO_PATH} is missing")
    try:
        info = json.loads(info_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{info_path} is not readable JSON ({type(e).__name__}: {e})") from None
    if not isinstance(info, dict):
        raise DatasetError(f"{info_path} is not a JSON object (it holds a {type(info).__name__})")
    version = str(info.get("codebase_version", ""))
    if not version.startswith("v3."):
        raise DatasetError(f"{root} is not a LeRobotDataset v3 folder: {INFO_PATH} says codebase_version "
                           f"{version or 'nothing'!r} (v2.1 converts with lerobot.scripts.convert_dataset_v21_to_v30)")
    for name, kind in (("fps", (int, float)), ("features", dict), ("data_path", str)):
        if not isinstance(info.get(name), kind) or isinstance(info.get(name), bool):
            raise DatasetError(f"{info_path}: field {name!r} is missing or malformed")
    if not (math.isfinite(info["fps"]) and info["fps"] > 0):
        raise DatasetError(f"{info_path}: fps must be a positive number, got {info['fps']!r}")
    for key, ft in info["features"].items():
        shape = ft.get("shape") if isinstance(ft, dict) else None
        if not isinstance(ft, dict) or not isinstance(ft.get("dtype"), str) or not isinstance(shape, list | tuple) \
                or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
            raise DatasetError(f"{info_path}: feature {key!r} is malformed (a dtype name and a shape of positive "
                               f"integers expected): {str(ft)[:200]}")
    has_video = any(ft.get("dtype") == "video" for ft in info["features"].values())
    if has_video and not isinstance(info.get("video_path"), str):
        raise DatasetError(f"{info_path}: the dataset has video features but no 'video_path'")
    for name, fields in (("data_path", {}), ("video_path", {"video_key": "k"})):
        if name in info and (name == "data_path" or has_video):
            try:
                str(info[name]).format(chunk_index=0, file_index=0, **fields)
            except (KeyError, IndexError, ValueError) as e:
                raise DatasetError(f"{info_path}: {name} {info[name]!r} is not a path template ({e!r})") from None
    episodes = _read_episodes(root, info)
    counted = {"total_episodes": len(episodes["episode_index"]),
               "total_frames": int(np.asarray(episodes["length"], dtype=np.int64).sum())}
    for name, n in counted.items():  # the totals LeRobot's tools and a mix's numbering read
        if name in info and (not isinstance(info[name], int) or info[name] != n):
            raise DatasetError(f"{info_path}: {name} is {info[name]!r} but {EPISODES_DIR} holds {n} "
                               f"({'episodes' if name == 'total_episodes' else 'frames over its episodes'}): "
                               f"a write that did not finish, or an edit of one file and not the other")
    return DatasetMeta(root, info, episodes, _read_tasks(root), _read_stats(root))


def _read_episodes(root: Path, info: dict) -> dict[str, np.ndarray]:
    files = sorted((root / EPISODES_DIR).glob("chunk-*/file-*.parquet"))
    if not files:
        raise DatasetError(f"{root} is not a LeRobotDataset v3 folder: no {EPISODES_DIR}/chunk-*/file-*.parquet")
    needed = ["episode_index", "length", "data/chunk_index", "data/file_index"]
    for key, ft in info["features"].items():
        if ft.get("dtype") == "video":
            needed += [f"videos/{key}/chunk_index", f"videos/{key}/file_index", f"videos/{key}/from_timestamp"]
    cols: dict[str, list] = {}
    for path in files:
        try:
            names = [n for n in pq.read_schema(path).names if not n.startswith("stats/")]
            table = pq.read_table(path, columns=names)
            values = {col: table.column(col).to_pylist() for col in table.column_names}
        except (OSError, ValueError, MemoryError, pa.ArrowException) as e:  # ValueError: text that is not UTF-8, ...
            raise DatasetError(f"episode metadata {path} is unreadable ({type(e).__name__}: {e})") from None
        for col in needed:
            if col not in values:
                raise DatasetError(f"episode metadata {path} has no column {col!r}")
        for col, v in values.items():
            cols.setdefault(col, []).extend(v)
    order = np.argsort(np.asarray(cols["episode_index"], dtype=np.int64), kind="stable")
    eps = {k: np.asarray(v, dtype=object if k == "tasks" else None)[order] for k, v in cols.items()
           if len(v) == len(order)}
    if len(np.unique(eps["episode_index"])) != len(order):
        raise DatasetError(f"{root / EPISODES_DIR} lists an episode twice")
    return eps


def _read_tasks(root: Path) -> list[str]:
    path = root / TASKS_PATH
    if not path.is_file():
        raise DatasetError(f"{root} is not a LeRobotDataset v3 folder: {TASKS_PATH} is missing")
    try:  # plain columns (LeRobot's pandas index "task" is one): no pandas metadata to trust
        table = pq.read_table(path).to_pydict()
    except (OSError, ValueError, MemoryError, pa.ArrowException) as e:  # ValueError: text that is not UTF-8, ...
        raise DatasetError(f"task table {path} is unreadable ({type(e).__name__}: {str(e)[:200]})") from None
    if "task_index" not in table or "task" not in table:
        raise DatasetError(f"task table {path} has no column {'task_index' if 'task_index' not in table else 'task'!r}")
    index, texts = table["task_index"], table["task"]
    if sorted(i if isinstance(i, int) else -1 for i in index) != list(range(len(index))):
        raise DatasetError(f"task table {path}: task_index must number its {len(index)} tasks 0..{len(index) - 1} "
                           "once each")
    tasks = [""] * len(index)
    for text, i in zip(texts, index, strict=True):
        tasks[i] = str(text)
    return tasks


def _read_stats(root: Path) -> dict | None:
    path = root / STATS_PATH
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        log.warning("%s is unreadable (%s); statistics are computed from the data", path, type(e).__name__)
        return None


def _is_depth(ft: dict) -> bool:
    info = ft.get("info") or {}
    return bool(info.get("is_depth_map") or info.get("video.is_depth_map"))


def image_hw(ft: dict) -> tuple[int, int]:
    """(h, w) of an image feature, from its shape and axis names (v3 stores [h, w, c])."""
    shape, names = list(ft["shape"]), ft.get("names") or []
    if len(shape) == 3 and list(names)[:3] == ["channels", "height", "width"]:
        return int(shape[1]), int(shape[2])
    return int(shape[0]), int(shape[1])


def feature_names(ft: dict) -> list[str]:
    """The element names of a vector feature (``["shoulder_pan.pos", ...]``), [] when it has none."""
    names = ft.get("names")
    if isinstance(names, dict):  # older datasets: {"motors": [...]}
        names = next(iter(names.values()), [])
    return [str(n) for n in names] if isinstance(names, list) else []


# ------------------------------------------------------------------------------------------------ frames
@dataclass
class Frames:
    """The selected episodes' rows, sorted by (episode_index, frame_index)."""

    columns: dict[str, np.ndarray]  # name -> [N, ...]
    file_of_row: np.ndarray  # int64 [N]: which data file
    row_in_file: np.ndarray  # int64 [N]
    files: list[Path]
    ep_start: np.ndarray  # int64 [N]: row of the episode's first frame
    ep_end: np.ndarray  # int64 [N]: row of its last frame


def read_frames(meta: DatasetMeta, episodes: np.ndarray, wanted: list[str]) -> Frames:
    """Read the columns ``wanted`` (+ the index columns) of ``episodes`` from their data files and check them."""
    eps = meta.episodes
    pos = {int(e): i for i, e in enumerate(eps["episode_index"])}
    by_file: dict[tuple[int, int], list[int]] = {}
    for e in episodes.tolist():
        i = pos[e]
        by_file.setdefault((int(eps["data/chunk_index"][i]), int(eps["data/file_index"][i])), []).append(e)
    columns = ["episode_index", "frame_index", "index", "timestamp", "task_index", *wanted]
    parts: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    files, file_of_row, row_in_file = [], [], []
    for (chunk, file), file_eps in sorted(by_file.items()):
        path = meta.root / meta.info["data_path"].format(chunk_index=chunk, file_index=file)
        where = f"data file {path} (episodes {_span(file_eps)})"
        if not path.is_file():
            raise DatasetError(f"{where} is missing")
        corrupt = (OSError, ValueError, MemoryError, pa.ArrowException)  # what pyarrow raises for a damaged file
        try:
            missing = [c for c in columns if c not in pq.read_schema(path).names]
            if not missing:
                table = pq.read_table(path, columns=columns)
        except corrupt as e:
            raise DatasetError(f"{where} is unreadable, truncated or corrupt ({type(e).__name__}: "
                               f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
        if missing:
            raise DatasetError(f"{where} has no column {missing[0]!r}")
        ep_col = _numpy(table, "episode_index", where)
        keep = np.flatnonzero(np.isin(ep_col, file_eps))
        for c in columns:
            parts[c].append(_numpy(table, c, where, rows=keep))
        files.append(path)
        file_of_row.append(np.full(len(keep), len(files) - 1, dtype=np.int64))
        row_in_file.append(keep.astype(np.int64))
    cols = {c: np.concatenate(v) for c, v in parts.items()}
    for c in wanted:  # each column as meta/info.json declares it (RELIABILITY C3)
        ft = meta.features.get(c)
        if ft is None or ft["dtype"] in ("video", "image", "string", "language"):
            continue
        try:
            np.dtype(ft["dtype"])
        except TypeError:
            raise DatasetError(f"{INFO_PATH}: feature {c!r} has dtype {ft['dtype']!r}, which is no number type") from None
        width, declared = (cols[c].shape[1] if cols[c].ndim == 2 else 1), math.prod(ft["shape"])
        if width != declared:
            raise DatasetError(f"data files hold {width} values per frame in {c!r}, {INFO_PATH} declares shape "
                               f"{list(ft['shape'])}")
    order = np.lexsort((cols["frame_index"], cols["episode_index"]))
    cols = {c: v[order] for c, v in cols.items()}
    file_of_row, row_in_file = np.concatenate(file_of_row)[order], np.concatenate(row_in_file)[order]
    ep_start, ep_end = _check_frames(meta, episodes, cols, files, file_of_row)
    return Frames(cols, file_of_row, row_in_file, files, ep_start, ep_end)


def _span(eps: list[int]) -> str:
    return ", ".join(map(str, eps)) if len(eps) <= 6 else f"{eps[0]}-{eps[-1]}"


def _numpy(table: pa.Table, name: str, where: str, rows: np.ndarray | None = None) -> np.ndarray:
    """A column as numpy, [R] for scalars and [R, d] for fixed-length lists; nulls and ragged lists refused."""
    col = table.column(name).combine_chunks()
    if rows is not None:
        col = col.take(pa.array(rows))
    if col.null_count:
        raise DatasetError(f"{where}: column {name!r} has {col.null_count} null values")
    if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) or pa.types.is_large_list(col.type):
        flat = col.flatten()
        width = len(flat) // max(len(col), 1)
        if len(flat) != width * len(col) or flat.null_count:
            raise DatasetError(f"{where}: column {name!r} has rows of different lengths or null elements")
        return flat.to_numpy(zero_copy_only=False).reshape(len(col), width)
    return col.to_numpy(zero_copy_only=False)


def _check_frames(meta: DatasetMeta, episodes: np.ndarray, cols: dict[str, np.ndarray], files: list[Path],
                  file_of_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per episode: rows present, frame_index 0..L-1, length as meta says, the global index contiguous (and unique in
    the dataset), timestamps 1/fps apart, task known, state/action/float columns finite. Returns each row's episode
    start and end rows."""
    ep = cols["episode_index"]
    uniq, start, count = np.unique(ep, return_index=True, return_counts=True)

    def where(e: int) -> str:
        rows = np.flatnonzero(ep == e)
        return f"episode {e} (data file {files[file_of_row[rows[0]]]})" if len(rows) else f"episode {e}"

    absent = np.setdiff1d(episodes, uniq)
    if len(absent):
        raise DatasetError(f"episode {int(absent[0])} has no rows in its data file (meta/episodes lists it)")
    pos = {int(e): i for i, e in enumerate(meta.episodes["episode_index"])}
    for e, n in zip(uniq.tolist(), count.tolist(), strict=True):
        if n != int(meta.episodes["length"][pos[e]]):
            raise DatasetError(f"{where(e)} has {n} rows, meta/episodes says length {meta.episodes['length'][pos[e]]}")
    first = np.repeat(start, count)
    bad = np.flatnonzero(cols["frame_index"] != np.arange(len(ep)) - first)
    if len(bad):
        r = int(bad[0])
        raise DatasetError(f"{where(int(ep[r]))}: field 'frame_index' is not 0..length-1 (its row {r - first[r]} "
                           f"holds {int(cols['frame_index'][r])})")
    # The global index (what labels and sidecars key frames by): index[first] + frame_index in each episode, and no
    # value twice in the dataset
    index = cols["index"].astype(np.int64).reshape(len(ep))
    bad = np.flatnonzero(index != index[first] + (np.arange(len(ep)) - first))
    if len(bad):
        r = int(bad[0])
        raise DatasetError(f"{where(int(ep[r]))}: field 'index' is not contiguous within the episode (frame "
                           f"{r - first[r]} holds {int(index[r])}, expected {int(index[first[r]]) + r - first[r]})")
    uniq_index, seen = np.unique(index, return_counts=True)
    if (seen > 1).any():
        dup = int(uniq_index[np.flatnonzero(seen > 1)[0]])
        eps_with = sorted({int(e) for e in ep[index == dup]})
        raise DatasetError(f"field 'index' holds {dup} more than once (episodes {eps_with}): each frame needs its own "
                           f"global index")
    ts = cols["timestamp"].astype(np.float64).reshape(len(ep))
    step = np.diff(ts)
    same = ep[1:] == ep[:-1]
    bad = np.flatnonzero(same & (np.abs(step - 1.0 / meta.fps) > 1e-4 + 1e-6 * np.abs(ts[1:])))
    if len(bad):
        r = bad[0] + 1
        raise DatasetError(f"{where(int(ep[r]))}: field 'timestamp' jumps by {step[bad[0]]:.6f} s at frame "
                           f"{int(cols['frame_index'][r])} (1/fps = {1.0 / meta.fps:.6f} s)")
    bad = np.flatnonzero((cols["task_index"] < 0) | (cols["task_index"] >= len(meta.tasks)))
    if len(bad):
        raise DatasetError(f"{where(int(ep[bad[0]]))}: field 'task_index' = {int(cols['task_index'][bad[0]])} is not "
                           f"in {TASKS_PATH} ({len(meta.tasks)} tasks)")
    for name, values in cols.items():
        if values.dtype.kind != "f":
            continue
        finite = np.isfinite(values.reshape(len(ep), -1)).all(axis=1)
        if not finite.all():
            r = int(np.flatnonzero(~finite)[0])
            raise DatasetError(f"{where(int(ep[r]))}: field {name!r} is NaN or infinite at frame "
                               f"{int(cols['frame_index'][r])}")
    return first, first + np.repeat(count, count) - 1


# ------------------------------------------------------------------------------------------------ images
def decode_videos(meta: DatasetMeta, frames: Frames, key: str, cache: torch.Tensor, backend: str,
                  bar: Any) -> None:
    """Fill ``cache`` (uint8 [N, 3, h, w]) with camera ``key``, one video file at a time."""
    eps = meta.episodes
    ep = frames.columns["episode_index"]
    idx = np.searchsorted(eps["episode_index"], ep)  # each row's line in meta/episodes (sorted by episode_index)
    chunk = eps[f"videos/{key}/chunk_index"][idx].astype(np.int64)
    file = eps[f"videos/{key}/file_index"][idx].astype(np.int64)
    # Episode e's frame at ``timestamp`` is the file's frame shown at from_timestamp[e] + timestamp.
    times = eps[f"videos/{key}/from_timestamp"][idx].astype(np.float64) + frames.columns["timestamp"].reshape(-1)
    for c, f in sorted(set(zip(chunk.tolist(), file.tolist(), strict=True))):
        rows = np.flatnonzero((chunk == c) & (file == f))
        rows = rows[np.argsort(times[rows], kind="stable")]
        path = meta.root / meta.info["video_path"].format(video_key=key, chunk_index=c, file_index=f)
        targets = FileTargets(path, times[rows], rows.astype(np.int64), ep[rows].astype(np.int64))
        try:
            decode_file(backend, targets, cache.numpy(), tolerance_s=0.25 / meta.fps, on_progress=bar.update)
        except DecodeError as e:
            raise DatasetError(f"camera {key!r}, episodes {_span(sorted(set(ep[rows].tolist())))}: {e}") from None


def decode_images(meta: DatasetMeta, frames: Frames, key: str, cache: torch.Tensor, bar: Any) -> None:
    """Fill ``cache`` with an ``image`` feature (PNG bytes in the data parquet), one data file at a time."""
    h, w = cache.shape[2], cache.shape[3]
    for f, path in enumerate(frames.files):
        rows = np.flatnonzero(frames.file_of_row == f)
        try:
            column = pq.read_table(path, columns=[key]).column(key).combine_chunks()
            data = column.field("bytes").take(pa.array(frames.row_in_file[rows])).to_pylist()
            for r, blob in zip(rows.tolist(), data, strict=True):
                if blob is None:
                    raise DecodeError(f"no image bytes in row {frames.row_in_file[r]}")
                cache[r] = torch.from_numpy(decode_image_bytes(blob, h, w))
        except (OSError, pa.ArrowException, DecodeError, ValueError) as e:
            raise DatasetError(f"data file {path}, camera {key!r}: image unreadable ({type(e).__name__}: "
                               f"{str(e)[:200]})") from None
        bar.update(len(rows))


# ------------------------------------------------------------------------------------------------ statistics
def compute_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """mean, std (population, as LeRobot's), min, max over the rows of x [N, D], in float64."""
    x = x.astype(np.float64)
    return {"mean": x.mean(0), "std": x.std(0), "min": x.min(0), "max": x.max(0)}


def stats_from_file(meta: DatasetMeta, name: str, computed: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """meta/stats.json's mean/std/min/max of ``name`` when present, finite, of the right shape and in agreement
    with the data (a stale file is not used); else None."""
    entry = (meta.stats or {}).get(name)
    if not isinstance(entry, dict):
        return None
    try:
        got = {s: np.asarray(entry[s], dtype=np.float64).reshape(-1) for s in ("mean", "std", "min", "max")}
    except (KeyError, TypeError, ValueError):
        return None
    ok = all(v.shape == computed[s].shape and np.isfinite(v).all() for s, v in got.items())
    scale = 1e-4 * (1.0 + np.abs(computed["max"] - computed["min"]))
    ok = ok and all(np.all(np.abs(got[s] - computed[s]) <= scale) for s in got)
    if not ok:
        log.warning("%s: the statistics of %r do not match the data; they are computed from it instead",
                    meta.root / STATS_PATH, name)
        return None
    return got
