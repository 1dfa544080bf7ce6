"""Video decoding in a child process: a decoder that crashes, hangs or allocates without bound on a damaged file
costs a typed error, never the training process (RELIABILITY C5: 0 segfaults, 0 hangs, memory <= 2 GB).

FFmpeg's decoders are C code fed whatever bytes are on disk. In the loader's own process, a file that made one
crash would take the run (and its unsaved state) down with it, and a runaway allocation could push the machine
into swap. So the loader sends each video file to a child, ``python -m robot_rl.data.decode_process``:

- a request is one JSON line on the child's stdin (file, backend, frame size, target times, tolerance);
- the child answers on stdout with binary messages: ``F`` (a frame: the target span [p, q) it serves and its
  3·H·W bytes), then ``D`` (done) or ``E`` (the decoder's exception as text);
- its data segment is capped with ``RLIMIT_DATA`` (``memory_limit_gib``), so an allocation past it is a
  MemoryError in the child;
- the parent waits at most ``stall_s`` for each message, then kills the child.

A child that dies (a signal, an exit) or stalls becomes a ``DecodeError`` naming the file, the time and episode of
the first frame it did not deliver, and how it died; the next file gets a fresh child. One child serves every
load of a process (started on first use, ~0.2 s: it imports numpy and PyAV, not torch), and a forked process
starts its own. Cost on this machine: about the pipe copy of each frame (12 KB at 64x64), measured in
``tests/test_decode_process.py``'s pixel check.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from robot_rl.data.video_decode import DecodeError, FileTargets, matched_frames

_HEADER = struct.Struct("<cqq")  # kind, then (F) the target span p, q; (E) 0, the text's length; (D) 0, 0
FRAME, ERROR, DONE = b"F", b"E", b"D"
MEMORY_LIMIT_GIB = 2.0  # RELIABILITY C5: memory <= 2 GB while decoding a damaged file
STALL_S = 30.0  # no message for this long: the decoder hangs (a healthy one sends a frame every few ms)


class DecoderProcess:
    """A child process that decodes video files into frame rows on request (see the module docstring)."""

    def __init__(self, argv: Sequence[str] | None = None, memory_limit_gib: float = MEMORY_LIMIT_GIB,
                 stall_s: float = STALL_S):
        """``argv``: the child's command (default: this module under the current interpreter). Tests give a
        child that faults on purpose (``tests/_faulty_decoder.py``)."""
        limit = str(int(memory_limit_gib * 2**30))
        self.argv = list(argv) if argv is not None else [sys.executable, "-m", __name__]
        self.argv.append(limit)
        self.stall_s = stall_s
        self.proc: subprocess.Popen | None = None
        self.owner = os.getpid()
        self.lock = threading.Lock()

    # ------------------------------------------------------------------------------------------------ parent
    def decode(self, backend: str, targets: FileTargets, cache: np.ndarray, tolerance_s: float,
               on_progress: Callable[[int], None] = lambda n: None) -> None:
        """Fill ``cache[targets.rows]`` (uint8 [N, 3, H, W], a numpy view of the loader's cache) from one file.

        A target is served by the decoded frame whose timestamp lies within ``tolerance_s`` of it. Raises
        DecodeError naming the file and the first episode left without a frame: a truncated or short file, the
        decoder's error, or the child's death or stall. ``on_progress(n)``: n more rows are filled.
        """
        if not targets.path.is_file():
            raise DecodeError(f"video file {targets.path} is missing")
        h, w = cache.shape[2], cache.shape[3]
        filled = np.zeros(len(targets.rows), dtype=bool)
        with self.lock:
            try:
                self._send({"backend": backend, "path": str(targets.path), "height": h, "width": w,
                            "times": targets.times.tolist(), "tolerance_s": tolerance_s})
                while True:
                    kind, p, q = _HEADER.unpack(self._read(_HEADER.size))
                    if kind == FRAME:
                        frame = np.frombuffer(self._read(3 * h * w), dtype=np.uint8).reshape(3, h, w)
                        cache[targets.rows[p:q]] = frame
                        filled[p:q] = True
                        on_progress(q - p)
                    elif kind == ERROR:
                        raise DecodeError(self._where(targets, filled, "cannot be decoded")
                                          + ": " + self._read(q).decode("utf-8", "replace"))
                    elif kind == DONE:
                        break
                    else:
                        raise _ChildLost(f"sent an unknown message {kind!r}")
            except _ChildLost as e:
                self._stop()
                raise DecodeError(self._where(targets, filled, "cannot be decoded") + f": the decoder process {e}"
                                  ) from None
            except DecodeError:  # the child reported its decoder's error and waits for the next file
                raise
            except BaseException:  # Ctrl-C or a failing progress callback mid-file: the rest of this file's
                self._stop()  # answer is still in the pipe, so the next file gets a fresh child
                raise
        if not filled.all():
            raise DecodeError(self._where(targets, filled, "has no frame")
                              + f"; {int((~filled).sum())} frames missing: is the file truncated?")

    @staticmethod
    def _where(targets: FileTargets, filled: np.ndarray, what: str) -> str:
        j = int(np.flatnonzero(~filled)[0]) if not filled.all() else len(filled) - 1
        return f"video file {targets.path} {what} at {targets.times[j]:.3f} s (episode {int(targets.episodes[j])})"

    def _start(self) -> subprocess.Popen:
        if self.proc is not None and self.owner == os.getpid():
            if self.proc.poll() is None:
                return self.proc
            self._stop()  # it died between files: reap it and close its pipes
        self.proc, self.owner = None, os.getpid()  # a forked copy never shares its parent's child
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child; closed in _stop
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # where robot_rl is importable from
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     env=env, bufsize=0, close_fds=True)
        return self.proc

    def _send(self, request: dict) -> None:
        proc = self._start()
        try:
            proc.stdin.write((json.dumps(request) + "\n").encode())
        except (BrokenPipeError, OSError):
            raise _ChildLost(self._death(proc)) from None

    def _read(self, n: int) -> bytes:
        proc, parts, left = self.proc, [], n
        fd = proc.stdout.fileno()
        while left:
            ready, _, _ = select.select([fd], [], [], self.stall_s)
            if not ready:
                raise _ChildLost(f"sent nothing for {self.stall_s:g} s (hung) and was killed")
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise _ChildLost(self._death(proc))
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def _death(self, proc: subprocess.Popen) -> str:
        """How the child ended, with the last line it wrote to stderr."""
        try:
            code = proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return "closed its output but did not exit"
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
               else f"exited with status {code}")
        self.stderr.seek(0)
        lines = self.stderr.read().decode("utf-8", "replace").strip().splitlines()
        return how + (f" ({lines[-1][:300]})" if lines else "")

    def _stop(self) -> None:
        if self.proc is not None and self.owner == os.getpid():
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
            self.stderr.close()
        self.proc = None

    def close(self) -> None:
        with self.lock:
            self._stop()


class _ChildLost(Exception):
    """The child died, stalled or broke the protocol (the text says which)."""


_shared: DecoderProcess | None = None
_shared_lock = threading.Lock()


def decode_file(backend: str, targets: FileTargets, cache: np.ndarray, tolerance_s: float,
                on_progress: Callable[[int], None] = lambda n: None) -> None:
    """``DecoderProcess.decode`` on the process's shared child (started on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = DecoderProcess()
            atexit.register(_shared.close)
        decoder = _shared
    decoder.decode(backend, targets, cache, tolerance_s, on_progress)


# ------------------------------------------------------------------------------------------------ child
def child_main(argv: Sequence[str], frames: Callable = matched_frames) -> None:
    """Serve requests from stdin until it closes. ``argv[-1]``: the data-segment cap in bytes. ``frames``: the
    decoder (``video_decode.matched_frames``; tests wrap it to fault)."""
    import resource

    limit = int(argv[-1])
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    out = os.fdopen(os.dup(1), "wb")  # the protocol's channel; anything else printed (Python or FFmpeg) goes to stderr
    os.dup2(2, 1)
    for line in sys.stdin.buffer:
        req = json.loads(line)
        times = np.asarray(req["times"], dtype=np.float64)
        targets = FileTargets(Path(req["path"]), times, np.arange(len(times)), np.zeros(len(times), np.int64))
        try:
            for p, q, frame in frames(req["backend"], targets, req["height"], req["width"], req["tolerance_s"]):
                out.write(_HEADER.pack(FRAME, p, q))
                out.write(frame.tobytes())
                out.flush()  # each frame leaves at once: a crash loses none already decoded
            out.write(_HEADER.pack(DONE, 0, 0))
        except MemoryError:
            _error(out, f"MemoryError: decoding needed more than the {limit / 2**30:g} GiB cap")
        except Exception as e:  # noqa: BLE001 - whatever the decoder raised goes back to the parent as text
            _error(out, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        out.flush()


def _error(out, text: str) -> None:
    data = text.encode()
    out.write(_HEADER.pack(ERROR, 0, len(data)))
    out.write(data)


if __name__ == "__main__":
    child_main(sys.argv[1:])
