"""The LeRobotDataset v3 loader: datasets written by LeRobot's own API (SO-101 feature names, video cameras) become
exact action chunks, pad masks, history, images, statistics; sampling resumes exactly; bad input is refused with
one clear error and never written to."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # the `lerobot` extra, installed by make test
from torch import nn

from policies import keys
from robot_rl.checkpoint import load_checkpoint, write_checkpoint
from robot_rl.data.augment import gather_frames, random_shifts
from robot_rl.data.lerobot_loader import ChunkDatasetConfig, ChunkSampler, DatasetError, read_meta
from robot_rl.data.video_decode import DecodeError, resolve_backend

JOINTS = ["shoulder_pan.pos", "shoulder_lift.pos", "elbow_flex.pos", "wrist_flex.pos", "wrist_roll.pos",
          "gripper.pos"]
LENGTHS = [12, 20, 15]  # episode 0 is shorter than the default horizon 16
SIZE = 32


def state_value(e: int, i: int) -> np.ndarray:
    return (100.0 * e + i + 0.01 * np.arange(6)).astype(np.float32)


def action_value(e: int, i: int) -> np.ndarray:
    return state_value(e, i) + np.float32(0.5)


def image_value(e: int, i: int, flip: bool = False, size: int = SIZE) -> np.ndarray:
    """A 4x4 grid of random colours in size/4 blocks (codec friendly, and unlike every other frame), uint8 [h, w, 3]."""
    grid = np.random.default_rng(1000 * e + i).integers(0, 256, (4, 4, 3), dtype=np.uint8)
    img = grid.repeat(size // 4, 0).repeat(size // 4, 1)
    return img[::-1].copy() if flip else img


def make_dataset(root: Path, lengths=LENGTHS, use_videos: bool = True, nan_at: tuple[int, int] | None = None,
                 file_mb: float | None = None, tasks: tuple[str, ...] = ("pick the cube 0", "pick the cube 1"),
                 without: tuple[str, ...] = (), size: int = SIZE, fps: int = 30) -> Path:
    """A small SO-101-style dataset written with LeRobot's own API: state/action as ``state_value``/``action_value``,
    cameras front and wrist (32x32), next.success on each episode's last frame, intervention on odd frames, episode
    e's task ``tasks[e % len(tasks)]``. ``file_mb``: LeRobot's data/video file-size cap (tiny: a new file per
    episode). ``without``: columns left out (e.g. ``intervention``, as a lerobot-eval recording lacks it); ``size``:
    the cameras' side (pixels); ``fps``: the recording rate."""
    kind = "video" if use_videos else "image"
    img = {"dtype": kind, "shape": (size, size, 3), "names": ["height", "width", "channels"]}
    features = {keys.OBS_STATE: {"dtype": "float32", "shape": (6,), "names": JOINTS},
                keys.ACTION_COL: {"dtype": "float32", "shape": (6,), "names": JOINTS},
                keys.lerobot_image_key("front"): img, keys.lerobot_image_key("wrist"): img,
                keys.SUCCESS_COL: {"dtype": "bool", "shape": (1,), "names": None},
                keys.INTERVENTION_COL: {"dtype": "bool", "shape": (1,), "names": None},
                keys.REWARD_COL: {"dtype": "float32", "shape": (1,), "names": None}}
    features = {k: v for k, v in features.items() if k not in without}
    ds = LeRobotDataset.create("local/" + root.name, fps=fps, features=features, root=root,
                               robot_type="so101_follower", use_videos=use_videos, video_files_size_in_mb=file_mb,
                               data_files_size_in_mb=file_mb)
    for e, length in enumerate(lengths):
        for i in range(length):
            state = state_value(e, i)
            if nan_at == (e, i):
                state[2] = np.nan
            frame = {keys.OBS_STATE: state, keys.ACTION_COL: action_value(e, i),
                     keys.lerobot_image_key("front"): image_value(e, i, size=size),
                     keys.lerobot_image_key("wrist"): image_value(e, i, flip=True, size=size),
                     keys.SUCCESS_COL: np.array([i == length - 1]),
                     keys.INTERVENTION_COL: np.array([i % 2 == 1]),
                     keys.REWARD_COL: np.array([float(i == length - 1)], dtype=np.float32),
                     "task": tasks[e % len(tasks)]}
            ds.add_frame({k: v for k, v in frame.items() if k not in without})
        ds.save_episode()
    ds.finalize()
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("lerobot") / "so101_demo")


