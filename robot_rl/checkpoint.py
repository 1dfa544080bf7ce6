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

A checkpoint is written into ``.tmp-*`` first (every file fsynced), then renamed; orphan ``.tmp-*`` folders of a
killed writer are deleted when a ``CheckpointManager`` starts. Loading refuses any file that is not
safetensors or JSON (``UnsafeCheckpointError``: nothing is ever unpickled) and any file whose hash differs.
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
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

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
_TMP = ".tmp-"


class UnsafeCheckpointError(Exception):
    """The path holds something other than safetensors + JSON (a pickle, a .pt, an SB3 zip): refused unread."""


class CorruptCheckpointError(Exception):
    """The checkpoint is incomplete (no manifest) or a file's sha256 differs from the manifest."""


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
    """Inverse of ``flatten_tree``."""
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
    raise CorruptCheckpointError(f"unknown node in checkpoint tree: {str(skeleton)[:80]}")


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


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    _write_bytes(tmp, target.encode())
    os.replace(tmp, folder / name)
    _fsync_path(folder)


def write_checkpoint(path: Path, state: dict[str, Any], meta: dict[str, Any], policy: Any | None = None) -> Path:
    """Write one complete checkpoint folder at ``path`` atomically (tmp folder, fsync, rename)."""
    path = Path(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f"{_TMP}{path.name}-{uuid.uuid4().hex}"
    tmp.mkdir()
    tensors, skeleton = flatten_tree(state)
    _write_bytes(tmp / STATE_TENSORS, st_save(tensors))
    _write_bytes(tmp / STATE_TREE, json.dumps(skeleton).encode())
    _write_bytes(tmp / META, json.dumps({"format": FORMAT_VERSION, **meta}, indent=2, default=str).encode())
    if policy is not None:
        policy.save(tmp / POLICY_DIR)
        for p in (tmp / POLICY_DIR).iterdir():
            _fsync_path(p)
        _fsync_path(tmp / POLICY_DIR)
    manifest = {"format": FORMAT_VERSION,
                "files": {p.relative_to(tmp).as_posix(): _sha256(p) for p in _files(tmp)}}
    _write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
    _fsync_path(tmp)
    if path.exists():  # a resumed run rewriting an iteration it had written before being killed
        old = parent / f"{_TMP}old-{path.name}-{uuid.uuid4().hex}"
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)
    _fsync_path(parent)
    return path


# ---------------------------------------------------------------------------------------------- loading
def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from a run folder, a ``checkpoints/`` folder, its ``latest``/``best`` pointer, or a
    checkpoint folder (or a file in it).

    Raises:
        UnsafeCheckpointError: for a file or folder holding anything but safetensors/JSON (e.g. ``model.pt``).
        FileNotFoundError: when no checkpoint is there.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    if path.is_file() and path.name in (LATEST, BEST):  # a pointer: checkpoints/latest or checkpoints/best
        return path.parent / path.read_text().strip()
    if path.is_file():
        if path.suffix not in SAFE_SUFFIXES:
            raise UnsafeCheckpointError(
                f"refusing to load {path}: only safetensors + JSON checkpoints are accepted (pickle-based formats "
                "such as .pt/.pth/.pkl/.ckpt/.zip can execute code when loaded)")
        path = path.parent
    for folder in (path, path / CHECKPOINTS_DIR):
        if (folder / LATEST).is_file():
            name = (folder / LATEST).read_text().strip()
            return folder / name
    if any((path / f).is_file() for f in (MANIFEST, STATE_TENSORS, STATE_TREE, META)):
        return path  # a checkpoint folder (verify_checkpoint says whether it is complete)
    unsafe = [p.name for p in _files(path) if p.suffix not in SAFE_SUFFIXES and p.name not in (LATEST, BEST)]
    if unsafe:
        raise UnsafeCheckpointError(f"refusing to load {path}: it holds non-safetensors/JSON files {unsafe[:5]}")
    raise FileNotFoundError(f"no checkpoint in {path} (no {MANIFEST}, no '{LATEST}' pointer)")


def verify_checkpoint(path: Path) -> dict[str, str]:
    """Check the folder holds only safetensors/JSON files, each listed in the manifest with its sha256."""
    files = _files(path)
    unsafe = [p.relative_to(path).as_posix() for p in files if p.suffix not in SAFE_SUFFIXES or p.is_symlink()]
    if unsafe:
        raise UnsafeCheckpointError(f"refusing to load {path}: non-safetensors/JSON files or links {unsafe[:5]}")
    if not (path / MANIFEST).is_file():
        raise CorruptCheckpointError(f"{path} has no {MANIFEST}: the checkpoint is incomplete")
    listed = json.loads((path / MANIFEST).read_text())["files"]
    present = {p.relative_to(path).as_posix() for p in files} - {MANIFEST}
    if present != set(listed):
        raise CorruptCheckpointError(f"{path}: files {sorted(present ^ set(listed))} differ from the manifest")
    for rel, digest in listed.items():
        if _sha256(path / rel) != digest:
            raise CorruptCheckpointError(f"{path / rel}: sha256 differs from the manifest (corrupted)")
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
    """Resolve and verify a checkpoint; return its folder and meta.json (no tensors read)."""
    folder = resolve_checkpoint(path)
    verify_checkpoint(folder)
    return folder, json.loads((folder / META).read_text())


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Resolve, verify and read a checkpoint. Only safetensors and JSON are parsed; nothing is unpickled."""
    folder, meta = load_meta(path)
    tensors = st_load((folder / STATE_TENSORS).read_bytes())
    skeleton = json.loads((folder / STATE_TREE).read_text())
    return Checkpoint(folder, unflatten_tree(skeleton, tensors), meta)


def check_resume_compatible(meta: dict[str, Any], expected: dict[str, Any]) -> None:
    """Refuse to resume onto a different task, observation spec, action dimension or algorithm.

    Args:
        meta: the checkpoint's meta.json.
        expected: the same keys (``task``, ``algo``, ``obs_spec``, ``action_dim``) for the run being started.
    """
    diffs = [f"{k}: checkpoint has {meta.get(k)!r}, this run has {expected[k]!r}"
             for k in ("task", "algo", "obs_spec", "action_dim") if json.loads(json.dumps(meta.get(k)))
             != json.loads(json.dumps(expected[k]))]
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
        self.root.mkdir(parents=True, exist_ok=True)
        for p in self.root.glob(f"{_TMP}*"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        self.best_score = -math.inf
        best = self.best()
        if best is not None and (best / META).is_file():
            score = json.loads((best / META).read_text()).get("score")
            self.best_score = -math.inf if score is None else float(score)

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
        """Write checkpoint ``iteration``, swap ``latest`` (and ``best`` if ``score`` beats it), then prune."""
        name = f"iter_{iteration:08d}"
        path = write_checkpoint(self.root / name, state, {**meta, "iteration": iteration, "score": score}, policy)
        _replace_pointer(self.root, LATEST, name)
        if score is not None and math.isfinite(score) and score > self.best_score:
            self.best_score = score
            _replace_pointer(self.root, BEST, name)
        self._prune()
        return path

    def _prune(self) -> None:
        keep = {p.name for p in (self.latest(), self.best()) if p is not None}
        done = sorted(p for p in self.root.glob("iter_*") if p.is_dir())
        keep |= {p.name for p in done[-self.keep_last:]}
        for p in done:
            if p.name not in keep:
                trash = self.root / f"{_TMP}del-{p.name}-{uuid.uuid4().hex}"
                os.rename(p, trash)
                shutil.rmtree(trash, ignore_errors=True)
