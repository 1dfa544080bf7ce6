"""Checkpoints as safetensors + JSON only, written atomically, verified on load (RELIABILITY.md B1, B2, B6, F1).

Layout of a run's ``checkpoints/`` folder::

    iter_00000042/
        state.safetensors   every tensor of the state tree (networks, optimizer moments, env physics, RNGs)
        state.json          the tree's structure and its non-tensor leaves (ints, floats, strings)
        meta.json           iteration, env steps, score, task / observation / action spec, the run's config
        policy/             the exported policy (config.json + model.safetensors): loads with ``policies`` alone
        manifest.json       sha256 of every other file; written last, so its presence means "complete"
    latest                  name of the newest complete checkpoint (swapped with os.replace after fsync)
    best                    name of the best-scoring one (kept out of the keep-last-K pruning)

A checkpoint is written into ``.tmp-*`` first (every file fsynced), then renamed; a write that fails removes its
``.tmp-*`` folder, and orphans of a killed writer are deleted by ``remove_partial_writes`` (a run calls it before it
writes anything else, and so does a ``CheckpointManager`` when it starts). A write that fails (no space left, a
read-only disk) is an ``OutputWriteError`` naming the file, the OS error and the last good checkpoint.

Loading raises one error type, ``CheckpointError`` (a ``policies.safetensors_check.MalformedFileError``), for every
way a checkpoint can be bad: ``UnsafeCheckpointError`` for anything but safetensors or JSON (nothing is ever
unpickled), ``CorruptCheckpointError`` for a missing manifest or a hash that differs, and ``CheckpointError`` itself
for content that is malformed although its hash matches (a bad safetensors header, dtype, shape, a tensor missing
from or not named in the state tree, JSON that is not what was written).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save as st_save

from policies.safetensors_check import MalformedFileError, load_safetensors

if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 10):  # CVE-2025-32434, CVE-2026-24747
    raise ImportError(f"robot_rl needs torch>=2.10 (hardened weights_only loading), found {torch.__version__}")

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATE_TENSORS = "state.safetensors"
STATE_TREE = "state.json"
META = "meta.json"
POLICY_DIR = "policy"
LATEST = "latest"
BEST = "best"
CHECKPOINTS_DIR = "checkpoints"
SAFE_SUFFIXES = (".safetensors", ".json")
# what else a run folder holds (config, curve, plots, videos, logs): no weights in them, so a folder of these is "not
# a checkpoint" rather than "unsafe"
RUN_FOLDER_SUFFIXES = (".yaml", ".yml", ".jsonl", ".png", ".mp4", ".md", ".txt", ".log", ".csv")
_TMP = ".tmp-"


class CheckpointError(MalformedFileError):
    """A checkpoint that cannot be used, built as ``CheckpointError(path, problem)``: ``path`` is the file or folder
    at fault. A command line catches this (or its base ``MalformedFileError``, which exported policies share)."""


class UnsafeCheckpointError(CheckpointError):
    """The path holds something other than safetensors + JSON (a pickle, a .pt, an SB3 zip): refused unread."""


class CorruptCheckpointError(CheckpointError):
    """The checkpoint is incomplete (no manifest) or a file's sha256 differs from the manifest."""


class OutputWriteError(Exception):
    """A write the run cannot go on without (a checkpoint, the learning curve) failed: no space left, a read-only or
    vanished disk. Any writer whose loss must stop the work can raise it (a dataset recorder: ``last_good`` then
    names the last episode saved).

    Args:
        path: the file or folder being written.
        cause: the OS error (``errno``, ``strerror``).
        last_good: what is intact and how to continue (``resume_hint``); None when the writer does not know, for
            the runner to fill in.
    """

    def __init__(self, path: str | Path, cause: OSError, last_good: str | None = None) -> None:
        super().__init__(str(path), cause, last_good)
        self.path, self.cause, self.last_good = Path(path), cause, last_good

    def __str__(self) -> str:
        why = self.cause.strerror or str(self.cause)
        code = f" [errno {self.cause.errno}]" if self.cause.errno is not None else ""
        return f"could not write {self.path}: {why}{code}" + (f"; {self.last_good}" if self.last_good else "")


def resume_hint(latest: Path | None) -> str:
    """The part of a write error that says where to continue from: the last good checkpoint, if any."""
    if latest is None:
        return "no checkpoint has been written yet, so the run cannot be resumed"
    return f"the last good checkpoint is {latest}; once there is space, continue with resume={latest}"