@pytest.fixture
def copy(dataset, tmp_path) -> Path:
    """A private copy of the dataset, for tests that damage it."""
    return Path(shutil.copytree(dataset, tmp_path / "so101_copy"))


def tree_hash(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def sampler(root: Path, **kw) -> ChunkSampler:
    kw = {"batch_size": 8, "progress": False, **kw}
    return ChunkSampler(ChunkDatasetConfig(root=str(root), **kw))


def all_frames(s: ChunkSampler) -> dict:
    return s.batch(torch.arange(s.num_frames))


# ---------------------------------------------------------------------------------------------- contents
def test_chunks_pad_masks_and_columns_are_exact(dataset):
    before = tree_hash(dataset)
    s = sampler(dataset, horizon=16, augment=False,
                extra_columns=[keys.SUCCESS_COL, keys.INTERVENTION_COL, keys.REWARD_COL])
    assert (s.num_frames, s.num_episodes, s.repo_id) == (sum(LENGTHS), 3, "so101_demo")
    assert s.tasks == ["pick the cube 0", "pick the cube 1"] and s.names[keys.OBS_STATE] == JOINTS
    b = all_frames(s)
    assert b[keys.ACTION_COL].shape == (47, 16, 6) and b[keys.ACTION_COL].dtype == torch.float32
    assert b[keys.ACTION_IS_PAD].dtype == torch.bool and b[keys.OBS_STATE].shape == (47, 6)
    r = 0
    for e, length in enumerate(LENGTHS):
        for i in range(length):
            assert np.array_equal(b[keys.OBS_STATE][r].numpy(), state_value(e, i))
            want = np.stack([action_value(e, min(i + h, length - 1)) for h in range(16)])
            assert np.array_equal(b[keys.ACTION_COL][r].numpy(), want)
            assert b[keys.ACTION_IS_PAD][r].tolist() == [i + h > length - 1 for h in range(16)]
            assert (int(b["episode_index"][r]), int(b["frame_index"][r]), int(b["index"][r])) == (e, i, r)
            assert b[keys.TASK][r] == f"pick the cube {e % 2}"
            assert b[keys.SUCCESS_COL][r].item() == (i == length - 1) and b[keys.SUCCESS_COL].dtype == torch.bool
            assert b[keys.INTERVENTION_COL][r].item() == (i % 2 == 1)
            assert b[keys.REWARD_COL][r].item() == float(i == length - 1)
            r += 1
    assert s.features[keys.ACTION_COL] == ((16, 6), torch.float32)
    assert s.features[keys.lerobot_image_key("front")] == ((3, SIZE, SIZE), torch.float32)
    assert s.features[keys.SUCCESS_COL] == ((), torch.bool)
    # One epoch of sample() visits distinct frames; the next epoch starts when fewer than B are left.
    seen = torch.cat([s.sample()["index"] for _ in range(47 // 8)])
    assert len(set(seen.tolist())) == 40 and s.epoch == 0
    s.sample()
    assert s.epoch == 1
    assert tree_hash(dataset) == before


def test_history_repeats_the_first_frame_at_episode_starts(dataset):
    s = sampler(dataset, history=3, horizon=4, augment=False)
    b = all_frames(s)
    assert b[keys.OBS_STATE].shape == (47, 3, 6)
    front = b[keys.lerobot_image_key("front")]
    assert front.shape == (47, 3, 3, SIZE, SIZE)
    for k in (2, 3):  # the K axis from two frames on, in the shapes a policy is built from too
        feats = sampler(dataset, history=k, augment=False).features
        assert feats[keys.OBS_STATE] == ((k, 6), torch.float32)
        assert feats[keys.lerobot_image_key("front")] == ((k, 3, SIZE, SIZE), torch.float32)
    start = LENGTHS[0]  # episode 1 starts at row 12
    for r, frames in ((start, [0, 0, 0]), (start + 1, [0, 0, 1]), (start + 5, [3, 4, 5])):
        want = np.stack([state_value(1, i) for i in frames])
        assert np.array_equal(b[keys.OBS_STATE][r].numpy(), want)
        for k, i in enumerate(frames):  # each history image is that frame's own image
            assert torch.equal(front[r, k], front[start + i, 2])
    # With augmentation a sample's history frames share one shift: at an episode start, three equal images.
    img = sampler(dataset, history=3, augment=True).batch(torch.tensor([start]))[keys.lerobot_image_key("front")]
    assert torch.equal(img[0, 0], img[0, 1]) and torch.equal(img[0, 0], img[0, 2])
    assert not torch.equal(img[0, 0], front[start, 2])  # (shifted: the seed's first shift is not (0, 0))


def test_state_lags_are_the_joints_frames_back_clamped_at_episode_starts(dataset):
    s = sampler(dataset, augment=False)
    start = LENGTHS[0]  # episode 1 starts at row 12
    rows = torch.tensor([0, start, start + 1, start + 2, start + 7, start + LENGTHS[1] - 1])
    lags = s.state_lags(rows, [1, 2, 5])
    assert lags.shape == (6, 3, 6) and lags.dtype == torch.float32
    want = [(0, [0, 0, 0]), (1, [0, 0, 0]), (1, [0, 0, 0]), (1, [1, 0, 0]), (1, [6, 5, 2]), (1, [18, 17, 14])]
    for r, (e, frames) in enumerate(want):
        assert np.array_equal(lags[r].numpy(), np.stack([state_value(e, i) for i in frames])), r
    for bad in ([], [0], [2, -1]):
        with pytest.raises(ValueError, match="frames back, each >= 1"):
            s.state_lags(rows, bad)


def test_live_state_lags_match_a_datasets(dataset):
    """StateLags fed an env's readings step by step (reset at each episode's start) gives each frame the lagged
    joints the sampler gives the same frame of the dataset: a value model sees the same input live as in training."""
    from robot_rl.models.state_lags import StateLags

    s = sampler(dataset, augment=False)
    lags = [1, 3, 13]
    state = s.columns()[keys.OBS_STATE]
    ep = s.columns()["episode_index"]
    # two envs replay episodes 1 and 2 side by side; env 0 then goes on to episode 0 (12 frames) after its end
    live = StateLags(lags, 2)
    order = [list(range(12, 32)) + list(range(12)), list(range(32, 47)) + [46] * 17]
    live.reset()
    for t in range(32):
        rows = torch.tensor([order[0][t], order[1][t]])
        if t == 20:
            live.reset(torch.tensor([0]))  # env 0's episode 0 starts
        got = live(state[rows])
        if t < 15:  # env 1 still in episode 2
            torch.testing.assert_close(got, s.state_lags(rows, lags), rtol=0, atol=0)
        else:
            torch.testing.assert_close(got[:1], s.state_lags(rows[:1], lags), rtol=0, atol=0)
        assert int(ep[rows[0]]) == (1 if t < 20 else 0)
    with pytest.raises(ValueError, match="frames back"):
        StateLags([0, 2], 2)


def test_images_decode_to_the_written_frames(dataset):
    s = sampler(dataset, augment=False)
    assert s.video_backend == "pyav"  # torchcodec cannot load without the system FFmpeg here; PyAV is preferred
    b = all_frames(s)
    for cam, flip in (("front", False), ("wrist", True)):
        got = b[keys.lerobot_image_key(cam)]
        assert got.shape == (47, 3, SIZE, SIZE) and 0.0 <= got.min() and got.max() <= 1.0
        written = torch.stack([torch.from_numpy(image_value(e, i, flip)).permute(2, 0, 1).float() / 255
                               for e, n in enumerate(LENGTHS) for i in range(n)])
        err = (got[:, None] - written[None]).abs().mean(dim=(2, 3, 4))  # [decoded, written]
        # Each decoded frame is close to its own written frame (AV1 at crf 30, yuv420: ~0.02 mean error) and
        # far from every other one (>= 0.15): no frame is shifted to a neighbour's slot.
        assert err.diagonal().max() < 0.05 and (err + 9 * torch.eye(47)).min() > 0.15
    # The same pixels as LeRobot's own reader (PyAV) gives.
    ours = all_frames(sampler(dataset, augment=False, cameras=["front"]))[keys.lerobot_image_key("front")]
    reader = LeRobotDataset("local/so101_demo", root=dataset, video_backend="pyav")
    theirs = torch.stack([reader[i][keys.lerobot_image_key("front")] for i in range(len(reader))])
    assert torch.equal((ours * 255).round(), (theirs * 255).round())
    small = sampler(dataset, augment=False, image_size=[16, 8], cameras=["front"])
    assert list(small.images) == [keys.lerobot_image_key("front")]
    got = all_frames(small)[keys.lerobot_image_key("front")]
    area = torch.nn.functional.avg_pool2d(b[keys.lerobot_image_key("front")], (2, 4))
    assert got.shape == (47, 3, 16, 8) and (got - area).abs().mean() < 4 / 255


def test_episodes_spread_over_several_files(tmp_path, dataset):
    root = make_dataset(tmp_path / "split", file_mb=1e-6)
    assert len(list((root / "data").rglob("*.parquet"))) == 3 == len(list((root / "videos").rglob("*.mp4"))) // 2
    one, split = all_frames(sampler(dataset, augment=False)), all_frames(sampler(root, augment=False))
    for k, v in one.items():
        assert split[k] == v if k == keys.TASK else torch.equal(split[k], v), k


def test_loads_what_our_recorder_writes(tmp_path):
    """Our EpisodeRecorder (a file per episode, images declared [3, h, w], H.264 4:4:4) reads back exactly."""
    from robot_rl.data.recorder import DatasetSpec, EpisodeRecorder, RecorderConfig

    spec = DatasetSpec(30, tuple(JOINTS), {"front": (SIZE, SIZE)})
    rec = EpisodeRecorder(RecorderConfig(root=str(tmp_path / "rec")), spec, num_envs=2)
    images = torch.stack([torch.from_numpy(image_value(n, t)).permute(2, 0, 1) for t in range(12) for n in range(2)])
    images = images.view(12, 2, 3, SIZE, SIZE)
    for t in range(12):  # env 0: episodes of 6 and 6 steps; env 1: one of 12
        state = torch.stack([torch.from_numpy(state_value(n, t)) for n in range(2)])
        done = torch.tensor([t in (5, 11), t == 11])
        rec.add({keys.OBS_STATE: state, keys.lerobot_image_key("front"): images[t], keys.TASK: ["a", "b"]},
                state + 0.5, reward=torch.zeros(2), success=done, done=done)
    rec.close()
    s = sampler(tmp_path / "rec", augment=False, horizon=8, extra_columns=[keys.SUCCESS_COL])
    b = all_frames(s)
    env_t = [(0, t) for t in range(6)] + [(0, t) for t in range(6, 12)] + [(1, t) for t in range(12)]
    want = torch.stack([torch.from_numpy(state_value(n, t)) for n, t in env_t])
    assert s.num_episodes == 3 and torch.equal(b[keys.OBS_STATE], want)
    assert torch.equal(b[keys.ACTION_COL][:, 0], want + 0.5) and b[keys.SUCCESS_COL].sum() == 3
    written = torch.stack([images[t, n] for n, t in env_t]).float() / 255
    err = (b[keys.lerobot_image_key("front")][:, None] - written[None]).abs().mean(dim=(2, 3, 4))
    assert err.diagonal().max() < 2 / 255 and (err + 9 * torch.eye(24)).min() > 0.15  # its own frame, no other


def test_image_features_stored_as_png_decode_exactly(tmp_path):
    root = make_dataset(tmp_path / "png", lengths=[5, 4], use_videos=False)
    s = sampler(root, augment=False, batch_size=4)
    assert s.video_backend is None
    got = (all_frames(s)[keys.lerobot_image_key("wrist")] * 255).round().to(torch.uint8)
    want = torch.stack([torch.from_numpy(image_value(e, i, True)).permute(2, 0, 1) for e, n in enumerate([5, 4])
                        for i in range(n)])
    assert torch.equal(got, want)


def test_random_shift_replicates_the_border():
    cache = torch.arange(2 * 1 * 3 * 4, dtype=torch.uint8).reshape(2, 1, 3, 4)  # N=2 frames, C=1, 3x4
    rows = torch.tensor([[0, 1], [1, 1]])  # B=2 samples, K=2 history

    def pixels(x):
        return (x * 255).round().to(torch.uint8)

    out = gather_frames(cache, rows, torch.tensor([[1, -2], [0, 0]]), pad=2)
    assert out.shape == (2, 2, 1, 3, 4) and out.dtype == torch.float32
    # Sample 0 shifted by (1, -2): pixel (i, j) reads (min(i+1, 2), max(j-2, 0)), the same for both its frames.
    assert pixels(out[0, 0, 0]).tolist() == [[4, 4, 4, 5], [8, 8, 8, 9], [8, 8, 8, 9]]
    assert torch.equal(pixels(out[0, 1, 0]), pixels(out[0, 0, 0]) + 12)
    assert torch.equal(pixels(out[1]), cache[[1, 1]])  # no shift
    assert torch.equal(pixels(gather_frames(cache, rows)), cache[rows])
    with pytest.raises(ValueError, match="shifts"):
        gather_frames(cache, rows, torch.tensor([[3, 0], [0, 0]]), pad=2)
    # the smallest pad shifts too: (-1, 1) reads (max(i-1, 0), min(j+1, 3))
    one = gather_frames(cache, rows[:1, :1], torch.tensor([[-1, 1]]), pad=1)
    assert pixels(one[0, 0, 0]).tolist() == [[1, 2, 3, 3], [1, 2, 3, 3], [5, 6, 7, 7]]


def test_random_shifts_cover_every_offset_up_to_pad():
    g = torch.Generator().manual_seed(0)
    shifts = random_shifts(2000, 3, g)
    assert shifts.shape == (2000, 2) and shifts.dtype == torch.int64
    for axis in (0, 1):  # both axes, each offset in [-3, 3] drawn (~286 times each), nothing beyond
        assert shifts[:, axis].unique().tolist() == [-3, -2, -1, 0, 1, 2, 3]


def test_augmentation_is_a_shift_of_at_most_pad_pixels(dataset):
    plain = all_frames(sampler(dataset, augment=False))[keys.lerobot_image_key("front")]
    s = sampler(dataset, augment=True, augment_pad=4)
    b = s.sample()
    img, rows = b[keys.lerobot_image_key("front")], b["index"]
    found = []
    for k in range(len(rows)):
        src = (plain[rows[k]] * 255).round().to(torch.uint8)[None]  # [1, 3, h, w]
        shifts = [(dy, dx) for dy in range(-4, 5) for dx in range(-4, 5)
                  if torch.equal(gather_frames(src, torch.zeros(1, 1, dtype=torch.long), torch.tensor([[dy, dx]]),
                                               pad=4)[0, 0], img[k])]
        assert shifts, f"sample {k} is not a shift of its frame"
        found.append(shifts[0])
    assert len(set(found)) > 1  # samples get their own shifts


# ---------------------------------------------------------------------------------------------- sampling
def test_resume_draws_exactly_the_batches_of_an_uninterrupted_run(dataset, tmp_path):
    def run(s, n):
        return [s.sample() for _ in range(n)]

    straight = run(sampler(dataset, seed=3), 9)  # 5 batches per epoch: crosses an epoch boundary
    first = sampler(dataset, seed=3)
    run(first, 4)
    write_checkpoint(tmp_path / "ckpt", {"sampler": first.state_dict()}, {})
    resumed = sampler(dataset, seed=99)  # the seed is overwritten by the saved generator
    resumed.load_state_dict(load_checkpoint(tmp_path / "ckpt").state["sampler"])
    for a, b in zip(straight[4:], run(resumed, 5), strict=True):
        assert a[keys.TASK] == b[keys.TASK]
        for k, v in a.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, b[k]), k  # augmented images included
    assert resumed.epoch == 1


def test_weighted_sampling_and_resume_refuses_other_weights(dataset):
    s = sampler(dataset, batch_size=16)
    w = torch.zeros(s.num_frames)
    w[12:32] = 1.0  # episode 1 only
    s.set_weights(w)
    assert all(set(s.sample()["episode_index"].tolist()) == {1} for _ in range(4))
    assert s.epoch == 1 and s.state_dict()["drawn"] == 64  # 64 draws over 47 frames
    by_success = sampler(dataset, batch_size=16, extra_columns=[keys.SUCCESS_COL])
    by_success.set_weights(lambda cols: cols[keys.SUCCESS_COL].double())
    b = by_success.sample()
    assert b[keys.SUCCESS_COL].all() and set(b["frame_index"].tolist()) <= {11, 19, 14}
    sd = s.state_dict()
    other = sampler(dataset, batch_size=16)
    with pytest.raises(ValueError, match="other sampling weights"):
        other.load_state_dict(sd)
    other.set_weights(w)
    other.load_state_dict(sd)
    assert torch.equal(other.sample()["index"], s.sample()["index"])
    for bad in (torch.full((s.num_frames,), -1.0), torch.zeros(s.num_frames), torch.ones(s.num_frames - 1),
                torch.full((s.num_frames,), math.nan)):  # negative, all zero, short, NaN
        with pytest.raises(ValueError, match="finite, >= 0 and not all zero"):
            s.set_weights(bad)
    tiny = torch.zeros(s.num_frames)
    tiny[5] = 1e-30  # any positive total
    s.set_weights(tiny)
    assert set(s.sample()["index"].tolist()) == {5}


def test_fingerprint_names_the_data(dataset, copy):
    a, b = sampler(dataset), sampler(copy)
    assert a.fingerprint() == b.fingerprint()
    assert sampler(dataset, horizon=8).fingerprint() != a.fingerprint()
    video = next((copy / "videos" / keys.lerobot_image_key("wrist")).rglob("*.mp4"))
    video.write_bytes(video.read_bytes() + b"\0")  # a changed file, same frames
    assert sampler(copy).fingerprint() != a.fingerprint()


def test_episode_selection(dataset):
    s = sampler(dataset, episodes=[2, 0], augment=False)
    b = all_frames(s)
    assert s.num_episodes == 2 and s.num_frames == 27 and b["episode_index"].unique().tolist() == [0, 2]
    assert s.stats_source[keys.OBS_STATE] == "computed"  # meta/stats.json covers every episode
    with pytest.raises(DatasetError, match="no episode 7"):
        sampler(dataset, episodes=[7])



def test_an_epoch_that_batches_fit_exactly_draws_every_frame_once(dataset):
    s = sampler(dataset, episodes=[1, 2], batch_size=7, augment=False)  # 35 frames: 5 batches of 7
    every = sorted(all_frames(s)["index"].tolist())
    for epoch in (0, 1):  # each epoch a new order, every frame once
        drawn = [s.sample()["index"] for _ in range(5)]
        assert sorted(torch.cat(drawn).tolist()) == every and s.epoch == epoch


def test_config_and_size_limits_at_their_bounds(dataset):
    for bad in ({"horizon": 0}, {"history": 0}, {"batch_size": 0}, {"augment_pad": -1}):
        with pytest.raises(ValueError, match="horizon, history and batch_size must be >= 1, augment_pad >= 0"):
            ChunkDatasetConfig(root=str(dataset), **bad)
    with pytest.raises(ValueError, match="max_cache_gib must be > 0"):
        ChunkDatasetConfig(root=str(dataset), max_cache_gib=0.0)
    for bad in ([32], [0, 32], [32, 32, 3]):
        with pytest.raises(ValueError, match=r"image_size must be \[h, w\] with positive sizes"):
            ChunkDatasetConfig(root=str(dataset), image_size=bad)
    ChunkDatasetConfig(root=str(dataset), image_size=[1, 1])
    ChunkDatasetConfig(root=str(dataset), horizon=1, history=1, batch_size=1, augment_pad=0)
    frames = sum(LENGTHS)
    assert sampler(dataset, batch_size=frames).num_frames == frames  # one batch of every frame
    with pytest.raises(DatasetError, match=f"has {frames} frames, fewer than batch_size {frames + 1}"):
        sampler(dataset, batch_size=frames + 1)
    need = 2 * frames * 3 * SIZE * SIZE / 2**30  # two cameras' uint8 frames, exactly
    assert sampler(dataset, max_cache_gib=need).num_frames == frames
    with pytest.raises(DatasetError, match="over max_cache_gib"):
        sampler(dataset, max_cache_gib=need * (1 - 1e-9))


# ---------------------------------------------------------------------------------------------- statistics
def test_stats_equal_numpy_on_the_data(dataset, copy):
    states = np.stack([state_value(e, i) for e, n in enumerate(LENGTHS) for i in range(n)]).astype(np.float64)
    actions = states + 0.5

    def check(s):
        for name, x in ((keys.OBS_STATE, states), (keys.ACTION_COL, actions)):
            st = s.stats[name]
            for stat, want in (("mean", x.mean(0)), ("std", x.std(0)), ("min", x.min(0)), ("max", x.max(0))):
                assert st[stat].dtype == torch.float32 and st[stat].shape == (6,)
                np.testing.assert_allclose(st[stat].numpy(), want, rtol=1e-5, atol=1e-4)

    s = sampler(dataset)
    assert s.stats_source == {keys.OBS_STATE: "meta/stats.json", keys.ACTION_COL: "meta/stats.json"}
    check(s)
    (copy / "meta" / "stats.json").unlink()
    s = sampler(copy)
    assert s.stats_source[keys.ACTION_COL] == "computed"
    check(s)
    stale = json.loads((dataset / "meta" / "stats.json").read_text())
    stale[keys.OBS_STATE]["mean"] = [0.0] * 6
    (copy / "meta" / "stats.json").write_text(json.dumps(stale))
    s = sampler(copy)
    assert s.stats_source == {keys.OBS_STATE: "computed", keys.ACTION_COL: "meta/stats.json"}
    check(s)


# ---------------------------------------------------------------------------------------------- bad input
def test_require_names_missing_features_and_shape_mismatches(dataset):
    before = tree_hash(dataset)
    meta = read_meta(dataset)
    meta.require(state=6, action=6, cameras=["front", keys.lerobot_image_key("wrist")], columns=[keys.SUCCESS_COL])
    with pytest.raises(DatasetError) as err:
        meta.require(state=7, action=6, cameras=["front", "top"], columns=["advantage"])
    msg = str(err.value)
    assert "'observation.state' has shape [6], the policy needs [7]" in msg
    assert "no camera 'observation.images.top'" in msg and "no column 'advantage'" in msg
    assert "action" not in msg.replace("observation", "") and "\n" not in msg
    del meta.features[keys.ACTION_COL]  # in memory only
    with pytest.raises(DatasetError, match="no 'action' feature \\(the policy needs 6 values\\)"):
        meta.require(state=6, action=6)
    with pytest.raises(DatasetError, match="no column 'advantage'"):
        sampler(dataset, extra_columns=["advantage"])
    with pytest.raises(DatasetError, match="no camera 'observation.images.top'"):
        sampler(dataset, cameras=["top"])
    assert tree_hash(dataset) == before


def test_nan_in_state_names_the_episode_and_field(tmp_path):
    root = make_dataset(tmp_path / "nan", lengths=[6, 7], nan_at=(1, 3))
    before = tree_hash(root)
    with pytest.raises(DatasetError, match=r"episode 1 .*field 'observation.state' is NaN or infinite at frame 3"):
        sampler(root, batch_size=4)
    assert tree_hash(root) == before


def test_truncated_data_file_names_the_file_and_episodes(copy):
    path = copy / "data" / "chunk-000" / "file-000.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = tree_hash(copy)
    with pytest.raises(DatasetError, match=r"data file .*file-000.parquet \(episodes 0, 1, 2\) is unreadable"):
        sampler(copy)
    assert tree_hash(copy) == before


def test_truncated_video_names_the_file_and_the_episode(copy):
    path = next((copy / "videos" / keys.lerobot_image_key("wrist")).rglob("*.mp4"))
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * 0.6)])
    before = tree_hash(copy)
    # The file holds episodes 0-2 back to back; 60 % of it ends inside episode 1.
    with pytest.raises(DatasetError, match=r"camera 'observation.images.wrist', episodes 0, 1, 2: video file "
                                           r".*chunk-000/file-000.mp4 .*\(episode [12]\b"):
        sampler(copy)
    assert tree_hash(copy) == before
    sampler(copy, cameras=["front"])  # the other camera is intact


