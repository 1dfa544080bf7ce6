"""Refuse a malformed safetensors file before the parser sees it, in bounded time and memory (RELIABILITY.md F3).

The format: 8 bytes, a little-endian u64 ``n``; ``n`` bytes of a UTF-8 JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``; then the data buffer, which
the tensors' byte ranges must cover exactly, without holes or overlaps. The safetensors parser reads the declared
header length and every tensor entry before checking them, so a file declaring a huge header or listing 100,000
zero-size tensors takes seconds to refuse, and its errors come in several untyped kinds (``SafetensorError``,
``RuntimeError``). ``check_safetensors`` bounds the header length and the entry count first, then checks every
entry, and says what is wrong in one ``MalformedFileError``. Checkpoints (``robot_rl/checkpoint.py``) and exported
policies (``policies/persistence.py``) both read their tensors through ``load_safetensors``.
"""

from __future__ import annotations

import gc
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as _st_load

MAX_HEADER_BYTES = 16 * 2**20  # 16 MiB: ~80,000 entries with 200-character names
MAX_TENSORS = 16_384  # a VLA of a few billion parameters has ~1,000 tensors; with Adam's two moments ~3x that
MAX_RANK = 64  # dimensions of one tensor
METADATA_KEY = "__metadata__"
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}  # bytes per element


class MalformedFileError(ValueError):
    """A file that is not what its loader expects (bad header, dtype, shape, names, JSON, hash): which, and why.

    The base of ``policies.persistence.PolicyFileError`` and ``robot_rl.checkpoint.CheckpointError``: a command line
    catches this one class to turn every bad-file case into one line.

    Args:
        path: the file (or folder) at fault.
        problem: what is wrong with it, for a person.
    """

    def __init__(self, path: str | Path, problem: str) -> None:
        problem = " ".join(problem.split())  # one line: a command line prints it after "error: "
        super().__init__(str(path), problem)  # args kept as given, so the error pickles across processes
        self.path, self.problem = Path(path), problem

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


@dataclass(frozen=True)
class TensorEntry:
    """One header entry: dtype name, shape, and the byte range [begin, end) within the data buffer."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class _TooManyObjects(Exception):
    pass


def _parse_header(raw: bytes, max_tensors: int) -> object:
    """json.loads, stopped as soon as more objects than ``max_tensors`` entries (+ metadata, top level) appear.

    Every JSON object starts with a literal ``{`` byte, so a header with few of them cannot hold too many objects
    and is parsed at C speed; only a suspicious one pays for the counting hook (100,000 entries: ~0.1 s).
    """
    text = raw.decode("utf-8")
    count = 0

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        nonlocal count
        count += 1
        if count > max_tensors + 2:
            raise _TooManyObjects
        return dict(pairs)

    # The parse makes one dict per entry, none of them cyclic: with the collector on, a big header set off collections
    # of the whole heap (in a long-lived process with a large heap -- the test suite's -- refusing a 100,000-entry
    # header took 1.25 s instead of 0.14 s).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if raw.count(b"{") <= max_tensors + 2:
            return json.loads(text)
        return json.loads(text, object_pairs_hook=hook)
    finally:
        if was_enabled:
            gc.enable()


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_safetensors(data: bytes, path: str | Path = "<bytes>", max_header_bytes: int = MAX_HEADER_BYTES,
                      max_tensors: int = MAX_TENSORS) -> dict[str, TensorEntry]:
    """Validate a whole safetensors file held in ``data``; return its entries by name.

    Every check runs on numbers already bounded by the file's size: the declared header length first (before any
    header byte is decoded), then the entry count (while the JSON is parsed), then each entry's dtype, rank,
    shape x dtype size against its byte span, and finally that the spans tile the data buffer exactly.

    Raises:
        MalformedFileError: naming ``path`` and the first problem found.
    """

    def bad(problem: str) -> MalformedFileError:
        return MalformedFileError(path, f"not a valid safetensors file: {problem}")

    size = len(data)
    if size < 8:
        raise bad(f"{size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > max_header_bytes:
        raise bad(f"declared header length {n} bytes exceeds the limit of {max_header_bytes}")
    if 8 + n > size:
        raise bad(f"declared header length {n} bytes runs past the end of the {size}-byte file")
    try:
        header = _parse_header(data[8:8 + n], max_tensors)
    except _TooManyObjects:
        raise bad(f"more than {max_tensors} tensors in the header") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise bad(f"the header is not JSON ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(header, dict):
        raise bad(f"the header is a JSON {type(header).__name__}, not an object")
    meta = header.pop(METADATA_KEY, {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise bad(f"'{METADATA_KEY}' must map strings to strings")
    if len(header) > max_tensors:
        raise bad(f"{len(header)} tensors in the header, more than the limit of {max_tensors}")
    buffer = size - 8 - n
    entries: dict[str, TensorEntry] = {}
    for name, e in header.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"tensor {name[:80]!r}: an entry needs exactly dtype, shape and data_offsets")
        dtype, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            raise bad(f"tensor {name[:80]!r}: unknown dtype {str(dtype)[:20]!r}")
        if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_int(d) and d >= 0 for d in shape):
            raise bad(f"tensor {name[:80]!r}: shape must be at most {MAX_RANK} non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= buffer):
            raise bad(f"tensor {name[:80]!r}: data_offsets {str(offsets)[:60]} are not a range within the "
                      f"{buffer}-byte data buffer")
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]  # exact (Python ints); each dim <= buffer once nonzero
        if nbytes != offsets[1] - offsets[0]:
            raise bad(f"tensor {name[:80]!r}: shape {str(shape)[:60]} of {dtype} needs {str(nbytes)[:30]} bytes, "
                      f"its data_offsets span {offsets[1] - offsets[0]}")
        entries[name] = TensorEntry(dtype, tuple(shape), offsets[0], offsets[1])
    end = 0
    for name, e in sorted(entries.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if e.begin != end:
            what = "overlaps the one before" if e.begin < end else f"leaves a hole at bytes {end}..{e.begin}"
            raise bad(f"tensor {name[:80]!r}: data_offsets {[e.begin, e.end]} {what}")
        end = e.end
    if end != buffer:
        raise bad(f"the tensors cover {end} of the {buffer} data bytes")
    return entries


def load_safetensors(path: str | Path, error: type[MalformedFileError] = MalformedFileError,
                     max_header_bytes: int = MAX_HEADER_BYTES,
                     max_tensors: int = MAX_TENSORS) -> dict[str, torch.Tensor]:
    """Read, validate (``check_safetensors``) and parse a safetensors file into CPU tensors.

    Args:
        path: the ``.safetensors`` file.
        error: the ``MalformedFileError`` subclass to raise (a checkpoint's or a policy's), built as
            ``error(path, problem)``.

    Raises:
        error: for any malformed file, also for one the parser refuses after the checks passed (none known).
        OSError: when the file cannot be read at all.
    """
    data = Path(path).read_bytes()
    try:
        check_safetensors(data, path, max_header_bytes, max_tensors)
    except MalformedFileError as e:
        raise error(e.path, e.problem) from None
    try:
        return _st_load(data)
    except (SafetensorError, RuntimeError, ValueError, TypeError) as e:  # what the parser raises: the same bad file
        raise error(path, f"not a valid safetensors file: {type(e).__name__}: {str(e)[:200]}") from None
