"""Malformed datasets (RELIABILITY.md C5): a small LeRobotDataset v3 damaged at random -- a file truncated, emptied,
deleted, or with bits flipped -- and in named ways (metadata that lies): 1,000 cases by default, 10,045 random ones with
``-m slow``.
Each either loads with every frame where the undamaged one has it (bits flipped inside values or unread bytes can
leave a loadable file) or is refused with a DatasetError; nothing else is raised, and no case takes over 5 s."""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from robot_rl.data.lerobot_loader import ChunkDatasetConfig, ChunkSampler, DatasetError
from tests.test_lerobot_loader import make_dataset

CHUNKS, PER_CHUNK = 20, 49  # 980 random cases, and the named ones below
NIGHTLY_CHUNKS = 205  # with -m slow: 10,045 random cases in all (C5's nightly tier)
KINDS = ("truncate", "flip", "delete", "empty")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The undamaged dataset and its frames' (episode_index, frame_index)."""
    root = make_dataset(tmp_path_factory.mktemp("fuzz") / "base")
    s = load(root)
    return root, (s.indices["episode_index"].numpy().copy(), s.indices["frame_index"].numpy().copy())


def load(root: Path) -> ChunkSampler:
    return ChunkSampler(ChunkDatasetConfig(root=str(root), batch_size=8, augment=False, progress=False))


def outcome(root: Path, truth) -> str:
    """"refused", "loaded" (every frame where the undamaged dataset has it), or what went wrong."""
    start = time.perf_counter()
    try:
        s = load(root)
        same = all(np.array_equal(s.indices[k].numpy(), t) for k, t in zip(("episode_index", "frame_index"), truth,
                                                                            strict=True))
        result = "loaded" if same else "loaded with frames misaligned"
    except DatasetError:
        result = "refused"
    except Exception as e:  # noqa: BLE001 - what the test is looking for
        result = f"{type(e).__name__}: {str(e)[:200]}"
    took = time.perf_counter() - start
    return result if took <= 5.0 else f"{result}, after {took:.1f} s"


def damage(path: Path, kind: str, rng: random.Random) -> None:
    data = path.read_bytes()
    if kind == "truncate":
        path.write_bytes(data[:rng.randrange(len(data))])
    elif kind == "flip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(b))
    elif kind == "delete":
        path.unlink()
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize("chunk", [*range(CHUNKS), *(pytest.param(c, marks=pytest.mark.slow)
                                                   for c in range(CHUNKS, NIGHTLY_CHUNKS))])
def test_randomly_damaged_files_load_whole_or_are_refused(pristine, tmp_path, chunk):
    base, truth = pristine
    files = [p.relative_to(base) for p in sorted(base.rglob("*")) if p.is_file()]
    rng = random.Random(chunk)
    wrong = []
    for case in range(PER_CHUNK):
        root = Path(shutil.copytree(base, tmp_path / f"case{case}"))
        target, kind = rng.choice(files), rng.choice(KINDS)
        damage(root / target, kind, rng)
        result = outcome(root, truth)
        if result not in ("refused", "loaded"):
            wrong.append(f"{kind} {target}: {result}")
        shutil.rmtree(root)
    assert not wrong, "\n".join(wrong)


def _rewrite_info(root: Path, edit) -> None:
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    edit(info)
    path.write_text(json.dumps(info))


def _rewrite_parquet(path: Path, edit) -> None:
    df = pq.read_table(path).to_pandas()
    pq.write_table(pa.Table.from_pandas(edit(df), preserve_index=False), path)


def _episodes(root: Path) -> Path:
    return next((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))


def _data(root: Path) -> Path:
    return next((root / "data").glob("chunk-*/file-*.parquet"))


def _symlink_loop(path: Path) -> None:
    """``path`` becomes a symlink to itself (opening it fails with ELOOP)."""
    path.unlink()
    path.symlink_to(path.name)