def test_episode_rows_disagreeing_with_metadata(copy):
    path = copy / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    pq.write_table(table.slice(0, 40), path)  # episode 2 loses its last 7 rows
    before = tree_hash(copy)
    with pytest.raises(DatasetError, match="episode 2 .*has 8 rows, meta/episodes says length 15"):
        sampler(copy)
    assert tree_hash(copy) == before


def test_not_a_v3_dataset(tmp_path, copy):
    with pytest.raises(DatasetError, match="does not exist"):
        sampler(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="not a LeRobotDataset v3 folder: meta/info.json is missing"):
        sampler(tmp_path / "empty")
    info = json.loads((copy / "meta" / "info.json").read_text())
    (copy / "meta" / "info.json").write_text(json.dumps({**info, "codebase_version": "v2.1"}))
    before = tree_hash(copy)
    with pytest.raises(DatasetError, match="codebase_version 'v2.1'"):
        sampler(copy)
    assert tree_hash(copy) == before
    (copy / "meta" / "info.json").write_text(json.dumps(info))
    shutil.rmtree(copy / "meta" / "episodes")
    before = tree_hash(copy)
    with pytest.raises(DatasetError, match="no meta/episodes"):
        sampler(copy)
    assert tree_hash(copy) == before


def test_video_backends(dataset):
    assert resolve_backend("auto") == "pyav"
    with pytest.raises(DecodeError, match="must be one of"):
        resolve_backend("ffmpeg")
    try:
        import torchcodec.decoders  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        with pytest.raises(DatasetError, match="torchcodec.*FFmpeg"):  # what this machine kind says
            sampler(dataset, video_backend="torchcodec")
        return
    a = all_frames(sampler(dataset, augment=False))[keys.lerobot_image_key("front")]
    b = all_frames(sampler(dataset, augment=False, video_backend="torchcodec"))[keys.lerobot_image_key("front")]
    assert (a - b).abs().mean() < 2 / 255


