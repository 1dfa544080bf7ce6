"""What travels between actors and the learner: one safetensors blob per message, never pickle (RELIABILITY.md E5).

A message is a safetensors file held in memory: its tensors (observations, actions, weights as bytes) and, in the
header's ``__metadata__``, one JSON object under ``robot_rl`` (the message's kind, sequence number, sender). A peer's
bytes are checked by ``policies.safetensors_check.check_safetensors`` (bounded header, entry count and byte spans)
before the parser sees them, and the JSON is plain data: nothing a peer sends can run code here.

Payloads larger than one message (a VLA's parameters: up to a few GB) travel as numbered chunks of one blob, each
with its own SHA-256 and the whole blob's; ``Reassembler`` refuses a corrupted, missing, repeated or out-of-order
chunk with a ``ChunkError`` (the receiver drops the partial blob and asks again).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from policies.safetensors_check import MalformedFileError, check_safetensors

HEADER_KEY = "robot_rl"
WIRE_VERSION = 2  # 2: transitions carry ep_counted (the episodes the policy drove alone)
MAX_MESSAGE_BYTES = 64 * 2**20  # one gRPC message (both ends are configured to this; gRPC's default is 4 MiB)
CHUNK_BYTES = 4 * 2**20  # a parameter blob's chunk: well under MAX_MESSAGE_BYTES


class WireError(ValueError):
    """A message that is not what the protocol allows (malformed, wrong kind, missing field): what and why."""


class MessageTooLarge(WireError):
    """A message over the size limit both ends are configured with: refused before it is sent."""


class Busy(WireError):
    """The receiver cannot take this message now (its queue is full): retry later; nothing is wrong with it."""


class ChunkError(WireError):
    """A parameter chunk that is corrupted, missing, repeated or out of order: the partial blob is dropped."""


def encode(header: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None,
           max_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
    """One message: ``tensors`` (CPU copies, contiguous) and ``header`` (JSON) as safetensors bytes.

    Raises:
        MessageTooLarge: the encoded message is over ``max_bytes`` (the text says what to change).
    """
    meta = {HEADER_KEY: json.dumps({"wire": WIRE_VERSION, **header}, allow_nan=False)}
    data = st_save({k: v.detach().to("cpu").contiguous() for k, v in (tensors or {}).items()}, metadata=meta)
    if len(data) > max_bytes:
        raise MessageTooLarge(f"a {header.get('kind', '?')!r} message of {len(data):,} bytes is over the limit of "
                              f"{max_bytes:,} bytes (remote.max_message_mb); send fewer steps per message "
                              f"(remote.steps_per_message) or raise the limit on both ends")
    return data


def bundle(messages: list[bytes], max_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
    """Several encoded messages as one (``kind`` "bundle"): a backlog crosses in one round trip instead of one per
    message, which on a slow link (a robot far from its learner) caps what gets through."""
    return encode({"kind": "bundle", "count": len(messages)},
                  {f"m{i}": torch.frombuffer(bytearray(m), dtype=torch.uint8) for i, m in enumerate(messages)},
                  max_bytes=max_bytes)


def unbundle(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> list[bytes]:
    """The messages of a decoded bundle, in order (each still to be decoded and checked like any other).

    Raises:
        WireError: the bundle's entries are not exactly m0 .. m<count - 1>, bytes each.
    """
    count = field(header, "count", int)
    names = [f"m{i}" for i in range(count)]
    if not 1 <= count <= 4096 or set(tensors) != set(names):
        raise WireError(f"malformed bundle: {count} messages declared, entries {sorted(tensors)[:8]}")
    if any(tensors[n].dtype != torch.uint8 or tensors[n].dim() != 1 for n in names):
        raise WireError("malformed bundle: an entry is not a flat byte tensor")
    return [tensors[n].numpy().tobytes() for n in names]


def decode(data: bytes, kind: str | None = None,
           max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(header, tensors) of a message from a peer; checked before it is parsed.

    Raises:
        WireError: too large, not a valid safetensors blob, no or malformed header, another wire version, or (with
            ``kind``) a message of another kind.
    """
    if len(data) > max_bytes:
        raise MessageTooLarge(f"a message of {len(data):,} bytes is over the limit of {max_bytes:,} bytes")
    try:
        check_safetensors(data, "<message>")
    except MalformedFileError as e:
        raise WireError(f"malformed message: {e.problem}") from None
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8:8 + n]).get("__metadata__") or {}  # valid JSON: check_safetensors parsed it
    raw = meta.get(HEADER_KEY)
    if raw is None:
        raise WireError(f"malformed message: no {HEADER_KEY!r} header")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise WireError(f"malformed message: the header is not JSON ({type(e).__name__})") from None
    if not isinstance(header, dict) or header.get("wire") != WIRE_VERSION:
        raise WireError(f"malformed message: wire version {header.get('wire') if isinstance(header, dict) else None}"
                        f", this end speaks {WIRE_VERSION}")
    if kind is not None and header.get("kind") != kind:
        raise WireError(f"expected a {kind!r} message, got {str(header.get('kind'))[:40]!r}")
    try:
        return header, st_load(data)
    except Exception as e:  # noqa: BLE001 - whatever the parser raises about a peer's bytes is a malformed message
        raise WireError(f"malformed message: {type(e).__name__}: {str(e)[:160]}") from None


