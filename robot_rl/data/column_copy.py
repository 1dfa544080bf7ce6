"""A copy of a LeRobotDataset v3 with one per-frame column set to new values (added where the source lacks it): how a
success classifier's labels (``robot_rl.rewards.success``) reach a recording that has no outcomes, without touching
the recording.

The source is only read. The copy is built in a hidden folder beside the destination (``.<name>.tmp-<id>``) and
renamed to the destination once complete, so an interrupted copy leaves no half-labelled dataset under the name a
user trains on. In the copy:

- every data file gets the column (its values matched to rows by the global ``index``), the rest of each file as
  it was, row for row;
- ``meta/episodes/*.parquet`` get the column's per-episode statistics ``stats/<column>/{min,max,mean,std,count,q..}``
  and ``meta/stats.json`` their aggregate, computed with LeRobot's own functions (``lerobot.datasets.compute_stats``),
  so the copy is the dataset LeRobot would have written with these values;
- ``meta/info.json`` declares the column (bool [1], LeRobot's ``next.success`` convention) where it was new, and the
  recorder's commit record (``meta/robot_rl_commit.json``, which ``robot-rl collect dataset.append=true`` restores
  ``info.json`` and ``stats.json`` from) holds the new ones;
- ``extra_files`` (relative path -> bytes) are added, e.g. a record of how the column was made.

Videos and every other file are copied byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from robot_rl.data.lerobot_format import EPISODES_DIR, INFO_PATH, STATS_PATH, DatasetError
from robot_rl.data.recorder import COMMIT_FILE

BOOL_FEATURE = {"dtype": "bool", "shape": [1], "names": None}


def check_destination(src: str | Path, dst: str | Path) -> None:
    """Refuse a destination that exists (a file, or a folder with anything in it) or lies inside the source or holds it.

    Raises:
        ValueError: naming the destination and why.
    """
    src_r, dst_r = Path(src).resolve(), Path(dst).resolve()
    if dst_r == src_r or src_r in dst_r.parents or dst_r in src_r.parents:
        raise ValueError(f"the labelled copy {dst} must lie outside the source dataset {src} (and not hold it): the "
                         f"source is never written")
    if dst_r.exists() and (not dst_r.is_dir() or any(dst_r.iterdir())):
        raise ValueError(f"{dst} already exists: the labelled copy goes to a new folder (give another out=)")


def write_column_copy(src: str | Path, dst: str | Path, column: str, index: np.ndarray, values: np.ndarray,
                      extra_files: dict[str, bytes] | None = None) -> Path:
    """Copy the dataset at ``src`` to ``dst`` with ``column`` (bool) = ``values[i]`` on the frame whose global
    ``index`` is ``index[i]`` (both [F], every frame of the dataset once). Returns ``dst``.

    Raises:
        ValueError: ``dst`` not free (``check_destination``), or the source's column is not one bool/number per frame.
        DatasetError: a frame of the data files without a value, or an unreadable file.
    """
    src, dst = Path(src), Path(dst)
    check_destination(src, dst)
    info = json.loads((src / INFO_PATH).read_text())
    declared = info["features"].get(column)
    if declared is not None and (list(declared.get("shape") or [1]) != [1] or declared.get("dtype") in
                                 ("video", "image", "string", "language")):
        raise ValueError(f"dataset {src} declares {column!r} as {declared.get('dtype')} {declared.get('shape')}: "
                         f"labels are one bool per frame")
    index, values = np.asarray(index, dtype=np.int64).reshape(-1), np.asarray(values).astype(bool).reshape(-1)
    order = np.argsort(index, kind="stable")
    index, values = index[order], values[order]
    if len(index) != len(values) or (len(index) > 1 and (np.diff(index) == 0).any()):
        raise ValueError("write_column_copy needs one value per frame index, each index once")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".{dst.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(src, tmp, symlinks=False)
        ep_values = _rewrite_data(tmp, info, column, index, values)
        ep_stats = _rewrite_episode_stats(tmp, column, ep_values)
        if declared is None:
            info["features"][column] = dict(BOOL_FEATURE)
            _write_json(tmp / INFO_PATH, info, indent=4)
        _rewrite_stats(tmp, column, ep_stats, info)
        for rel, data in (extra_files or {}).items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        if dst.exists():  # an empty folder (check_destination): replaced
            dst.rmdir()
        os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def _write_json(path: Path, obj: object, indent: int | None = None) -> None:
    path.write_text(json.dumps(obj, indent=indent))


def _rewrite_data(root: Path, info: dict, column: str, index: np.ndarray,
                  values: np.ndarray) -> dict[int, np.ndarray]:
    """Set ``column`` in every data file under ``root``; returns each episode's new values (bool [L])."""
    per_episode: dict[int, list[np.ndarray]] = {}
    files = sorted((root / "data").rglob("*.parquet"))
    if not files:
        raise DatasetError(f"{root / 'data'} holds no data files")
    feature = info["features"].get(column)
    for path in files:
        try:
            table = pq.read_table(path)
        except (OSError, ValueError, pa.ArrowException) as e:
            raise DatasetError(f"data file {path} is unreadable ({type(e).__name__}: {str(e)[:200]})") from None
        rows = table.column("index").to_numpy().astype(np.int64)
        pos = np.clip(np.searchsorted(index, rows), 0, max(len(index) - 1, 0))
        if len(index) == 0 or (index[pos] != rows).any():
            missing = int(rows[index[pos] != rows][0]) if len(index) else int(rows[0])
            raise DatasetError(f"data file {path}: no {column!r} value for the frame with index {missing}")
        new, eps = values[pos], table.column("episode_index").to_numpy()
        for e in np.unique(eps):
            per_episode.setdefault(int(e), []).append(new[eps == e])
        if feature is not None and column in table.column_names:  # the source's type kept (bool, or 0/1 numbers)
            typ = table.schema.field(column).type
            if not (pa.types.is_boolean(typ) or pa.types.is_integer(typ) or pa.types.is_floating(typ)):
                raise ValueError(f"data file {path}: column {column!r} is {typ}, not one bool or number per frame")
            arr = pa.array(new.astype(typ.to_pandas_dtype()), type=typ)
            table = table.set_column(table.schema.get_field_index(column), table.schema.field(column), arr)
        else:
            table = table.append_column(pa.field(column, pa.bool_()), pa.array(new, type=pa.bool_()))
            table = table.replace_schema_metadata(_hf_metadata(table.schema.metadata, column))
        pq.write_table(table, path)
    return {e: np.concatenate(v) for e, v in per_episode.items()}