# ---------------------------------------------------------------------------------------------- in a run
class _ChunkRegressor(nn.Module):
    """The smallest policy with its own loss: a linear map from state to the action chunk (masked MSE)."""

    def __init__(self, horizon: int) -> None:
        super().__init__()
        self.horizon, self.net = horizon, nn.Linear(6, horizon * 6)

    def loss(self, batch):
        pred = self.net(batch[keys.OBS_STATE] / 100).view(-1, self.horizon, 6)
        err = ((pred - batch[keys.ACTION_COL] / 100) ** 2).mean(-1)
        keep = ~batch[keys.ACTION_IS_PAD]
        loss = (err * keep).sum() / keep.sum()
        return loss, {"loss/mse": loss.item()}

    def save(self, path: Path) -> None:  # what a checkpoint exports beside the learner's state
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        save_file(self.state_dict(), str(path / "model.safetensors"))


def test_offline_runner_trains_on_it_unchanged(dataset, tmp_path):
    from robot_rl.algos.bc import BC, BCConfig
    from robot_rl.checkpoint import CheckpointManager
    from robot_rl.logging import LoggerConfig, RunLogger
    from robot_rl.runners.offline import OfflineRunner, OfflineRunnerConfig

    torch.manual_seed(0)
    s = sampler(dataset, horizon=4, batch_size=16, cameras=[])
    runner = OfflineRunner(BC(_ChunkRegressor(4), BCConfig(learning_rate=1e-2)), s,
                           OfflineRunnerConfig(total_updates=200, updates_per_iteration=50, checkpoint_every=2),
                           RunLogger(tmp_path, LoggerConfig(progress=False, tensorboard=False)),
                           CheckpointManager(tmp_path / "ckpt"), {"algo": "bc"})
    first = runner.algo.update(s.sample())["loss/mse"]
    runner.learn()
    ckpt = load_checkpoint(tmp_path / "ckpt")
    assert ckpt.meta["dataset"] == s.fingerprint() and ckpt.state["sampler"]["pos"] == s.pos
    assert runner.algo.update(s.sample())["loss/mse"] < 0.1 * first