def field(header: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """``header[name]``, refused unless present and of ``kind`` (bool is not an int here)."""
    value = header.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise WireError(f"malformed {header.get('kind', '?')!r} message: field {name!r} is "
                        f"{type(value).__name__}, not {getattr(kind, '__name__', kind)}")
    return value


# ------------------------------------------------------------------------------------------------ chunks
def split_blob(blob: bytes, header: dict[str, Any], chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """``blob`` as ``kind="chunk"`` messages of at most ``chunk_bytes`` payload each, ``header`` (e.g. the weights'
    version) in every one, with the chunk's index, the count, the blob's size and both digests."""
    total = max(1, -(-len(blob) // chunk_bytes))
    digest = hashlib.sha256(blob).hexdigest()
    for i in range(total):
        part = blob[i * chunk_bytes:(i + 1) * chunk_bytes]
        data = torch.frombuffer(bytearray(part), dtype=torch.uint8) if part else torch.zeros(0, dtype=torch.uint8)
        yield encode({**header, "kind": "chunk", "index": i, "total": total, "size": len(blob), "sha256": digest,
                      "chunk_sha256": hashlib.sha256(part).hexdigest()}, {"data": data},
                     max_bytes=chunk_bytes + 2**16)


class Reassembler:
    """Collects one blob's chunks in order; ``add`` returns the blob once the last one arrived."""

    def __init__(self, max_blob_bytes: int = 2**34) -> None:
        self.max_blob_bytes = max_blob_bytes
        self.parts: list[bytes] = []
        self.first: dict[str, Any] | None = None

    def reset(self) -> None:
        self.parts, self.first = [], None

    def add(self, message: bytes) -> tuple[bytes, dict[str, Any]] | None:
        """Take the next chunk; (blob, first chunk's header) when complete, else None.

        Raises:
            ChunkError: the chunk does not continue this blob (index, count, size or digest differ, or its bytes do
                not match its digest), or the finished blob's digest is wrong. The partial blob is dropped.
        """
        try:
            header, tensors = decode(message, "chunk", max_bytes=CHUNK_BYTES * 4 + 2**16)
            index, total = field(header, "index", int), field(header, "total", int)
            size, digest = field(header, "size", int), field(header, "sha256", str)
            part = tensors.get("data")
            if part is None or part.dtype != torch.uint8 or part.dim() != 1:
                raise ChunkError("a chunk needs one 1-D uint8 tensor 'data'")
            raw = part.numpy().tobytes()
            if hashlib.sha256(raw).hexdigest() != field(header, "chunk_sha256", str):
                raise ChunkError(f"chunk {index} of {total}: its bytes do not match its SHA-256 (corrupted)")
            if self.first is None:
                if index != 0:
                    raise ChunkError(f"chunk {index} of {total} arrived first; a blob starts at chunk 0")
                if not 0 <= size <= self.max_blob_bytes or total < 1:
                    raise ChunkError(f"a blob of {size:,} bytes in {total} chunks is over the limit of "
                                     f"{self.max_blob_bytes:,} bytes")
                self.first = header
            else:
                same = {k: header.get(k) for k in self.first if k not in ("index", "chunk_sha256")}
                if same != {k: v for k, v in self.first.items() if k not in ("index", "chunk_sha256")}:
                    raise ChunkError(f"chunk {index} belongs to another blob than chunk 0 (version, size or digest "
                                     "differ)")
                if index != len(self.parts):
                    raise ChunkError(f"chunk {index} of {total} arrived where chunk {len(self.parts)} was due "
                                     "(out of order, repeated or missing)")
            self.parts.append(raw)
            if len(self.parts) < total:
                return None
            blob = b"".join(self.parts)
            if len(blob) != size or hashlib.sha256(blob).hexdigest() != digest:
                raise ChunkError(f"the reassembled blob ({len(blob):,} bytes) does not match its size ({size:,}) or "
                                 "SHA-256")
            first = self.first
            self.reset()
            return blob, first
        except WireError as e:
            self.reset()
            raise e if isinstance(e, ChunkError) else ChunkError(str(e)) from None


# ----------------------------------------------------------------------------------------------- folders
def pack_folder(files: dict[str, bytes], header: dict[str, Any], max_bytes: int = 2**34) -> bytes:
    """A folder's files (name -> bytes; names without '/') as one message, e.g. an exported policy."""
    tensors = {f"file/{name}": torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
               else torch.zeros(0, dtype=torch.uint8) for name, data in files.items()}
    return encode({**header, "kind": "folder", "files": sorted(files)}, tensors, max_bytes=max_bytes)


def unpack_folder(blob: bytes, max_bytes: int = 2**34) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Inverse of ``pack_folder``: (header, name -> bytes). Names are plain file names (no path separators)."""
    header, tensors = decode(blob, "folder", max_bytes=max_bytes)
    names = field(header, "files", list)
    out: dict[str, bytes] = {}
    for name in names:
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            raise WireError(f"malformed folder message: file name {str(name)[:60]!r} is not a plain name")
        t = tensors.get(f"file/{name}")
        if t is None or t.dtype != torch.uint8 or t.dim() != 1:
            raise WireError(f"malformed folder message: no 1-D uint8 tensor for file {name!r}")
        out[name] = t.numpy().tobytes()
    return header, out