class ResumeMismatchError(ValueError):
    """The checkpoint was made for a different task, observation space, action space or algorithm."""


# ------------------------------------------------------------------------------------------- tree <-> files
def flatten_tree(tree: Any, prefix: str = "") -> tuple[dict[str, torch.Tensor], Any]:
    """Split a nested structure into tensors (for safetensors) and a JSON skeleton that refers to them.

    Handles dicts (any str/int keys), lists, tuples, tensors, numpy arrays, and JSON scalars (non-finite
    floats included). Optimizer state dicts, RNG states and env state dicts are all such trees.
    """
    tensors: dict[str, torch.Tensor] = {}

    def enc(x: Any, path: str) -> Any:
        if isinstance(x, torch.Tensor):
            tensors[path] = x.detach().to("cpu").contiguous().clone()
            return {"__type__": "tensor", "key": path}
        if isinstance(x, np.ndarray):
            tensors[path] = torch.from_numpy(np.ascontiguousarray(x).copy())
            return {"__type__": "ndarray", "key": path}
        if isinstance(x, dict):
            for k in x:
                if not isinstance(k, str | int) or isinstance(k, bool):
                    raise TypeError(f"checkpoint dict keys must be str or int, got {type(k).__name__} at {path!r}")
            return {"__type__": "dict", "items": [[k, enc(v, f"{path}/{k}")] for k, v in x.items()]}
        if isinstance(x, tuple | list):
            items = [enc(v, f"{path}/{i}") for i, v in enumerate(x)]
            return {"__type__": "tuple", "items": items} if isinstance(x, tuple) else items
        if isinstance(x, np.generic):
            x = x.item()
        if isinstance(x, float) and not math.isfinite(x):
            return {"__type__": "float", "value": repr(x)}
        if x is None or isinstance(x, bool | int | float | str):
            return x
        raise TypeError(f"cannot checkpoint a {type(x).__name__} at {path!r}: use tensors, arrays or JSON scalars")

    return tensors, enc(tree, prefix)


def unflatten_tree(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of ``flatten_tree``.

    Raises:
        KeyError, TypeError, ValueError: for a skeleton that ``flatten_tree`` did not write (``load_checkpoint``
            turns these into a ``CheckpointError``).
    """
    if isinstance(skeleton, list):
        return [unflatten_tree(v, tensors) for v in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    kind = skeleton.get("__type__")
    if kind == "tensor":
        return tensors[skeleton["key"]]
    if kind == "ndarray":
        return tensors[skeleton["key"]].numpy()
    if kind == "dict":
        return {k: unflatten_tree(v, tensors) for k, v in skeleton["items"]}
    if kind == "tuple":
        return tuple(unflatten_tree(v, tensors) for v in skeleton["items"])
    if kind == "float":
        return float(skeleton["value"])
    raise ValueError(f"unknown node in the checkpoint tree: {str(skeleton)[:80]}")


# ------------------------------------------------------------------------------------------------ RNG
def rng_state() -> dict[str, Any]:
    """The global RNG states of python, numpy and torch (CPU and every CUDA device)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


# ------------------------------------------------------------------------------------------- file helpers
def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, tmp: Path) -> None:
    """Write ``path`` as a whole or not at all: ``data`` into ``tmp`` (beside it), fsync, ``os.replace``, fsync the
    folder. A kill at any instant leaves the old file or the new one (and, at worst, ``tmp``)."""
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())