def _hf_metadata(metadata: dict[bytes, bytes] | None, column: str) -> dict[bytes, bytes] | None:
    """The ``huggingface`` schema metadata LeRobot writes into data files, declaring the added bool column too."""
    if not metadata or b"huggingface" not in metadata:
        return metadata
    hf = json.loads(metadata[b"huggingface"])
    hf.setdefault("info", {}).setdefault("features", {})[column] = {"dtype": "bool", "_type": "Value"}
    return {**metadata, b"huggingface": json.dumps(hf).encode()}


def _episode_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's statistics of one episode's column (``compute_episode_stats`` of a [L, 1] feature)."""
    from lerobot.datasets.compute_stats import get_feature_stats

    return get_feature_stats(values.reshape(-1, 1), axis=0, keepdims=False)


def _rewrite_episode_stats(root: Path, column: str, ep_values: dict[int, np.ndarray]) -> dict[int, dict]:
    """Set ``stats/<column>/*`` of every episode row in ``meta/episodes``; returns each episode's statistics."""
    stats = {e: _episode_stats(v) for e, v in ep_values.items()}
    for path in sorted((root / EPISODES_DIR).rglob("*.parquet")):
        table = pq.read_table(path)
        eps = table.column("episode_index").to_numpy().astype(np.int64)
        unknown = [int(e) for e in eps if int(e) not in stats]
        if unknown:
            raise DatasetError(f"{path} lists episode {unknown[0]}, which no data file holds")
        for name in stats[int(eps[0])] if len(eps) else []:
            key = f"stats/{column}/{name}"
            cells = [np.asarray(stats[int(e)][name]).reshape(-1).tolist() for e in eps]
            if key in table.column_names:
                i = table.schema.get_field_index(key)
                table = table.set_column(i, table.schema.field(i), pa.array(cells, type=table.schema.field(i).type))
            else:
                typ = pa.list_(pa.int64() if name == "count" else pa.float64())
                table = table.append_column(pa.field(key, typ), pa.array(cells, type=typ))
        pq.write_table(table, path)
    return stats


def _rewrite_stats(root: Path, column: str, ep_stats: dict[int, dict], info: dict) -> None:
    """``meta/stats.json`` and the commit record's copies of it and of ``info.json``."""
    from lerobot.datasets.compute_stats import aggregate_stats

    total = aggregate_stats([{column: s} for _, s in sorted(ep_stats.items())])[column]
    entry = {k: np.asarray(v).reshape(-1).tolist() for k, v in total.items()}
    path = root / STATS_PATH
    if path.is_file():
        stats = json.loads(path.read_text())
        stats[column] = entry
        _write_json(path, stats, indent=4)
    commit_path = root / COMMIT_FILE
    if commit_path.is_file():
        commit = json.loads(commit_path.read_text())
        commit["info"] = info
        if commit.get("stats") is not None:
            commit["stats"][column] = entry
        _write_json(commit_path, commit)