STATE = "observation.state"
FRONT = "observation.images.front"
NAMED = {
    "info: fps 0": lambda r: _rewrite_info(r, lambda i: i.update(fps=0)),
    "info: fps as text": lambda r: _rewrite_info(r, lambda i: i.update(fps="30")),
    "info: fps 10 (timestamps 1/30 s apart)": lambda r: _rewrite_info(r, lambda i: i.update(fps=10)),
    "info: state shape [7]": lambda r: _rewrite_info(r, lambda i: i["features"][STATE].update(shape=[7])),
    "info: state shape as text": lambda r: _rewrite_info(r, lambda i: i["features"][STATE].update(shape="six")),
    "info: state dtype unknown": lambda r: _rewrite_info(r, lambda i: i["features"][STATE].update(dtype="float7")),
    "info: a feature that is not a dict": lambda r: _rewrite_info(r, lambda i: i["features"].update({STATE: 5})),
    "info: features a list": lambda r: _rewrite_info(r, lambda i: i.update(features=[])),
    "info: data_path with an unknown field": lambda r: _rewrite_info(r, lambda i: i.update(
        data_path="data/{nothing}/file.parquet")),
    "info: video_path missing": lambda r: _rewrite_info(r, lambda i: i.pop("video_path")),
    "info: total_episodes one too many (a lost episode counted)": lambda r: _rewrite_info(r, lambda i: i.update(
        total_episodes=i["total_episodes"] + 1)),
    "info: total_frames short": lambda r: _rewrite_info(r, lambda i: i.update(total_frames=i["total_frames"] - 5)),
    "info: codebase v2.1": lambda r: _rewrite_info(r, lambda i: i.update(codebase_version="v2.1")),
    "info: not an object": lambda r: (r / "meta" / "info.json").write_text("[1, 2]"),
    "info: a camera of 100,000 x 100,000 pixels": lambda r: _rewrite_info(r, lambda i: i["features"][FRONT].update(
        shape=[100_000, 100_000, 3])),
    "info: a state of 2**40 values": lambda r: _rewrite_info(r, lambda i: i["features"][STATE].update(shape=[2**40])),
    "files: info.json a symlink loop": lambda r: _symlink_loop(r / "meta" / "info.json"),
    "files: a data file a symlink loop": lambda r: _symlink_loop(_data(r)),
    "files: an episodes file a symlink loop": lambda r: _symlink_loop(_episodes(r)),
    "files: a video file a symlink loop": lambda r: _symlink_loop(next((r / "videos" / FRONT).rglob("*.mp4"))),
    "episodes: one listed twice": lambda r: _rewrite_parquet(_episodes(r), lambda d: d.iloc[[0, 0, 1, 2]]),
    "episodes: a negative index": lambda r: _rewrite_parquet(_episodes(r), lambda d: d.assign(
        episode_index=[-1, 1, 2])),
    "episodes: a length one too long": lambda r: _rewrite_parquet(_episodes(r), lambda d: d.assign(
        length=d["length"] + np.array([0, 1, 0]))),
    "episodes: a data file that is not there": lambda r: _rewrite_parquet(_episodes(r), lambda d: d.assign(
        **{"data/file_index": 7})),
    "episodes: video times past the file's end": lambda r: _rewrite_parquet(_episodes(r), lambda d: d.assign(
        **{"videos/observation.images.front/from_timestamp": d["videos/observation.images.front/from_timestamp"]
           + 60.0})),
    "data: a frame index skipped": lambda r: _rewrite_parquet(_data(r), lambda d: d.assign(
        frame_index=np.where(np.arange(len(d)) == 3, 99, d["frame_index"]))),
    "data: rows of another episode": lambda r: _rewrite_parquet(_data(r), lambda d: d.assign(
        episode_index=np.where(np.arange(len(d)) == 5, 2, d["episode_index"]))),
    "data: the last episode's global index restarting at 0": lambda r: _rewrite_parquet(_data(r), lambda d: d.assign(
        index=np.where(d["episode_index"] == d["episode_index"].max(), d["frame_index"], d["index"]))),
    "data: a global index skipped inside an episode": lambda r: _rewrite_parquet(_data(r), lambda d: d.assign(
        index=np.where(np.arange(len(d)) == 3, 1000, d["index"]))),
    "data: the state column gone": lambda r: _rewrite_parquet(_data(r), lambda d: d.drop(columns=[STATE])),
    "data: a task index past the task table": lambda r: _rewrite_parquet(_data(r), lambda d: d.assign(task_index=9)),
    "tasks: an index out of range": lambda r: _rewrite_parquet(r / "meta" / "tasks.parquet", lambda d: d.reset_index(
        ).assign(task_index=d["task_index"].to_numpy() + 5)),
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_metadata_that_lies_is_refused(pristine, tmp_path, name):
    base, truth = pristine
    root = Path(shutil.copytree(base, tmp_path / "case"))
    NAMED[name](root)
    assert outcome(root, truth) == "refused"