def _replace_pointer(folder: Path, name: str, target: str) -> None:
    tmp = folder / f"{_TMP}{name}-{uuid.uuid4().hex}"
    try:
        _write_bytes(tmp, target.encode())
        os.replace(tmp, folder / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(folder)


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


def check_new_run_dir(run_dir: str | Path) -> None:
    """Refuse to start a new run (no ``resume=``) in a folder that holds another run's checkpoints: the new learning
    curve would follow the old one in its file, and old checkpoints of later iterations would outlive the new run as
    the folder's last ones. Nothing is written or removed.

    Raises:
        ValueError: ``run_dir/checkpoints`` holds an ``iter_*`` checkpoint; names the folder and the two ways on.
    """
    ckpts = Path(run_dir) / CHECKPOINTS_DIR
    if ckpts.is_dir() and any(p.name.startswith("iter_") for p in ckpts.iterdir()):
        raise ValueError(f"bad config: run_dir={run_dir} already holds a run ({ckpts}); resume={run_dir} continues "
                         f"it, and another run_dir (or none: a new timestamped folder) starts a new one")


def remove_partial_writes(root: str | Path) -> list[Path]:
    """Delete the ``.tmp-*`` entries in the ``checkpoints/`` folder ``root``: checkpoints, pointers and pruned
    folders a killed or failed writer left half-written. A run calls this before writing anything else, so that a
    disk filled by a partial checkpoint has its space back. Returns what was removed."""
    stale = sorted(Path(root).glob(f"{_TMP}*"))
    for p in stale:
        _remove(p)
    return stale


def write_checkpoint(path: Path, state: dict[str, Any], meta: dict[str, Any], policy: Any | None = None) -> Path:
    """Write one complete checkpoint folder at ``path`` atomically (tmp folder, fsync, rename).

    A failure (an ``OSError`` such as no space left, or an interrupt) removes the partial tmp folder and re-raises;
    an existing checkpoint at ``path`` is then untouched.
    """
    path = Path(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f"{_TMP}{path.name}-{uuid.uuid4().hex}"
    tensors, skeleton = flatten_tree(state)
    tmp.mkdir()
    try:
        _write_tmp(tmp, tensors, skeleton, meta, policy)
    except BaseException:
        _remove(tmp)
        raise
    if path.exists():  # a resumed run rewriting an iteration it had written before being killed
        old = parent / f"{_TMP}old-{path.name}-{uuid.uuid4().hex}"
        os.rename(path, old)
        os.rename(tmp, path)
        _remove(old)
    else:
        os.rename(tmp, path)
    fsync_path(parent)
    return path


def _write_tmp(tmp: Path, tensors: dict[str, torch.Tensor], skeleton: Any, meta: dict[str, Any],
               policy: Any | None) -> None:
    """Every file of a checkpoint into the folder ``tmp``, each fsynced, the manifest last."""
    _write_bytes(tmp / STATE_TENSORS, st_save(tensors))
    _write_bytes(tmp / STATE_TREE, json.dumps(skeleton).encode())
    _write_bytes(tmp / META, json.dumps({"format": FORMAT_VERSION, **meta}, indent=2, default=str).encode())
    if policy is not None:
        policy.save(tmp / POLICY_DIR)
        for p in (tmp / POLICY_DIR).iterdir():
            fsync_path(p)
        fsync_path(tmp / POLICY_DIR)
    manifest = {"format": FORMAT_VERSION,
                "files": {p.relative_to(tmp).as_posix(): _sha256(p) for p in _files(tmp)}}
    _write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
    fsync_path(tmp)


# ---------------------------------------------------------------------------------------------- loading
def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from a run folder, a ``checkpoints/`` folder, its ``latest``/``best`` pointer, or a
    checkpoint folder (or a file in it).

    Raises:
        UnsafeCheckpointError: for a file or folder holding anything but safetensors/JSON (e.g. ``model.pt``).
        CheckpointError: for a ``latest``/``best`` pointer that does not name a checkpoint folder beside it.
        FileNotFoundError: when no checkpoint is there.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    if path.is_file() and path.name in (LATEST, BEST):  # a pointer: checkpoints/latest or checkpoints/best
        return _follow_pointer(path)
    if path.is_file():
        if path.suffix not in SAFE_SUFFIXES:
            raise UnsafeCheckpointError(
                path, "refusing to load: only safetensors + JSON checkpoints are accepted (pickle-based formats "
                "such as .pt/.pth/.pkl/.ckpt/.zip can execute code when loaded)")
        path = path.parent
    for folder in (path, path / CHECKPOINTS_DIR):
        if (folder / LATEST).is_file():
            return _follow_pointer(folder / LATEST)
    if any((path / f).is_file() for f in (MANIFEST, STATE_TENSORS, STATE_TREE, META)):
        return path  # a checkpoint folder (verify_checkpoint says whether it is complete)
    unsafe = sorted({p.name for p in _files(path) if p.suffix not in SAFE_SUFFIXES + RUN_FOLDER_SUFFIXES
                     and p.name not in (LATEST, BEST) and "tfevents" not in p.name})
    if unsafe:  # weights in another format (a pickle can run code when loaded): named as what they are
        raise UnsafeCheckpointError(path, f"refusing to load: it holds non-safetensors/JSON files {unsafe[:5]}")
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path} is an exported policy folder, not a checkpoint: give its checkpoint "
                                f"({path.parent}) or the run folder")
    raise FileNotFoundError(f"no checkpoint in {path}: not a run folder (no {CHECKPOINTS_DIR}/{LATEST}) nor a "
                            f"checkpoint folder (no {MANIFEST})")


