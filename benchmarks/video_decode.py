"""What decoding videos in a child process costs (``robot_rl/data/decode_process.py``, RELIABILITY C5).

The loader decodes each video file in a child process, so that a decoder crash, hang or runaway allocation on a
damaged file is a typed error instead of the end of the run. The price is copying every frame through a pipe.
This times, side by side in one run (alternating, ``--reps`` rounds, the median kept), the same file decoded
(PyAV, front to back, every frame converted to RGB at the training size) in this process and through the child:

- a simulated camera: 64x64 source, decoded at 64x64 (what ``robot-rl collect`` records and the VLA trains on);
- a real SO-101 camera: 640x480 source (LeRobot's default for its cameras), decoded at 64x64 and at 224x224.

Videos are AV1 (SVT-AV1, as LeRobot encodes) when the encoder is there, else H.264; their content is 4x4 blocks of
random colours. The child's start (~0.2-0.6 s, once per training process) is timed apart.

    python benchmarks/video_decode.py                  # ~2 min on 2 cores
    python benchmarks/video_decode.py --reps 5

Writes ``benchmarks/results/video_decode.json`` + ``video_decode.png``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.common import save_figure, write_result
from robot_rl.data.decode_process import DecoderProcess
from robot_rl.data.video_decode import FileTargets, matched_frames

NAME = "video_decode"
FPS = 30
CASES = [  # (name, source width, source height, frames, decoded size)
    ("sim camera 64x64 -> 64x64", 64, 64, 6000, 64),
    ("real camera 640x480 -> 64x64", 640, 480, 900, 64),
    ("real camera 640x480 -> 224x224", 640, 480, 900, 224),
]


def make_video(path: Path, width: int, height: int, frames: int) -> str:
    """Encode ``frames`` frames of 4x4 random colour blocks; returns the codec used."""
    import av

    codec = "libsvtav1" if "libsvtav1" in av.codecs_available else "h264"
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for _ in range(frames):
            grid = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
            img = np.ascontiguousarray(grid.repeat(height // 4, 0).repeat(width // 4, 1))
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return codec


def in_process(targets: FileTargets, cache: np.ndarray) -> float:
    start = time.perf_counter()
    for p, q, frame in matched_frames("pyav", targets, cache.shape[2], cache.shape[3], 0.25 / FPS):
        cache[targets.rows[p:q]] = frame
    return time.perf_counter() - start


def through_child(decoder: DecoderProcess, targets: FileTargets, cache: np.ndarray) -> float:
    start = time.perf_counter()
    decoder.decode("pyav", targets, cache, 0.25 / FPS)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="alternating rounds per case (the median is kept)")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="video_decode_"))
    decoder = DecoderProcess()
    rows, codecs = [], set()
    start = time.perf_counter()
    warm = np.empty((1, 3, 8, 8), np.uint8)
    tiny = work / "tiny.mp4"
    make_video(tiny, 64, 64, 30)
    decoder.decode("pyav", FileTargets(tiny, np.zeros(1), np.zeros(1, np.int64), np.zeros(1, np.int64)), warm, 0.1)
    child_start_s = time.perf_counter() - start
    for name, width, height, frames, size in CASES:
        path = work / f"{width}x{height}_{frames}.mp4"
        if not path.exists():
            codecs.add(make_video(path, width, height, frames))
        targets = FileTargets(path, np.arange(frames) / FPS, np.arange(frames), np.zeros(frames, np.int64))
        a, b = np.empty((frames, 3, size, size), np.uint8), np.empty((frames, 3, size, size), np.uint8)
        ours, child = [], []
        for _ in range(args.reps):
            ours.append(in_process(targets, a))
            child.append(through_child(decoder, targets, b))
        if not np.array_equal(a, b):
            raise SystemExit(f"{name}: the child's frames differ from in-process decoding")
        row = {"case": name, "frames": frames, "in_process_s": [round(t, 4) for t in ours],
               "child_s": [round(t, 4) for t in child], "in_process_median_s": round(statistics.median(ours), 4),
               "child_median_s": round(statistics.median(child), 4),
               "ratio_child_over_in_process": round(statistics.median(child) / statistics.median(ours), 3),
               "frames_identical": True}
        rows.append(row)
        print(f"{name}: in-process {row['in_process_median_s']:.3f} s, child {row['child_median_s']:.3f} s "
              f"({row['ratio_child_over_in_process']:.2f}x) for {frames} frames", flush=True)
    decoder.close()
    shutil.rmtree(work, ignore_errors=True)
    data = {"settings": {"reps": args.reps, "backend": "pyav", "codecs": sorted(codecs), "fps": FPS},
            "child_start_s": round(child_start_s, 3), "cases": rows,
            "note": "Medians of alternating runs in one process, nothing else running. The child's frames are "
                    "compared with in-process decoding (byte-equal)."}
    path = write_result(NAME, data, [], args.out)
    plot(rows, path.with_suffix(".png"))
    print(f"wrote {path}")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    y = np.arange(len(rows))
    per_k = [[1000 * r[k] / r["frames"] for r in rows] for k in ("in_process_median_s", "child_median_s")]
    ax.barh(y + 0.2, per_k[0], 0.4, label="in this process")
    ax.barh(y - 0.2, per_k[1], 0.4, label="in a child process (the loader)")
    for i, r in enumerate(rows):
        ax.text(per_k[1][i], y[i] - 0.2, f" {r['ratio_child_over_in_process']:.2f}x", va="center", fontsize=8)
    ax.set_yticks(y, [r["case"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per 1,000 frames (PyAV, median)")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("Video decoding isolated in a child process: its cost", fontsize=9)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