def test_a_multi_valued_extra_column_batches_as_rows(tmp_path):
    """An extra column of several values per frame (e.g. LeRobot's ``observation.environment_state``) batches as
    [B, k], a one-value column as [B]."""
    env_state = {"dtype": "float32", "shape": (3,), "names": ["x", "y", "z"]}
    features = {keys.OBS_STATE: {"dtype": "float32", "shape": (6,), "names": JOINTS},
                keys.ACTION_COL: {"dtype": "float32", "shape": (6,), "names": JOINTS},
                "observation.environment_state": env_state,
                keys.REWARD_COL: {"dtype": "float32", "shape": (1,), "names": None}}
    ds = LeRobotDataset.create("local/env_state", fps=30, features=features, root=tmp_path / "env_state",
                               robot_type="so101_follower", use_videos=False)
    for e in range(2):
        for i in range(5):
            ds.add_frame({keys.OBS_STATE: state_value(e, i), keys.ACTION_COL: action_value(e, i),
                          "observation.environment_state": np.array([e, i, e * 10 + i], dtype=np.float32),
                          keys.REWARD_COL: np.array([float(i)], dtype=np.float32), "task": "reach"})
        ds.save_episode()
    ds.finalize()
    s = sampler(tmp_path / "env_state", batch_size=4, extra_columns=["observation.environment_state",
                                                                      keys.REWARD_COL])
    b = all_frames(s)
    env = b["observation.environment_state"]
    assert env.shape == (10, 3) and env.dtype == torch.float32
    assert s.features["observation.environment_state"] == ((3,), torch.float32)
    assert s.features[keys.REWARD_COL] == ((), torch.float32)
    order = [(int(e), int(i)) for e, i in zip(b["episode_index"], b["frame_index"], strict=True)]
    assert env.tolist() == [[e, i, e * 10 + i] for e, i in order]
    assert b[keys.REWARD_COL].shape == (10,) and b[keys.REWARD_COL].tolist() == [float(i) for _, i in order]
