"""Video decoding in a child process (RELIABILITY C5): the child's frames equal in-process decoding, and a decoder
that segfaults, hangs, allocates past the cap or exits is a DecodeError naming the file, the time and the episode
of the first frame it did not deliver; the loader turns that into a DatasetError and the next file decodes.

The faults come from ``tests/_faulty_decoder.py``: the real child with its decoder made to fault (a real FFmpeg
crash cannot be made on demand)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest

from robot_rl.data import decode_process
from robot_rl.data.decode_process import DecoderProcess
from robot_rl.data.lerobot_loader import DatasetError
from robot_rl.data.video_decode import DecodeError, FileTargets, matched_frames
from tests.test_lerobot_loader import make_dataset, sampler, tree_hash

N, SIZE, FPS = 40, 32, 30
FAULTY = Path(__file__).with_name("_faulty_decoder.py")


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> tuple[Path, Path]:
    """The same 40-frame video twice: good.mp4 and bad.mp4 (the fake child faults on the latter)."""
    folder = tmp_path_factory.mktemp("videos")
    good = folder / "good.mp4"
    rng = np.random.default_rng(0)
    with av.open(str(good), "w") as c:
        stream = c.add_stream("h264", rate=FPS)
        stream.width = stream.height = SIZE
        stream.pix_fmt = "yuv420p"
        for _ in range(N):
            img = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8).repeat(SIZE // 4, 0).repeat(SIZE // 4, 1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(packet)
        for packet in stream.encode():
            c.mux(packet)
    bad = folder / "bad.mp4"
    shutil.copy(good, bad)
    return good, bad


def targets(path: Path) -> FileTargets:
    """Every frame, written to rows in reverse order, frames 0-9 of episode 0 and the rest of episode 1."""
    return FileTargets(path, np.arange(N) / FPS, np.arange(N)[::-1].copy(), (np.arange(N) >= 10).astype(np.int64))


def in_process(t: FileTargets, size: int = SIZE) -> np.ndarray:
    """The frames of ``t`` decoded in this process, at their rows: the ground truth."""
    truth = np.zeros((N, 3, size, size), np.uint8)
    for p, q, frame in matched_frames("pyav", t, size, size, 0.25 / FPS):
        truth[t.rows[p:q]] = frame
    return truth


def faulty(fault: str, after: int = 15, match: str = "bad.mp4", **kw) -> DecoderProcess:
    """The fake child: faults after ``after`` frames of each file whose path contains ``match``."""
    return DecoderProcess([sys.executable, str(FAULTY), fault, str(after), match], **kw)


def test_the_child_delivers_the_frames_of_in_process_decoding(videos):
    good, _ = videos
    t = targets(good)
    truth = in_process(t, 16)
    decoder = DecoderProcess()
    cache, counted = np.zeros_like(truth), []
    decoder.decode("pyav", t, cache, 0.25 / FPS, on_progress=counted.append)
    decoder.close()
    assert truth.std() > 10 and np.array_equal(cache, truth)
    assert sum(counted) == N


@pytest.mark.parametrize(("fault", "how"), [("segv", "was killed by SIGSEGV"), ("exit", "exited with status 3"),
                                            ("alloc", r"MemoryError: decoding needed more than the 2 GiB cap")])
def test_a_decoder_fault_is_a_decode_error_and_the_next_file_decodes(videos, fault, how):
    good, bad = videos
    decoder = faulty(fault)
    cache = np.zeros((N, 3, SIZE, SIZE), np.uint8)
    decoder.decode("pyav", targets(good), cache, 0.25 / FPS)  # the fault is only on bad.mp4
    first = decoder.proc.pid
    cache[:] = 0
    # the 16th frame (0.5 s, episode 1) was never delivered; the 15 before it were
    with pytest.raises(DecodeError, match=rf"video file .*bad.mp4 cannot be decoded at 0.500 s \(episode 1\): .*{how}"):
        decoder.decode("pyav", targets(bad), cache, 0.25 / FPS)
    rows = targets(bad).rows
    assert cache[rows[:15]].any(axis=(1, 2, 3)).all() and not cache[rows[15:]].any()
    decoder.decode("pyav", targets(good), cache, 0.25 / FPS)
    assert cache.any(axis=(1, 2, 3)).all()
    if fault != "alloc":  # a MemoryError is caught inside the child, which serves on
        assert decoder.proc.pid != first
    decoder.close()


def test_a_decoder_printing_to_stdout_does_not_garble_the_frames(videos):
    _, bad = videos
    decoder, t = faulty("chatter", after=3), targets(bad)
    truth, cache = in_process(t), np.zeros((N, 3, SIZE, SIZE), np.uint8)
    decoder.decode("pyav", t, cache, 0.25 / FPS)
    decoder.close()
    assert np.array_equal(cache, truth)


def test_a_decode_interrupted_midway_leaves_the_next_one_exact(videos):
    good, _ = videos
    t, decoder = targets(good), DecoderProcess()
    truth, cache = in_process(t), np.zeros((N, 3, SIZE, SIZE), np.uint8)
    seen = []

    def interrupt(n: int) -> None:  # Ctrl-C during the 5th frame
        seen.append(n)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        decoder.decode("pyav", t, cache, 0.25 / FPS, on_progress=interrupt)
    cache[:] = 0
    decoder.decode("pyav", t, cache, 0.25 / FPS)  # not the rest of the interrupted answer
    decoder.close()
    assert np.array_equal(cache, truth)


def test_a_hung_decoder_is_killed_after_the_stall_limit(videos):
    _, bad = videos
    decoder = faulty("hang", stall_s=1.0)
    cache = np.zeros((N, 3, SIZE, SIZE), np.uint8)
    start = time.monotonic()
    with pytest.raises(DecodeError, match=r"at 0.500 s \(episode 1\): the decoder process sent nothing for 1 s"):
        decoder.decode("pyav", targets(bad), cache, 0.25 / FPS)
    assert time.monotonic() - start < 4.0
    assert decoder.proc is None  # killed and reaped
    decoder.close()


def test_a_forked_process_starts_its_own_child(videos):
    good, _ = videos
    decoder = DecoderProcess()
    cache = np.zeros((N, 3, SIZE, SIZE), np.uint8)
    decoder.decode("pyav", targets(good), cache, 0.25 / FPS)
    parent_child = decoder.proc.pid
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked copy decodes through a child of its own, then reports its pid
        try:
            decoder.decode("pyav", targets(good), np.zeros_like(cache), 0.25 / FPS)
            os.write(write, str(decoder.proc.pid).encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os.close(write)
    theirs = int(os.read(read, 64) or b"0")
    assert theirs not in (0, parent_child)
    decoder.decode("pyav", targets(good), cache, 0.25 / FPS)  # ours is untouched and still serves
    assert decoder.proc.pid == parent_child
    decoder.close()


def test_a_crashing_decoder_fails_the_load_with_a_dataset_error(tmp_path, monkeypatch):
    root = make_dataset(tmp_path / "ds")
    before = tree_hash(root)
    monkeypatch.setattr(decode_process, "_shared", faulty("segv", after=5, match="images.wrist"))
    with pytest.raises(DatasetError, match=r"camera 'observation.images.wrist', episodes 0, 1, 2: video file "
                                           r".*file-000.mp4 cannot be decoded at 0.167 s \(episode 0\): .*SIGSEGV"):
        sampler(root)
    assert tree_hash(root) == before
    assert len(sampler(root, cameras=["front"]).indices["frame_index"]) == 47  # the other camera decodes