def _follow_pointer(pointer: Path) -> Path:
    """The checkpoint folder a ``latest``/``best`` file names: a plain name of a sibling folder, nothing else."""
    try:
        name = pointer.read_bytes()[:256].decode("ascii").strip()
    except UnicodeDecodeError:
        name = ""
    if not name or name in (".", "..") or "/" in name or "\\" in name or not (pointer.parent / name).is_dir():
        raise CheckpointError(pointer, "does not name a checkpoint folder beside it")
    return pointer.parent / name


def read_json(path: Path, error: type[CheckpointError] = CheckpointError) -> dict[str, Any]:
    """A JSON object from a checkpoint file; ``error(path, ...)`` when it is not one (bad UTF-8, bad JSON, a list)."""
    try:
        value = json.loads(path.read_bytes())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise error(path, f"not JSON ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(value, dict):
        raise error(path, f"holds a JSON {type(value).__name__}, not an object")
    return value


def verify_checkpoint(path: Path) -> dict[str, str]:
    """Check the folder holds only safetensors/JSON files, each listed in the manifest with its sha256."""
    files = _files(path)
    unsafe = [p.relative_to(path).as_posix() for p in files if p.suffix not in SAFE_SUFFIXES or p.is_symlink()]
    if unsafe:
        raise UnsafeCheckpointError(path, f"refusing to load: non-safetensors/JSON files or links {unsafe[:5]}")
    if not (path / MANIFEST).is_file():
        raise CorruptCheckpointError(path, f"has no {MANIFEST}: the checkpoint is incomplete")
    listed = read_json(path / MANIFEST, CorruptCheckpointError).get("files")
    if not isinstance(listed, dict) or not all(isinstance(v, str) for v in listed.values()):
        raise CorruptCheckpointError(path / MANIFEST, "'files' must map each file to its sha256")
    present = {p.relative_to(path).as_posix() for p in files} - {MANIFEST}
    if present != set(listed):
        raise CorruptCheckpointError(path, f"files {sorted(present ^ set(listed))[:5]} differ from the manifest")
    for rel, digest in listed.items():
        if _sha256(path / rel) != digest:
            raise CorruptCheckpointError(path / rel, "sha256 differs from the manifest (corrupted)")
    return listed


@dataclass
class Checkpoint:
    path: Path  # the checkpoint folder
    state: dict[str, Any]  # the tree given to write_checkpoint (tensors on the CPU)
    meta: dict[str, Any]  # meta.json

    @property
    def policy_dir(self) -> Path:
        return self.path / POLICY_DIR


def load_meta(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """Resolve and verify a checkpoint; return its folder and meta.json (no tensors read).

    Raises:
        CheckpointError: (or a subclass) for anything wrong with the checkpoint; FileNotFoundError when none is there.
    """
    folder = resolve_checkpoint(path)
    verify_checkpoint(folder)
    meta = read_json(folder / META)
    if meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(folder / META, f"format {str(meta.get('format'))[:20]} is not {FORMAT_VERSION}")
    return folder, meta


def _tensor_keys(skeleton: Any, out: set[str]) -> set[str]:
    """The tensor names a state tree skeleton refers to (every ``key`` of a tensor or array node)."""
    if isinstance(skeleton, list):
        for v in skeleton:
            _tensor_keys(v, out)
    elif isinstance(skeleton, dict):
        if skeleton.get("__type__") in ("tensor", "ndarray"):
            out.add(skeleton.get("key"))
        for v in skeleton.get("items", ()) if isinstance(skeleton.get("items"), list) else ():
            _tensor_keys(v, out)
    return out


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Resolve, verify and read a checkpoint. Only safetensors and JSON are parsed; nothing is unpickled.

    Raises:
        CheckpointError: (or a subclass) for anything wrong with the checkpoint, including tensors the state tree
            does not name or names that are not in ``state.safetensors``.
        FileNotFoundError: when no checkpoint is there.
    """
    folder, meta = load_meta(path)
    tensors = load_safetensors(folder / STATE_TENSORS, CheckpointError)
    file = folder / STATE_TREE
    try:
        skeleton = json.loads(file.read_bytes())
        named = _tensor_keys(skeleton, set())
        if named != set(tensors):
            raise ValueError(f"the tree names tensors {sorted(map(str, named - set(tensors)))[:5]} that "
                             f"{STATE_TENSORS} lacks, and omits {sorted(set(tensors) - named)[:5]} that it holds")
        state = unflatten_tree(skeleton, tensors)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as e:
        problem = f"not a state tree this loader wrote ({type(e).__name__}: {str(e)[:200]})"
        raise CheckpointError(file, problem) from None
    if not isinstance(state, dict):
        raise CheckpointError(file, f"the state tree is a {type(state).__name__}, not a dict")
    return Checkpoint(folder, state, meta)


# What a resumed run must share with its checkpoint (an offline run names its dataset instead of a task).
RESUME_KEYS = ("task", "dataset", "algo", "obs_spec", "action_dim")


def check_resume_compatible(meta: dict[str, Any], expected: dict[str, Any]) -> None:
    """Refuse to resume onto a different task (or dataset), observation spec, action dimension or algorithm.

    Args:
        meta: the checkpoint's meta.json.
        expected: the run being started; its keys among ``RESUME_KEYS`` are compared (a training run names its
            ``task``, an offline run its ``dataset`` fingerprint), each also when the checkpoint lacks it.
    """
    diffs = [f"{k}: checkpoint has {meta.get(k)!r}, this run has {expected[k]!r}"
             for k in RESUME_KEYS if k in expected and json.loads(json.dumps(meta.get(k)))
             != json.loads(json.dumps(expected[k]))]
    if diffs and any(d.startswith("dataset:") for d in diffs) and "dataset_root" in expected:
        # a fingerprint says that the data differ; the folders say which (the same folder: its content changed)
        diffs.append(f"dataset folders: the checkpoint's {meta.get('dataset_root')!r}, this run's "
                     f"{expected['dataset_root']!r}")
    if diffs:
        raise ResumeMismatchError("cannot resume: the checkpoint was made for a different setup; " + "; ".join(diffs))


# ---------------------------------------------------------------------------------------------- manager
class CheckpointManager:
    """Writes ``iter_XXXXXXXX`` checkpoints into ``root``; keeps the last ``keep_last`` and the best.

    Args:
        root: the ``checkpoints/`` folder (created; orphan ``.tmp-*`` entries of killed writers are removed).
        keep_last: K, complete checkpoints kept besides the best.
    """

    def __init__(self, root: str | Path, keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"checkpoint.keep_last must be >= 1, got {keep_last}")
        self.root, self.keep_last = Path(root), keep_last
        remove_partial_writes(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.best_score = -math.inf
        best = self.best()
        if best is not None and (best / META).is_file():
            score = read_json(best / META).get("score")
            self.best_score = float(score) if isinstance(score, int | float) else -math.inf

    def _pointer(self, name: str) -> Path | None:
        f = self.root / name
        if not f.is_file():
            return None
        target = self.root / f.read_text().strip()
        return target if target.is_dir() else None

    def latest(self) -> Path | None:
        return self._pointer(LATEST)

    def best(self) -> Path | None:
        return self._pointer(BEST)

    def save(self, iteration: int, state: dict[str, Any], meta: dict[str, Any], policy: Any | None = None,
             score: float | None = None) -> Path:
        """Write checkpoint ``iteration``, swap ``latest`` (and ``best`` if ``score`` beats it), then prune.

        Raises:
            OutputWriteError: the write failed (no space left, a read-only disk); the partial folder is removed
                and ``latest`` still names the previous checkpoint, which the error names too.
        """
        name = f"iter_{iteration:08d}"
        try:
            path = write_checkpoint(self.root / name, state, {**meta, "iteration": iteration, "score": score},
                                    policy)
            _replace_pointer(self.root, LATEST, name)
            if score is not None and math.isfinite(score) and score > self.best_score:
                self.best_score = score
                _replace_pointer(self.root, BEST, name)
            self._prune()
        except OSError as e:  # write_checkpoint removed its partial folder
            raise OutputWriteError(self.root / name, e, resume_hint(self.latest())) from e
        return path

    def _prune(self) -> None:
        keep = {p.name for p in (self.latest(), self.best()) if p is not None}
        done = sorted(p for p in self.root.glob("iter_*") if p.is_dir())
        keep |= {p.name for p in done[-self.keep_last:]}
        for p in done:
            if p.name not in keep:
                trash = self.root / f"{_TMP}del-{p.name}-{uuid.uuid4().hex}"
                os.rename(p, trash)
                _remove(trash)
