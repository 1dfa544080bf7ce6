"""Episodes of N envs written into a LeRobotDataset v3 that a crash cannot break (RELIABILITY.md C1, C2, C6).

Steps arrive batched over N envs in the shared frame convention (``policies.keys``): ``observation.state`` float
[N, D] (degrees for an SO-101), ``observation.images.<cam>`` uint8 [N, 3, H, W], ``task`` list[str], and the
``action`` [N, D] (joint position targets, degrees). Each env fills its own buffer; when its episode ends the whole
episode goes through LeRobot's own API (``add_frame`` per frame, ``save_episode``) and is then committed:

    rec = EpisodeRecorder(RecorderConfig(root="data/demos"), DatasetSpec(30, STATE_NAMES, {"front": (64, 64)}), N)
    written = rec.add(frames, action, reward=r, success=s, done=terminated | truncated, actor=who)
    rec.close()

What LeRobot 0.6.1 leaves on disk before ``finalize()``: the data parquet and the episode-metadata parquet are open
``ParquetWriter``s, their footers written only by ``finalize()``, and ``info.json``, ``stats.json`` and
``tasks.parquet`` are rewritten in place after every episode. A recorder killed before ``finalize()`` therefore
leaves a folder ``LeRobotDataset`` cannot open (parquet without a footer), and one killed during a rewrite a truncated
``info.json``. So this recorder:

1. creates the dataset with file-size caps below one episode (``FILE_CAP_MB``), so LeRobot starts new data,
   metadata and video files for every episode: a committed file is never appended to again, and no video is ever
   re-muxed into a file that holds committed episodes (LeRobot's concatenation rewrites the whole file);
2. after ``save_episode`` closes both parquet writers (footers written), checks that every camera's video holds the
   episode's frames, fsyncs the new files and the metadata, then writes ``meta/robot_rl_commit.json`` atomically
   (tmp file, fsync, ``os.replace``): the episode count, the last file of each stream, and ``info.json``,
   ``stats.json`` and the tasks as LeRobot wrote them. That file is the commit point;
3. ``repair_dataset`` rolls a folder back to its commit: it deletes the files of a half-written episode and
   LeRobot's temporary folders and restores ``info.json``, ``stats.json`` and ``tasks.parquet``. The recorder runs
   it when it opens a dataset to append to and after a failed write (a full disk: ``OutputWriteError`` naming the
   file; an interrupt).

Between episodes the folder is a complete dataset that ``LeRobotDataset(repo_id, root=...)`` opens; after a kill
in the middle of an episode's write, it opens once ``repair_dataset`` has run, with every committed episode. The
cost is two parquet files per episode plus one video per camera: ~150 kB for a 36-frame so101_pick episode with two
64x64 cameras, of which ~80 kB is the episode-metadata file (mostly its schema). LeRobot's own
``aggregate_datasets([repo_id], new_repo_id, roots=[root], aggr_root=new_root)`` copies a finished dataset into
consolidated files (~75 kB per such episode).

Videos are encoded while the frames are handed over (LeRobot's streaming encoder, one thread per camera), with
``RecorderConfig``'s codec: by default H.264 in 4:4:4 at CRF 7: on 48x48 renders of so101_sim 44.1 dB mean PSNR and
41.0 dB on the worst frame (CRF 10: 41.9 / 38.3 dB, 16 % smaller files; RELIABILITY C7 asks >= 40 dB); 4:2:0, LeRobot's
default pixel format, halves colour resolution and gives ~31 dB there. Decodable by PyAV without system FFmpeg.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
from omegaconf import MISSING

from policies import keys
from robot_rl.checkpoint import OutputWriteError, write_atomic
from robot_rl.checkpoint import fsync_path as _fsync
from robot_rl.data.timing import EpisodeTiming, episode_timing

log = logging.getLogger(__name__)

# LeRobot's layout (lerobot.datasets.utils; LeRobot itself is imported where used: importing it takes seconds, and
# the command line's config schemas import this module for RecorderConfig).
INFO_PATH, STATS_PATH, TASKS_PATH = "meta/info.json", "meta/stats.json", "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
COMMIT_FILE = "meta/robot_rl_commit.json"
COMMIT_FORMAT = 1
FILE_CAP_MB = 1e-6  # data / video file-size cap in MB: below any episode's files, so each episode starts new ones
_FILE_RE = re.compile(r"chunk-(\d+)/file-(\d+)\.(parquet|mp4)$")
_TMP = ".tmp-"


class DatasetError(ValueError):
    """A dataset folder that cannot be recorded into (not a dataset, a different layout, no commit to repair to)."""


# ------------------------------------------------------------------------------------------------- configs
@dataclass
class RecorderConfig:
    """Where episodes go and how their videos are encoded (``robot-rl collect``'s ``dataset`` section)."""

    root: str = MISSING  # the dataset folder (required); refused when it holds a dataset, unless append
    repo_id: str | None = None  # LeRobot repo id written into the metadata (default: local/<folder name>)
    append: bool = False  # add episodes to the dataset already at root (repaired first; fps/features must match)
    vcodec: str = "h264"  # LeRobot encoder name: h264 | hevc | libsvtav1 | libaom-av1
    pix_fmt: str = "yuv444p"  # yuv444p keeps full colour resolution; yuv420p is LeRobot's default
    crf: int = 7  # constant rate factor: lower is better quality and larger files (7: every frame >= 40 dB, RELIABILITY C7)
    gop: int = 2  # keyframe interval, frames (LeRobot's default: fast random access when training)
    preset: str | None = None  # codec speed preset (None: the codec's default, "medium" for h264)

    def __post_init__(self) -> None:
        if self.crf < 0 or self.gop < 1:
            raise ValueError(f"dataset.crf must be >= 0 and dataset.gop >= 1, got {self.crf} and {self.gop}")


@dataclass(frozen=True)
class DatasetSpec:
    """What every frame holds.

    Args:
        fps: frames per second (the env's control rate: 30 for the SO-101 tasks).
        state_names: names of the D joints of ``observation.state`` and ``action`` (``sim.so101.LEROBOT_STATE_NAMES``).
        cameras: camera name -> (height, width) in pixels.
        robot_type: LeRobot's robot type.
        vectors: extra float32 columns -> their size, handed to ``add`` as ``extras`` every step (the env's own
            state and action for state-based learners, ``keys.ENV_STATE_COL`` ...; none by default).
        vector_names: names of the features of a column of ``vectors`` (LeRobot's ``names``; None where absent).
        capture_time: frames carry ``keys.CAPTURE_TIME_COL`` (measured read times: a real robot's loop), recorded as
            a column and checked per episode (``robot_rl.data.timing``).
    """

    fps: int
    state_names: tuple[str, ...]
    cameras: dict[str, tuple[int, int]] = field(default_factory=dict)
    robot_type: str = "so101_follower"
    vectors: dict[str, int] = field(default_factory=dict)
    capture_time: bool = False
    vector_names: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def features(self) -> dict[str, dict[str, Any]]:
        """LeRobot's feature dict (dtype, shape, names of every column but LeRobot's own indices)."""
        d, names = len(self.state_names), list(self.state_names)
        scalar = {"shape": (1,), "names": None}
        out: dict[str, dict[str, Any]] = {keys.OBS_STATE: {"dtype": "float32", "shape": (d,), "names": names}}
        for cam, (h, w) in self.cameras.items():
            out[keys.lerobot_image_key(cam)] = {"dtype": "video", "shape": (3, h, w),
                                                 "names": ["channels", "height", "width"]}
        out[keys.ACTION_COL] = {"dtype": "float32", "shape": (d,), "names": names}
        out[keys.POLICY_ACTION_COL] = {"dtype": "float32", "shape": (d,), "names": names}
        out[keys.REWARD_COL] = {"dtype": "float32", **scalar}
        out[keys.SUCCESS_COL] = {"dtype": "bool", **scalar}
        out[keys.DONE_COL] = {"dtype": "bool", **scalar}
        out[keys.INTERVENTION_COL] = {"dtype": "bool", **scalar}
        out[keys.ACTOR_COL] = {"dtype": "int64", **scalar}
        if self.capture_time:
            out[keys.CAPTURE_TIME_COL] = {"dtype": "float32", **scalar}
        for name, size in self.vectors.items():
            names = self.vector_names.get(name)
            if names is not None and len(names) != int(size):
                raise ValueError(f"vector_names[{name!r}] names {len(names)} features of {size}")
            out[name] = {"dtype": "float32", "shape": (int(size),), "names": list(names) if names else None}
        return out


@dataclass(frozen=True)
class WrittenEpisode:
    """An episode committed to the dataset: its index there, the env it came from, its frames, whether it
    succeeded at any step, and its measured timing (None without capture times)."""

    index: int
    env: int
    length: int
    success: bool
    timing: EpisodeTiming | None = None


# ------------------------------------------------------------------------------------------------ files
def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` as a whole or not at all (``robot_rl.checkpoint.write_atomic``, a uniquely named temporary)."""
    write_atomic(path, data, path.parent / f"{_TMP}{path.name}-{uuid.uuid4().hex}")


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, indent=4, ensure_ascii=False).encode()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _stream_files(root: Path, video_keys: list[str]) -> dict[str, list[tuple[tuple[int, int], Path]]]:
    """Every data, episode-metadata and video file under ``root``, by stream, with its (chunk, file) index."""
    dirs = {"data": root / "data", "episodes": root / "meta" / "episodes",
            **{f"videos/{k}": root / "videos" / k for k in video_keys}}
    out: dict[str, list[tuple[tuple[int, int], Path]]] = {}
    for stream, d in dirs.items():
        found = []
        for p in sorted(d.glob("chunk-*/file-*")) if d.is_dir() else []:
            m = _FILE_RE.search(p.as_posix())
            if m:
                found.append(((int(m.group(1)), int(m.group(2))), p))
        out[stream] = found
    return out


def _video_keys(info: dict[str, Any]) -> list[str]:
    return [k for k, ft in info["features"].items() if ft.get("dtype") == "video"]


def _tasks_of(meta: Any) -> dict[str, int]:
    return {} if meta.tasks is None else {str(t): int(i) for t, i in meta.tasks["task_index"].items()}


def read_commit(root: str | Path) -> dict[str, Any] | None:
    """The commit record of a dataset folder, None when there is none (a dataset not written by this recorder).

    Raises:
        DatasetError: the record exists but cannot be read (it is written atomically, so this means damage).
    """
    path = Path(root) / COMMIT_FILE
    if not path.exists():
        return None
    commit = _read_json(path)
    if not isinstance(commit, dict) or commit.get("format") != COMMIT_FORMAT or "info" not in commit:
        raise DatasetError(f"{path} is not a commit record this recorder wrote (format {COMMIT_FORMAT})")
    return commit


def repair_dataset(root: str | Path) -> list[Path]:
    """Roll the dataset folder ``root`` back to its last commit, so ``LeRobotDataset`` opens it with every committed
    episode: delete data, metadata and video files past the last committed ones (a half-written episode), LeRobot's
    temporary folders (``tmp*``, ``images/``) and stale ``.tmp-*`` files, and restore ``info.json``, ``stats.json``
    and ``tasks.parquet`` where they differ from the commit (truncated by a kill, or counting the lost episode).
    Deletions come first, so a full disk has room for the restored files. Returns the paths removed or rewritten.

    Raises:
        DatasetError: ``root`` has no commit record (see ``read_commit``).
    """
    root = Path(root)
    commit = read_commit(root)
    if commit is None:
        raise DatasetError(f"{root} has no {COMMIT_FILE}: it was not written by this recorder, nothing to roll back to")
    info, last = commit["info"], commit["last"]
    changed: list[Path] = []
    for stream, files in _stream_files(root, _video_keys(info)).items():
        keep = tuple(last[stream]) if last.get(stream) is not None else None
        for index, path in files:
            if keep is None or index > keep:
                path.unlink()
                changed.append(path)
    stale = [p for p in root.iterdir() if p.is_dir() and re.fullmatch(r"tmp[a-z0-9_]{8}", p.name)]
    stale += [p for p in (root / "images",) if p.exists()]
    stale += list((root / "meta").glob(f"{_TMP}*"))
    for p in stale:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        changed.append(p)
    if _read_json(root / INFO_PATH) != info:
        _write_atomic(root / INFO_PATH, _json_bytes(info))
        changed.append(root / INFO_PATH)
    stats = root / STATS_PATH
    if commit["stats"] is None and stats.exists():
        stats.unlink()
        changed.append(stats)
    elif commit["stats"] is not None and _read_json(stats) != commit["stats"]:
        _write_atomic(stats, _json_bytes(commit["stats"]))
        changed.append(stats)
    if _restore_tasks(root, commit["tasks"]):
        changed.append(root / TASKS_PATH)
    return changed


def _restore_tasks(root: Path, tasks: dict[str, int]) -> bool:
    import pandas as pd
    from lerobot.datasets.io_utils import write_tasks

    path = root / TASKS_PATH
    try:
        on_disk = {str(t): int(i) for t, i in pd.read_parquet(path)["task_index"].items()} if path.exists() else {}
    except Exception:  # noqa: BLE001 - a truncated or garbled parquet: whatever pyarrow raises, rewrite it
        on_disk = None
    if on_disk == tasks:
        return False
    if not tasks:
        path.unlink()
        return True
    staging = root / "meta" / f"{_TMP}tasks-{uuid.uuid4().hex}"
    try:  # LeRobot's own writer, into a staging folder, then one rename
        df = pd.DataFrame({"task_index": list(tasks.values())}, index=pd.Index(list(tasks), name="task"))
        write_tasks(df, staging)
        _fsync(staging / TASKS_PATH)
        os.replace(staging / TASKS_PATH, path)
        _fsync(path.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True


def _adopt(root: Path, repo_id: str) -> dict[str, Any]:
    """A commit record for a finalized dataset written by someone else (LeRobot's own recorder), so that appending
    to it can be rolled back too. Refuses a folder with a parquet file that has no footer."""
    import pyarrow.parquet as pq
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata

    for path in sorted((root / "data").glob("*/*.parquet")) + sorted((root / "meta" / "episodes").glob("*/*.parquet")):
        try:
            pq.read_metadata(path)
        except Exception as e:  # noqa: BLE001 - pyarrow's error for a missing footer varies by version
            raise DatasetError(f"{path} is not a complete parquet file ({str(e)[:120]}): the dataset was not "
                               "finalized; cannot append to it") from None
    meta = LeRobotDatasetMetadata(repo_id, root=root)
    last: dict[str, Any] = {"data": None, "episodes": None, **{f"videos/{k}": None for k in meta.video_keys}}
    if meta.total_episodes > 0:
        ep = meta.episodes[meta.total_episodes - 1]
        last["data"] = [int(ep["data/chunk_index"]), int(ep["data/file_index"])]
        last["episodes"] = [int(ep["meta/episodes/chunk_index"]), int(ep["meta/episodes/file_index"])]
        for k in meta.video_keys:
            last[f"videos/{k}"] = [int(ep[f"videos/{k}/chunk_index"]), int(ep[f"videos/{k}/file_index"])]
    return {"format": COMMIT_FORMAT, "total_episodes": meta.total_episodes, "total_frames": meta.total_frames,
            "last": last, "info": _read_json(root / INFO_PATH), "stats": _read_json(root / STATS_PATH),
            "tasks": _tasks_of(meta)}


_ERRNO_RE = re.compile(r"\[Errno (\d+)\][^:']*(?::\s*'([^']+)')?")


def _write_failure(err: BaseException, root: Path, since: float) -> tuple[Path, OSError] | None:
    """(the file being written, the OS error) when ``err`` is a failed write, else None. LeRobot's video encoder
    threads report their OSError as a RuntimeError's text; pyarrow's OSErrors name no file, so the file is then the
    newest one written under ``root`` since the episode's write began."""
    cause: OSError | None = None
    name: str | None = None
    if isinstance(err, OSError):
        cause, name = err, err.filename
    elif isinstance(err, RuntimeError) and "Encoder thread" in str(err):
        m = _ERRNO_RE.search(str(err))
        if m:
            cause, name = OSError(int(m.group(1)), os.strerror(int(m.group(1)))), m.group(2)
    if cause is None:
        return None
    if cause.errno is not None:
        cause = OSError(cause.errno, os.strerror(cause.errno))
    if name:
        return Path(name), cause
    newest, newest_t = root, since
    for p in root.rglob("*"):
        try:
            t = p.stat().st_mtime
        except OSError:
            continue
        if p.is_file() and t >= newest_t and p.name != Path(COMMIT_FILE).name:
            newest, newest_t = p, t
    return newest, cause


# ---------------------------------------------------------------------------------------------- recorder
class EpisodeRecorder:
    """Buffers N envs' steps and writes each episode, whole and committed, when it ends. See the module docstring.

    Args:
        cfg: the dataset folder, append or not, the video codec.
        spec: fps, joint names, cameras (their sizes), robot type.
        num_envs: N.
        max_episode_length: frames an episode may hold before the buffers grow (the env's time limit).

    Raises:
        DatasetError, ValueError: ``cfg.root`` holds something else than an empty folder and ``cfg.append`` is
            off, or the dataset there differs from ``spec`` (fps, robot type, features), or is not finalized.
    """

    def __init__(self, cfg: RecorderConfig, spec: DatasetSpec, num_envs: int, max_episode_length: int = 1000) -> None:
        import av
        from lerobot.configs import RGBEncoderConfig
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        if cfg.root in ("", MISSING):
            raise ValueError("dataset.root is required: the folder to write the dataset into")
        self.cfg, self.spec, self.num_envs = cfg, spec, num_envs
        self.root = Path(cfg.root)
        self.repo_id = cfg.repo_id or f"local/{self.root.resolve().name}"
        self.video_keys = [keys.lerobot_image_key(c) for c in spec.cameras]
        self.encoder = RGBEncoderConfig(vcodec=cfg.vcodec, pix_fmt=cfg.pix_fmt, crf=cfg.crf, g=cfg.gop,
                                        preset=cfg.preset)
        av.logging.set_libav_level(av.logging.ERROR)  # LeRobot's encoder threads hand FFmpeg logs back to stderr
        self.timings = {"add_frames_s": 0.0, "save_s": 0.0, "commit_s": 0.0}
        self.episodes_written = self.frames_written = 0
        self._closed = False
        queue = max_episode_length + 1  # the streaming encoder drops frames when its queue is full: never let it be
        common = {"video_backend": "pyav", "rgb_encoder": self.encoder, "streaming_encoding": True,
                  "encoder_queue_maxsize": queue, "encoder_threads": 1}
        if self._holds_dataset():
            self._check_can_append()
            self.ds = LeRobotDataset.resume(self.repo_id, root=self.root, **common)
            self.ds.meta.info.data_files_size_in_mb = FILE_CAP_MB
            self.ds.meta.info.video_files_size_in_mb = FILE_CAP_MB
        else:
            if self.root.exists():
                self.root.rmdir()  # empty (checked): LeRobot creates the folder itself
            self.ds = LeRobotDataset.create(self.repo_id, spec.fps, spec.features(), root=self.root,
                                            robot_type=spec.robot_type, use_videos=True, metadata_buffer_size=1,
                                            data_files_size_in_mb=FILE_CAP_MB, video_files_size_in_mb=FILE_CAP_MB,
                                            **common)
            self._commit(None, 0)
        self.num_episodes = int(self.ds.meta.total_episodes)
        self._alloc(max_episode_length)

    # ------------------------------------------------------------------------------------------- opening
    def _holds_dataset(self) -> bool:
        if not self.root.exists():
            return False
        if not self.root.is_dir():
            raise DatasetError(f"dataset.root={self.root} is a file, not a folder")
        if not any(self.root.iterdir()):
            return False
        if not (self.root / INFO_PATH).is_file():
            raise DatasetError(f"dataset.root={self.root} is a non-empty folder without {INFO_PATH}: not a LeRobot "
                               "dataset; choose an empty or new folder")
        return True

    def _check_can_append(self) -> None:
        commit = read_commit(self.root)
        count = commit["total_episodes"] if commit else (_read_json(self.root / INFO_PATH) or {}).get("total_episodes")
        if not self.cfg.append:
            raise DatasetError(f"dataset.root={self.root} already holds a dataset ({count} episodes); pass "
                               "dataset.append=true to add episodes to it, or choose another folder")
        if commit is None:
            _write_atomic(self.root / COMMIT_FILE, _json_bytes(_adopt(self.root, self.repo_id)))
        repair_dataset(self.root)
        from lerobot.utils.constants import DEFAULT_FEATURES

        info = read_commit(self.root)["info"]
        have = {k: v for k, v in info["features"].items() if k not in DEFAULT_FEATURES}
        if self.spec.capture_time and keys.CAPTURE_TIME_COL not in have:
            # a recording made before capture times were kept: its new episodes go without them too (one schema)
            log.warning("%s was recorded without %s: the episodes appended now are written without it, and their "
                        "timing is not checked", self.root, keys.CAPTURE_TIME_COL)
            self.spec = replace(self.spec, capture_time=False)
        unnamed = [c for c in self.spec.vector_names if c in have and not have[c].get("names")]
        if unnamed:  # recorded before vector columns were named: appended episodes keep that schema
            self.spec = replace(self.spec, vector_names={k: v for k, v in self.spec.vector_names.items()
                                                          if k not in unnamed})
        want = self.spec.features()
        problems = [f"fps {info['fps']} (recording at {self.spec.fps})"] if info["fps"] != self.spec.fps else []
        if info.get("robot_type") != self.spec.robot_type:
            problems.append(f"robot_type {info.get('robot_type')!r} (recording {self.spec.robot_type!r})")
        for k in sorted(set(want) | set(have)):
            a, b = have.get(k), want.get(k)
            if a is None or b is None or a["dtype"] != b["dtype"] or list(a["shape"]) != list(b["shape"]) or (
                    a.get("names") != b.get("names") and a["dtype"] != "video"):
                problems.append(f"feature {k!r}: {'missing' if a is None else _brief(a)} "
                                f"(recording {'none' if b is None else _brief(b)})")
        if problems:
            raise DatasetError(f"cannot append to {self.root}: it has " + "; ".join(problems))

    # ------------------------------------------------------------------------------------------- buffers
    def _alloc(self, length: int) -> None:
        n, d = self.num_envs, len(self.spec.state_names)
        self._cap = length
        self._len = np.zeros(n, dtype=np.int64)
        self._state = np.zeros((n, length, d), np.float32)
        self._action = np.zeros((n, length, d), np.float32)
        self._policy_action = np.zeros((n, length, d), np.float32)
        self._reward = np.zeros((n, length, 1), np.float32)
        self._success = np.zeros((n, length, 1), bool)
        self._actor = np.zeros((n, length, 1), np.int64)
        self._capture = np.zeros((n, length, 1), np.float32)
        self._images = {cam: np.zeros((n, length, 3, h, w), np.uint8) for cam, (h, w) in self.spec.cameras.items()}
        self._vectors = {k: np.zeros((n, length, int(d)), np.float32) for k, d in self.spec.vectors.items()}
        self._tasks: list[list[str]] = [[] for _ in range(n)]

    def _grow(self) -> None:
        def more(a: np.ndarray) -> np.ndarray:
            return np.concatenate([a, np.zeros_like(a)], axis=1)

        self._cap *= 2
        for name in ("_state", "_action", "_policy_action", "_reward", "_success", "_actor", "_capture"):
            setattr(self, name, more(getattr(self, name)))
        self._images = {cam: more(a) for cam, a in self._images.items()}
        self._vectors = {k: more(a) for k, a in self._vectors.items()}

    # ------------------------------------------------------------------------------------------- recording
    def add(self, frames: dict[str, Any], action: torch.Tensor, reward: torch.Tensor, success: torch.Tensor,
            done: torch.Tensor, actor: torch.Tensor | int = keys.ACTOR_POLICY,
            policy_action: torch.Tensor | None = None, record: torch.Tensor | None = None,
            extras: dict[str, torch.Tensor] | None = None) -> list[WrittenEpisode]:
        """Append one step of the N envs and write the episodes that ``done`` ends.

        Args:
            frames: the observation the action was chosen on: ``observation.state`` float [N, D],
                ``observation.images.<cam>`` uint8 [N, 3, H, W] per camera of the spec, ``task`` list[str] of N,
                and ``capture_time`` float [N] when the spec records it.
            action: float [N, D] the action sent (joint targets, degrees).
            reward: float [N] reward of the step; success: bool [N] solved after it (``next.success``).
            done: bool [N] this step ends the env's episode (terminated or truncated): its frame is the last one.
            actor: who acted, int [N] or one int of ``keys.ACTOR_*`` (``intervention`` is ``actor != policy``).
            policy_action: float [N, D] the policy's own proposal (None: equal to ``action``).
            record: bool [N] envs whose step is kept (None: all); rows left out are ignored entirely.
            extras: float [N, d] per column of ``spec.vectors`` (exactly those), at the time of ``frames``.

        Returns:
            the episodes committed by this call, in env order.

        Raises:
            ValueError: a shape is wrong, or the state, action or an extra column of a recorded env is not finite.
            OutputWriteError: a write failed (no space left, a read-only disk); the dataset keeps every episode
                committed before, and this recorder is closed.
        """
        if self._closed:
            raise RuntimeError("the recorder is closed")
        n, d = self.num_envs, len(self.spec.state_names)
        keep = np.ones(n, bool) if record is None else _np(record).astype(bool).reshape(n)
        state, act = _np(frames[keys.OBS_STATE]).astype(np.float32), _np(action).astype(np.float32)
        prop = act if policy_action is None else _np(policy_action).astype(np.float32)
        if set(extras or {}) != set(self.spec.vectors):
            raise ValueError(f"extras must hold exactly the columns {sorted(self.spec.vectors)}, got "
                             f"{sorted(extras or {})}")
        vectors = {k: (_np(v).astype(np.float32), int(self.spec.vectors[k])) for k, v in (extras or {}).items()}
        checked = [(keys.OBS_STATE, (state, d)), (keys.ACTION_COL, (act, d)), (keys.POLICY_ACTION_COL, (prop, d)),
                   *vectors.items()]
        if self.spec.capture_time:
            if keys.CAPTURE_TIME_COL not in frames:
                raise ValueError(f"frames lack {keys.CAPTURE_TIME_COL!r}, which this dataset records (measured read "
                                 "times of the robot)")
            capture = _np(frames[keys.CAPTURE_TIME_COL]).astype(np.float32).reshape(n, -1)
            checked.append((keys.CAPTURE_TIME_COL, (capture, 1)))
        for name, (a, width) in checked:
            if a.shape != (n, width):
                raise ValueError(f"{name} has shape {a.shape}, expected [num_envs, {width}] = [{n}, {width}]")
            bad = keep & ~np.isfinite(a).all(axis=1)
            if bad.any():
                raise ValueError(f"{name} is not finite for envs {np.flatnonzero(bad).tolist()}")
        tasks = frames[keys.TASK]
        if len(tasks) != n:
            raise ValueError(f"{keys.TASK} holds {len(tasks)} strings, expected one per env ({n})")
        images = {}
        for cam, (h, w) in self.spec.cameras.items():
            img = _np(frames[keys.lerobot_image_key(cam)])
            if img.shape != (n, 3, h, w) or img.dtype != np.uint8:
                raise ValueError(f"{keys.lerobot_image_key(cam)} is {img.dtype} {img.shape}, expected uint8 "
                                 f"[{n}, 3, {h}, {w}]")
            images[cam] = img
        ids = np.flatnonzero(keep)
        if len(ids) and int(self._len[ids].max()) >= self._cap:
            self._grow()
        t = self._len[ids]
        self._state[ids, t], self._action[ids, t], self._policy_action[ids, t] = state[ids], act[ids], prop[ids]
        self._reward[ids, t, 0] = _np(reward).astype(np.float32).reshape(n)[ids]
        self._success[ids, t, 0] = _np(success).astype(bool).reshape(n)[ids]
        self._actor[ids, t, 0] = np.broadcast_to(_np(actor).astype(np.int64), (n,))[ids]
        if self.spec.capture_time:
            self._capture[ids, t] = capture[ids]
        for cam, img in images.items():
            self._images[cam][ids, t] = img[ids]
        for k, (a, _) in vectors.items():
            self._vectors[k][ids, t] = a[ids]
        for i in ids:
            self._tasks[i].append(str(tasks[i]))
        self._len[ids] += 1
        ended = ids[_np(done).astype(bool).reshape(n)[ids]]
        return [self._write(int(i)) for i in ended]

    def discard(self, env_ids: torch.Tensor | list[int] | None = None) -> None:
        """Drop the buffered steps of these envs' running episodes (all when None)."""
        ids = range(self.num_envs) if env_ids is None else [int(i) for i in _np(env_ids).reshape(-1)]
        for i in ids:
            self._len[i] = 0
            self._tasks[i] = []

    def _write(self, i: int) -> WrittenEpisode:
        from lerobot.utils.utils import SuppressProgressBars

        length = int(self._len[i])
        started = time.time()
        t0 = time.perf_counter()
        try:
            for t in range(length):
                frame: dict[str, Any] = {
                    keys.OBS_STATE: self._state[i, t], keys.ACTION_COL: self._action[i, t],
                    keys.POLICY_ACTION_COL: self._policy_action[i, t], keys.REWARD_COL: self._reward[i, t],
                    keys.SUCCESS_COL: self._success[i, t], keys.DONE_COL: np.array([t == length - 1]),
                    keys.INTERVENTION_COL: self._actor[i, t] != keys.ACTOR_POLICY, keys.ACTOR_COL: self._actor[i, t],
                    keys.TASK: self._tasks[i][t]}
                for cam in self.spec.cameras:
                    frame[keys.lerobot_image_key(cam)] = self._images[cam][i, t]
                if self.spec.capture_time:
                    frame[keys.CAPTURE_TIME_COL] = self._capture[i, t]
                for k, a in self._vectors.items():
                    frame[k] = a[i, t]
                self.ds.add_frame(frame)
            t1 = time.perf_counter()
            with SuppressProgressBars():
                self.ds.save_episode()
            t2 = time.perf_counter()
            index = int(self.ds.meta.total_episodes) - 1
            self._commit(i, length)
        except BaseException as err:
            self._abort(err, started, lost=f"env {i}'s episode of {length} frames")
            raise  # _abort raises the OutputWriteError itself; anything else goes on as it was
        self.timings["add_frames_s"] += t1 - t0
        self.timings["save_s"] += t2 - t1
        self.timings["commit_s"] += time.perf_counter() - t2
        success = bool(self._success[i, :length].any())
        timing = episode_timing(self._capture[i, :length, 0], self.spec.fps) if self.spec.capture_time else None
        if timing is not None and timing.flagged:  # written all the same: the loaders leave it out by default
            log.warning("episode %d was recorded with late ticks (%s); training leaves it out by default "
                        "(dataset.timing_check)", index, timing.reason)
        self.episodes_written += 1
        self.frames_written += length
        self.num_episodes = index + 1
        self._len[i] = 0
        self._tasks[i] = []
        return WrittenEpisode(index, i, length, success, timing)

    def _commit(self, env: int | None, length: int) -> None:
        """Make the episode just saved durable, then record the commit (see the module docstring)."""
        ds, root = self.ds, self.root
        ds.writer.close_writer()  # the data parquet's footer
        ds.meta._close_writer()  # the episode-metadata parquet's footer (LeRobot 0.6.1 has no public call for it)
        last: dict[str, Any] = {"data": None, "episodes": None, **{f"videos/{k}": None for k in self.video_keys}}
        new: list[Path] = []
        ep = ds.meta.latest_episode
        if env is not None:
            def index(prefix: str) -> list[int]:
                return [int(ep[f"{prefix}/chunk_index"][0]), int(ep[f"{prefix}/file_index"][0])]

            last["data"], last["episodes"] = index("data"), index("meta/episodes")
            new.append(root / ds.meta.data_path.format(chunk_index=last["data"][0], file_index=last["data"][1]))
            new.append(root / EPISODES_PATH.format(chunk_index=last["episodes"][0],
                                                           file_index=last["episodes"][1]))
            for k in self.video_keys:
                last[f"videos/{k}"] = index(f"videos/{k}")
                seconds = float(ep[f"videos/{k}/to_timestamp"][0]) - float(ep[f"videos/{k}/from_timestamp"][0])
                if abs(seconds * self.spec.fps - length) > 0.5:
                    raise RuntimeError(f"episode {int(ep['episode_index'][0])}: the {k} video holds "
                                       f"{seconds * self.spec.fps:.1f} frames, the episode {length}")
                new.append(root / ds.meta.video_path.format(video_key=k, chunk_index=last[f"videos/{k}"][0],
                                                            file_index=last[f"videos/{k}"][1]))
        for p in [*new, root / INFO_PATH, root / STATS_PATH, root / TASKS_PATH]:
            if p.exists():
                _fsync(p)
        for d in {p.parent for p in new} | {root / "meta"}:
            _fsync(d)
        commit = {"format": COMMIT_FORMAT, "total_episodes": int(ds.meta.total_episodes),
                  "total_frames": int(ds.meta.total_frames), "last": last, "info": _read_json(root / INFO_PATH),
                  "stats": _read_json(root / STATS_PATH), "tasks": _tasks_of(ds.meta)}
        _write_atomic(root / COMMIT_FILE, _json_bytes(commit))

    def _abort(self, err: BaseException, started: float, lost: str = "the episode being written") -> None:
        """After a failed or interrupted write: stop LeRobot's writer, roll the folder back to the last commit, and
        close. Raises ``OutputWriteError`` when ``err`` is a failed write."""
        failure = _write_failure(err, self.root, started)
        self._disarm()
        repair_dataset(self.root)
        committed = self.num_episodes = read_commit(self.root)["total_episodes"]
        if failure is not None:
            path, cause = failure
            raise OutputWriteError(path, cause, f"{lost} was being written as episode {committed} and is lost (so are "
                                   f"the episodes still running); the dataset {self.root} holds its {committed} "
                                   "complete episodes; once there is space, add more with dataset.append=true"
                                   ) from err

    def _disarm(self) -> None:
        """Stop LeRobot's writer without letting it write anything more: its video encoders are cancelled, its
        parquet writers closed, and its metadata buffer emptied (else its ``__del__`` safety net would flush a
        rolled-back episode's row later)."""
        self._closed = True
        ds = self.ds
        for step in (ds.writer.cancel_pending_videos, ds.writer.close_writer, ds.meta._close_writer):
            try:
                step()
            except Exception:  # noqa: BLE001, S110 - the folder is rolled back next whatever these leave
                pass
        ds.meta._metadata_buffer.clear()
        ds.writer._finalized = ds.meta._finalized = ds._is_finalized = True

    def close(self) -> None:
        """Finish: buffered episodes still running are dropped; the dataset on disk is complete (committed)."""
        if self._closed:
            return
        self._closed = True
        self.ds.finalize()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _brief(ft: dict[str, Any]) -> str:
    return f"{ft['dtype']} {list(ft['shape'])}" + (f" {ft['names']}" if ft.get("names") else "")
