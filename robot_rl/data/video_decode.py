"""Decode a LeRobotDataset v3 video file once, front to back, into the frames its dataset rows show.

A v3 video file holds several episodes back to back; episode e's frame i is the file's frame shown at
``from_timestamp[e] + timestamp[i]`` seconds. Each file is decoded front to back exactly once (no seeking), each
frame converted (and resized) only if some dataset row wants it. The loader runs this in a child process
(``decode_process``), so that nothing a damaged file does to FFmpeg can take the training process down; this
module imports neither torch nor anything the child does not need.

Backends: PyAV (bundles its own FFmpeg, so it works on every machine kind; resizing happens in swscale, per
frame, with area averaging) and torchcodec (needs the system's FFmpeg libraries; frames are decoded in batches
and resized in torch with antialiasing). ``resolve_backend("auto")`` picks PyAV when it imports, else torchcodec.
"""

from __future__ import annotations

import importlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

BACKENDS = ("auto", "pyav", "torchcodec")


class DecodeError(Exception):
    """A video or image could not be decoded; the loader turns it into a DatasetError naming episodes."""


@dataclass
class FileTargets:
    """What one video file must supply: ``times[j]`` seconds into the file goes to cache row ``rows[j]``.

    ``episodes[j]`` is the episode of row ``rows[j]`` (for error messages). Sorted by time.
    """

    path: Path
    times: np.ndarray  # float64 [M], seconds from the file's start
    rows: np.ndarray  # int64 [M], rows of the cache
    episodes: np.ndarray  # int64 [M]


def _loads(module: str) -> str | None:
    """None when ``module`` imports, else why not (one line)."""
    try:
        importlib.import_module(module)
        return None
    except (ImportError, OSError, RuntimeError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def resolve_backend(name: str) -> str:
    """The decoder to use: ``"pyav"`` or ``"torchcodec"``.

    "auto" prefers PyAV: every file is decoded once, front to back, which is what PyAV does natively, and its
    bundled FFmpeg makes it work (and decode the same pixels) on every machine kind; torchcodec's strength,
    fast accurate random seeks, is not used here. Raises DecodeError when the named backend cannot load.
    """
    if name not in BACKENDS:
        raise DecodeError(f"video_backend must be one of {BACKENDS}, got {name!r}")
    candidates = ("pyav", "torchcodec") if name == "auto" else (name,)
    why = {}
    for backend in candidates:
        problem = _loads("av" if backend == "pyav" else "torchcodec.decoders")
        if problem is None:
            return backend
        why[backend] = problem
    raise DecodeError("no video decoder loads here: " + "; ".join(f"{b}: {w}" for b, w in why.items())
                      + (" (torchcodec needs the system FFmpeg libraries, e.g. apt-get install ffmpeg)"
                         if "torchcodec" in why else ""))


def matched_frames(backend: str, targets: FileTargets, height: int, width: int, tolerance_s: float):
    """Decode ``targets.path`` front to back and yield ``(p, q, frame)``: the frame (uint8 [3, height, width])
    shown at ``targets.times[p:q]``, every target within ``tolerance_s`` of the frame's timestamp.

    Targets passed by without a frame close enough are never yielded (the caller finds them unfilled). Raises
    the decoder's own exceptions (OSError, ValueError, FFmpeg errors, ...) as they come.
    """
    times, p, m = targets.times, 0, len(targets.times)
    frames = _pyav_frames if backend == "pyav" else _torchcodec_frames
    for t, make in frames(targets.path, height, width):
        while p < m and times[p] < t - tolerance_s:  # passed without a frame close enough: stays unfilled
            p += 1
        if p >= m:
            break  # the rest of the file serves nobody
        q = p
        while q < m and abs(times[q] - t) <= tolerance_s:
            q += 1
        if q > p:
            yield p, q, make()  # several rows may show the same frame: made once
            p = q


def _pyav_frames(path: Path, height: int, width: int):
    """(seconds, maker of uint8 [3, H, W]) for each frame of the file, in presentation order."""
    import av
    from av.video.reformatter import VideoReformatter

    reformatter = VideoReformatter()  # keeps its swscale context between frames (to_ndarray makes one per call)
    with av.open(str(path)) as container:
        if not container.streams.video:
            raise ValueError("the file holds no video stream")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        if ctx is None or not ctx.width or not ctx.height:  # a damaged header
            raise ValueError("the video stream has no decoder or no frame size")
        if ctx.width * ctx.height <= 320 * 240:
            ctx.thread_count = 1  # small frames: threads cost more than they save (~2x here)
        else:
            stream.thread_type = "AUTO"
        base = stream.time_base
        for frame in container.decode(stream):
            if frame.pts is None:
                continue

            def make(frame=frame) -> np.ndarray:
                rgb = reformatter.reformat(frame, width=width, height=height, format="rgb24", interpolation="AREA")
                return np.ascontiguousarray(rgb.to_ndarray().transpose(2, 0, 1))

            yield float(frame.pts * base), make


def _torchcodec_frames(path: Path, height: int, width: int, batch: int = 256):
    """As ``_pyav_frames``, decoding ``batch`` frames at a time and resizing them in torch."""
    from torchcodec.decoders import VideoDecoder

    decoder = VideoDecoder(str(path), dimension_order="NCHW")
    n = decoder.metadata.num_frames
    for start in range(0, n, batch):
        got = decoder.get_frames_in_range(start, min(start + batch, n))
        data = resize_uint8(got.data, height, width).numpy()
        for k, t in enumerate(got.pts_seconds.tolist()):
            yield float(t), (lambda k=k, data=data: data[k])


def resize_uint8(images: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """uint8 [M, C, h, w] -> uint8 [M, C, height, width] (bilinear, antialiased when shrinking)."""
    if images.shape[-2:] == (height, width):
        return images
    import torch
    import torch.nn.functional as F

    out = F.interpolate(images.float(), size=(height, width), mode="bilinear", antialias=True, align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def decode_image_bytes(data: bytes, height: int, width: int) -> np.ndarray:
    """One PNG/JPEG image as stored in a v3 parquet ``image`` column -> uint8 [3, height, width]."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB")
        if im.size != (width, height):
            im = im.resize((width, height), Image.Resampling.BILINEAR)
        return np.ascontiguousarray(np.asarray(im).transpose(2, 0, 1))
