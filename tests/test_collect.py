"""``robot-rl collect`` and the episode recorder behind it (issue 14's data side; RELIABILITY.md C1, C2, C6, C7; issue
17's dataset writer).

Real MuJoCo through ``sim.lerobot_view``, real LeRobot datasets on disk, read back with ``LeRobotDataset`` itself:
episodes round-trip (state, actions, task text, outcome columns exactly, images within the codec's error); a collect
process SIGKILLed at an arbitrary moment keeps every committed episode, loadable once repaired; LeRobot's own
half-written state (a process killed right after ``save_episode``: parquet files without footers, a truncated
``info.json``) is rolled back to the commit; a full disk ends the command with exit status 4 and one line naming the
file, every episode before it loadable, and appending works again once there is room.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from policies import GaussianPolicy, GaussianPolicyConfig, keys
from policies.processor import Features, Processor
from robot_rl.cli.main import main
from robot_rl.data import recorder as rec
from robot_rl.data.recorder import (
    COMMIT_FILE,
    DatasetError,
    DatasetSpec,
    EpisodeRecorder,
    RecorderConfig,
    read_commit,
    repair_dataset,
)
from sim import so101
from tests.test_checkpoint_faults import SmallDisk

ROOT = Path(__file__).resolve().parents[1]
LENGTH = 20  # control steps per episode: short, so each env ends several
SMALL = ["task=so101_pick", "sim.num_envs=2", "sim.num_threads=1", f"task.episode_length={LENGTH}",
         "task.image_width=32", "task.image_height=32", "progress=false"]
CAMERAS = ("front", "wrist")


def _open(root: Path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(f"local/{root.name}", root=root, video_backend="pyav")


def _episode_rows(ds, index: int) -> list[dict]:
    ep = ds.meta.episodes[index]
    return [ds[i] for i in range(int(ep["dataset_from_index"]), int(ep["dataset_to_index"]))]


def _files_per_stream(root: Path) -> dict[str, int]:
    return {s: len(f) for s, f in rec._stream_files(root, [keys.lerobot_image_key(c) for c in CAMERAS]).items()}


def _check_episodes_read_back(root: Path, expected: int) -> None:
    """Every episode of the dataset at ``root`` opens with LeRobot and reads back whole: frame indices 0..L-1,
    ``next.done`` on the last frame only, every video frame decoded (LeRobot checks each one's timestamp)."""
    ds = _open(root)
    assert ds.num_episodes == expected and ds.meta.total_episodes == expected
    assert _files_per_stream(root) == dict.fromkeys(_files_per_stream(root), expected)  # nothing half-written left
    for e in range(expected):
        rows = _episode_rows(ds, e)
        assert [int(r["frame_index"]) for r in rows] == list(range(len(rows)))
        assert [bool(r[keys.DONE_COL]) for r in rows] == [False] * (len(rows) - 1) + [True]
        assert all(int(r["episode_index"]) == e for r in rows)
        for cam in CAMERAS:
            assert rows[-1][keys.lerobot_image_key(cam)].shape == (3, 32, 32)


# ---------------------------------------------------------------------------------------------- round trip
class TeeRecorder(EpisodeRecorder):
    """The real recorder, keeping a copy of every step it is handed: the ground truth the dataset is compared to."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.running: list[list[dict]] = [[] for _ in range(self.num_envs)]
        self.episodes: dict[int, list[dict]] = {}

    def add(self, frames, action, reward, success, done, actor=keys.ACTOR_POLICY, policy_action=None, record=None):
        keep = torch.ones(self.num_envs, dtype=torch.bool) if record is None else record
        who = torch.as_tensor(actor).expand(self.num_envs)
        for i in keep.nonzero().flatten().tolist():
            self.running[i].append({
                keys.OBS_STATE: frames[keys.OBS_STATE][i].clone(), keys.TASK: frames[keys.TASK][i],
                **{keys.lerobot_image_key(c): frames[keys.lerobot_image_key(c)][i].clone() for c in CAMERAS},
                keys.ACTION_COL: action[i].clone(), keys.REWARD_COL: float(reward[i]),
                keys.SUCCESS_COL: bool(success[i]), keys.ACTOR_COL: int(who[i]),
                keys.POLICY_ACTION_COL: (action if policy_action is None else policy_action)[i].clone()})
        written = super().add(frames, action, reward, success, done, actor, policy_action, record)
        for ep in written:
            self.episodes[ep.index], self.running[ep.env] = self.running[ep.env], []
        return written


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Four so101_pick episodes of the scripted expert (quality 0.5: flawed ones too), two envs, two 32x32 cameras,
    recorded by ``robot_rl.cli.collect.record`` the way ``robot-rl collect`` does."""
    from robot_rl.cli.collect import ExpertActor, record
    from sim.config import SimConfig
    from sim.experts import make_expert
    from sim.lerobot_view import LeRobotView
    from sim.registry import make_env, task_config

    root = tmp_path_factory.mktemp("roundtrip") / "pick"
    env = make_env("so101_pick", SimConfig(num_envs=2, num_threads=1), task_config("so101_pick",
                                                                                   {"episode_length": LENGTH}))
    with env:
        view = LeRobotView(env, cameras=CAMERAS, image_size=(32, 32))
        spec = DatasetSpec(round(1 / env.control_dt), so101.LEROBOT_STATE_NAMES, dict.fromkeys(CAMERAS, (32, 32)))
        tee = TeeRecorder(RecorderConfig(root=str(root)), spec, env.num_envs, env.max_episode_length)
        out = record(view, ExpertActor(view, make_expert(env, quality=0.5, seed=3)), tee, 4, seed=3)
        tee.close()
    return root, tee, out


def test_recorded_episodes_read_back_equal(recorded):
    root, tee, out = recorded
    ds = _open(root)
    assert ds.num_episodes == 4 == len(tee.episodes) and out["frames"] == len(ds)
    assert ds.fps == 30 and ds.meta.robot_type == "so101_follower"
    assert ds.features[keys.OBS_STATE]["names"] == list(so101.LEROBOT_STATE_NAMES)
    assert ds.features[keys.ACTION_COL]["names"] == list(so101.LEROBOT_STATE_NAMES)
    video = ds.features[keys.lerobot_image_key("front")]["info"]
    assert (video["video.codec"], video["video.pix_fmt"]) == ("h264", "yuv444p")
    tasks = set()
    for e, steps in tee.episodes.items():
        rows = _episode_rows(ds, e)
        assert len(rows) == len(steps)
        for t, (row, step) in enumerate(zip(rows, steps, strict=True)):
            for k in (keys.OBS_STATE, keys.ACTION_COL, keys.POLICY_ACTION_COL):
                assert torch.equal(row[k], step[k]), (e, t, k)
            assert row[keys.TASK] == step[keys.TASK]
            assert float(row[keys.REWARD_COL]) == np.float32(step[keys.REWARD_COL])
            assert bool(row[keys.SUCCESS_COL]) == step[keys.SUCCESS_COL]
            assert int(row[keys.ACTOR_COL]) == step[keys.ACTOR_COL] == keys.ACTOR_HUMAN
            assert bool(row[keys.INTERVENTION_COL])  # the expert plays the human
            assert bool(row[keys.DONE_COL]) == (t == len(rows) - 1)
            assert abs(float(row["timestamp"]) - t / 30) < 1e-4
        tasks.add(steps[0][keys.TASK])
        for cam in CAMERAS:
            key = keys.lerobot_image_key(cam)
            want = torch.stack([s[key] for s in steps]).float()
            got = torch.stack([r[key] for r in rows]) * 255.0
            assert want.std() > 10  # a real render, not a blank frame
            mse = float((got - want).square().mean())
            assert 10 * np.log10(255**2 / mse) >= 35.0, (e, cam, mse)  # ~40 dB measured at 32x32
        assert list(ds.meta.episodes[e]["tasks"]) == [steps[0][keys.TASK]]  # one instruction per episode
    assert all(t.startswith("pick up the ") for t in tasks)


def test_the_dataset_is_loadable_between_episodes_and_commits_each(recorded):
    root, tee, _ = recorded
    commit = read_commit(root)
    assert commit["total_episodes"] == 4 and commit["total_frames"] == tee.frames_written
    assert _files_per_stream(root) == dict.fromkeys(_files_per_stream(root), 4)  # one file per episode and stream
    assert json.loads((root / rec.INFO_PATH).read_text()) == commit["info"]
    assert repair_dataset(root) == []  # a committed folder has nothing to roll back



def test_an_episode_longer_than_the_buffer_grows_it_and_the_counts_add_up(tmp_path):
    """The recorder's per-env buffer starts at max_episode_length frames and doubles as an episode outgrows it (a
    real arm's episode has no fixed length): nine frames through a buffer of two, then three more, read back."""
    spec = DatasetSpec(30, so101.LEROBOT_STATE_NAMES, {})
    root = tmp_path / "long"
    start = time.perf_counter()
    with EpisodeRecorder(RecorderConfig(root=str(root)), spec, 1, max_episode_length=2) as r:
        for length in (9, 3):
            for t in range(length):
                state = torch.full((1, 6), float(10 * length + t))
                r.add({keys.OBS_STATE: state, keys.TASK: ["reach"]}, state + 0.5, torch.zeros(1),
                      torch.tensor([False]), torch.tensor([t == length - 1]))
        assert (r.episodes_written, r.frames_written, r.num_episodes) == (2, 12, 2)
        assert all(0.0 <= v <= time.perf_counter() - start for v in r.timings.values()), r.timings
    ds = _open(root)
    for index, length in ((0, 9), (1, 3)):
        rows = _episode_rows(ds, index)
        assert [float(x[keys.OBS_STATE][0]) for x in rows] == [float(10 * length + t) for t in range(length)]
        assert [float(x[keys.ACTION_COL][5]) for x in rows] == [10 * length + t + 0.5 for t in range(length)]
    assert read_commit(root)["total_frames"] == 12


def test_discarded_steps_leave_no_trace_and_bad_images_are_refused(tmp_path):
    spec = DatasetSpec(30, so101.LEROBOT_STATE_NAMES, {"front": (8, 8)})
    img = torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    with EpisodeRecorder(RecorderConfig(root=str(tmp_path / "d")), spec, 1, 4) as r:
        def step(value: float, done: bool, image: torch.Tensor = img) -> None:
            state = torch.full((1, 6), value)
            r.add({keys.OBS_STATE: state, keys.lerobot_image_key("front"): image, keys.TASK: ["reach"]}, state,
                  torch.zeros(1), torch.tensor([False]), torch.tensor([done]))

        for v in (1.0, 2.0, 3.0):
            step(v, False)
        r.discard()  # e.g. a take-over the user aborted: these three steps are gone
        for bad in (img.float(), torch.zeros(1, 3, 8, 9, dtype=torch.uint8)):
            with pytest.raises(ValueError, match=r"observation.images.front is .*, expected uint8 \[1, 3, 8, 8\]"):
                step(4.0, False, bad)
        step(5.0, False)
        step(6.0, True)
    rows = _episode_rows(_open(tmp_path / "d"), 0)
    assert [float(x[keys.OBS_STATE][0]) for x in rows] == [5.0, 6.0]


@pytest.mark.parametrize("lost", [2.0, 0.6, 0.4])
def test_an_episode_whose_video_came_out_short_is_not_committed(tmp_path, monkeypatch, lost):
    """The commit checks each camera's video against the episode's frame count; an encoder that wrote fewer frames
    (by more than half a frame: timestamps round) fails the episode, named with both counts, and rolls the folder
    back to the episodes before it."""
    spec = DatasetSpec(30, so101.LEROBOT_STATE_NAMES, {"front": (8, 8)})
    root = tmp_path / "d"
    commit = EpisodeRecorder._commit

    def episode(r, value: float, length: int) -> None:
        for t in range(length):
            state = torch.full((1, 6), value + t)
            r.add({keys.OBS_STATE: state, keys.lerobot_image_key("front"): torch.zeros(1, 3, 8, 8, dtype=torch.uint8),
                   keys.TASK: ["reach"]}, state, torch.zeros(1), torch.tensor([False]), torch.tensor([t == length - 1]))

    def frames_lost(self, env, length):  # what LeRobot's metadata says when the encoder dropped two frames
        ep = dict(self.ds.meta.latest_episode)
        key = f"videos/{keys.lerobot_image_key('front')}/to_timestamp"
        ep[key] = [ep[key][0] - lost / self.spec.fps]
        self.ds.meta.latest_episode = ep
        return commit(self, env, length)

    with EpisodeRecorder(RecorderConfig(root=str(root)), spec, 1, 8) as r:
        episode(r, 0.0, 3)
        monkeypatch.setattr(EpisodeRecorder, "_commit", frames_lost)
        if lost < 0.5:
            episode(r, 10.0, 5)
        else:
            with pytest.raises(RuntimeError, match=f"episode 1: the observation.images.front video holds {5 - lost}"
                                                   " frames, the episode 5"):
                episode(r, 10.0, 5)
    ds = _open(root)
    kept = 2 if lost < 0.5 else 1
    assert ds.num_episodes == kept and read_commit(root)["total_episodes"] == kept and len(ds) == 3 + 5 * (kept - 1)
    assert [float(x[keys.OBS_STATE][0]) for x in _episode_rows(ds, 0)] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("kw", [{"crf": -1}, {"gop": 0}])
def test_recorder_config_refuses_a_negative_crf_or_no_keyframes(kw):
    with pytest.raises(ValueError, match="dataset.crf must be >= 0 and dataset.gop >= 1"):
        RecorderConfig(root="x", **kw)
    RecorderConfig(root="x", crf=0, gop=1)  # the bounds themselves

def test_a_policy_reading_frames_is_recorded_with_its_proposals(tmp_path):
    """A VLA (untrained: its chunks aim near 0 degrees) acts on the view's frames; the view clips each target to
    the per-step cap, which is what ``action`` holds, while ``policy_action`` keeps the proposal."""
    from policies import FlowVLAConfig, FlowVLAPolicy
    from robot_rl.cli.collect import PolicyActor, record
    from sim.config import SimConfig
    from sim.lerobot_view import LeRobotView
    from sim.registry import make_env, task_config

    torch.manual_seed(0)
    cfg = FlowVLAConfig(image_size=[32, 32], horizon=4, executed_steps=2, conv_channels=[8, 8],
                        conv_strides=[2, 2], image_feature_dim=16, text_dim=8, hidden_dim=32, num_blocks=1,
                        time_dim=8, num_steps=2, vocab=["pick", "up", "the", "red", "green", "blue", "cube"])
    task = task_config("so101_pick", {"episode_length": 8})
    with make_env("so101_pick", SimConfig(num_envs=2, num_threads=1), task) as env:
        view = LeRobotView(env, cameras=CAMERAS, image_size=(32, 32))
        spec = DatasetSpec(30, so101.LEROBOT_STATE_NAMES, dict.fromkeys(CAMERAS, (32, 32)))
        with EpisodeRecorder(RecorderConfig(root=str(tmp_path / "vla")), spec, 2, 8) as r:
            actor = PolicyActor(view, FlowVLAPolicy(cfg).eval())
            assert actor.reads_frames
            record(view, actor, r, 2, seed=0)
        cap = so101.rad_to_deg(torch.tensor([task.max_delta] * 5 + [task.max_delta_gripper]))
    ds = _open(tmp_path / "vla")
    rows = [ds[i] for i in range(len(ds))]
    assert len(rows) == 16 and all(int(r[keys.ACTOR_COL]) == keys.ACTOR_POLICY for r in rows)
    assert not any(bool(r[keys.INTERVENTION_COL]) for r in rows)
    step = torch.stack([r[keys.ACTION_COL] - r[keys.OBS_STATE] for r in rows]).abs()
    assert bool((step <= cap + 1e-3).all()), step.max(dim=0)
    assert any(not torch.equal(r[keys.ACTION_COL], r[keys.POLICY_ACTION_COL]) for r in rows)


def test_the_layout_names_are_lerobots():
    from lerobot.datasets import utils

    assert (rec.INFO_PATH, rec.STATS_PATH, rec.TASKS_PATH, rec.EPISODES_PATH) == (
        utils.INFO_PATH, utils.STATS_PATH, utils.DEFAULT_TASKS_PATH, utils.DEFAULT_EPISODES_PATH)


# ------------------------------------------------------------------------------------------- crash safety
def test_a_killed_collect_keeps_every_committed_episode(tmp_path):
    """SIGKILL at whatever moment the second commit is seen (often while the next episode is being written)."""
    root = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "robot_rl.cli.main", "collect", *SMALL, "episodes=1000",
                             f"dataset.root={root}"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while (commit := _committed(root)) < 2:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no second episode within 240 s"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    committed = read_commit(root)["total_episodes"]
    assert committed >= commit >= 2
    repair_dataset(root)
    _check_episodes_read_back(root, committed)


def test_sigterm_stops_collect_with_a_dataset_that_loads_as_it_is(tmp_path):
    """SIGTERM (or Ctrl-C) at any moment: the episode being written is rolled back before the process exits 130;
    the folder opens with plain ``LeRobotDataset``, no repair needed."""
    root = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "robot_rl.cli.main", "collect", *SMALL, "episodes=1000",
                             f"dataset.root={root}"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while _committed(root) < 1:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no episode within 240 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    committed = read_commit(root)["total_episodes"]
    last = err.decode().strip().splitlines()[-1]
    assert proc.returncode == 130, err.decode()[-2000:]
    assert last == f"robot-rl collect: interrupted; the dataset {root} holds {committed} complete episodes", last
    _check_episodes_read_back(root, committed)  # before any repair
    assert repair_dataset(root) == []


def _committed(root: Path) -> int:
    try:
        commit = read_commit(root)
    except DatasetError:
        return 0
    return 0 if commit is None else commit["total_episodes"]


def _steps(n: int, length: int, seed: int) -> list[dict]:
    """Synthetic batched steps (the recorder takes any tensors): per-env ramps, random images, ends every
    ``length`` steps."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in range(length):
        state = torch.arange(6.0).repeat(n, 1) + t + 100 * torch.arange(n)[:, None]
        frames = {keys.OBS_STATE: state, keys.TASK: [f"task {i}" for i in range(n)],
                  **{keys.lerobot_image_key(c): torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
                     for c in CAMERAS}}
        out.append({"frames": frames, "action": -state, "reward": torch.full((n,), 0.5), "success":
                    torch.zeros(n, dtype=torch.bool), "done": torch.full((n,), t == length - 1)})
    return out


SPEC = DatasetSpec(30, so101.LEROBOT_STATE_NAMES, dict.fromkeys(CAMERAS, (32, 32)))

_KILLED_AFTER_SAVE = """
import os, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
root = sys.argv[1]
ds = LeRobotDataset.resume("local/ds", root=root, streaming_encoding=True, encoder_queue_maxsize=64,
                           video_backend="pyav")
for t in range(7):
    frame = {k: np.full(ft["shape"], t, dtype=ft["dtype"]) for k, ft in ds.features.items()
             if ft["dtype"] not in ("video",) and k not in ("timestamp", "frame_index", "episode_index", "index",
                                                             "task_index")}
    frame.update({k: np.zeros((3, 32, 32), np.uint8) for k, ft in ds.features.items() if ft["dtype"] == "video"})
    ds.add_frame({**frame, "task": "a new task"})
ds.save_episode()
info = os.path.join(root, "meta", "info.json")
data = open(info).read()
open(info, "w").write(data[: len(data) // 2])  # as a kill in the middle of LeRobot's rewrite leaves it
os._exit(0)  # no finalize, no footer: a SIGKILL right here
"""


def test_lerobots_half_written_episode_is_rolled_back_to_the_commit(tmp_path):
    root = tmp_path / "ds"
    with EpisodeRecorder(RecorderConfig(root=str(root), repo_id="local/ds"), SPEC, 1, LENGTH) as r:
        for s in _steps(1, 5, 0) + _steps(1, 6, 1):
            r.add(**s)
    subprocess.run([sys.executable, "-c", _KILLED_AFTER_SAVE, str(root)], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
    assert json.loads((root / COMMIT_FILE).read_text())["total_episodes"] == 2
    with pytest.raises(Exception):  # noqa: B017 - LeRobot's own error for its half-written folder
        _open(root)
    changed = repair_dataset(root)
    assert root / rec.INFO_PATH in changed and root / rec.TASKS_PATH in changed
    assert any(p.parent.parent.name == "data" for p in changed)  # the episode's footerless parquet
    ds = _open(root)
    assert ds.num_episodes == 2 and len(ds) == 11 and ds.meta.total_tasks == 1
    assert torch.equal(ds[10][keys.OBS_STATE], torch.arange(6.0) + 5)
    with EpisodeRecorder(RecorderConfig(root=str(root), repo_id="local/ds", append=True), SPEC, 1, LENGTH) as r:
        for s in _steps(1, 4, 2):
            r.add(**s)
    _check_episodes_read_back(root, 3)


def test_an_existing_dataset_is_appended_to_only_when_asked_and_when_it_matches(tmp_path):
    root = tmp_path / "ds"
    with EpisodeRecorder(RecorderConfig(root=str(root)), SPEC, 2, LENGTH) as r:
        for s in _steps(2, 3, 0):
            r.add(**s)
    with pytest.raises(DatasetError, match="2 episodes.*dataset.append=true"):
        EpisodeRecorder(RecorderConfig(root=str(root)), SPEC, 2, LENGTH)
    other = dataclasses.replace(SPEC, cameras={"front": (32, 32)})
    with pytest.raises(DatasetError, match="observation.images.wrist"):
        EpisodeRecorder(RecorderConfig(root=str(root), append=True), other, 2, LENGTH)
    with pytest.raises(DatasetError, match="fps 30"):
        EpisodeRecorder(RecorderConfig(root=str(root), append=True), dataclasses.replace(SPEC, fps=15), 2, LENGTH)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(DatasetError, match="not a LeRobot dataset"):
        EpisodeRecorder(RecorderConfig(root=str(tmp_path / "notes"), append=True), SPEC, 2, LENGTH)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"
    with EpisodeRecorder(RecorderConfig(root=str(root), append=True), SPEC, 2, LENGTH) as r:
        written = [ep for s in _steps(2, 4, 1) for ep in r.add(**s)]
    assert [ep.index for ep in written] == [2, 3]
    _check_episodes_read_back(root, 4)


def test_a_dataset_recorded_by_lerobot_itself_is_adopted_and_appended_to(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path / "theirs"
    ds = LeRobotDataset.create("local/theirs", 30, SPEC.features(), root=root, robot_type="so101_follower")
    for t in range(5):  # LeRobot's defaults: PNG frames, libsvtav1, one growing file per stream
        ds.add_frame({**{k: v[0] for k, v in _steps(1, 1, t)[0]["frames"].items() if k != keys.TASK},
                      keys.ACTION_COL: np.zeros(6, np.float32), keys.POLICY_ACTION_COL: np.zeros(6, np.float32),
                      keys.REWARD_COL: np.zeros(1, np.float32), keys.SUCCESS_COL: np.zeros(1, bool),
                      keys.DONE_COL: np.array([t == 4]), keys.INTERVENTION_COL: np.zeros(1, bool),
                      keys.ACTOR_COL: np.zeros(1, np.int64), keys.TASK: "theirs"})
    ds.save_episode()
    ds.finalize()
    with EpisodeRecorder(RecorderConfig(root=str(root), append=True), SPEC, 1, LENGTH) as r:
        for s in _steps(1, 3, 0):
            r.add(**s)
    assert read_commit(root)["total_episodes"] == 2
    _check_episodes_read_back(root, 2)


# ------------------------------------------------------------------------------------- the command line
def _gaussian_policy(folder: Path) -> Path:
    """An exported (untrained) state policy for so101_pick's policy observation: the policy-driven path."""
    from sim.config import SimConfig
    from sim.registry import make_env, task_config

    with make_env("so101_pick", SimConfig(num_envs=1), task_config("so101_pick", {"episode_length": LENGTH})) as env:
        obs_dim = env.obs_spec.shapes[keys.POLICY][0]
    cfg = GaussianPolicyConfig(obs_dim=obs_dim, action_dim=6, hidden_dims=[16])
    policy = GaussianPolicy(cfg, Processor(Features({keys.POLICY: [obs_dim]}, 6)))
    policy.save(folder)
    return folder


def test_collect_end_to_end_a_full_disk_stops_it_cleanly_and_appending_resumes(tmp_path, capsys):
    disk = SmallDisk(tmp_path / "disk")
    root = disk.root / "pick"
    try:
        code = main(["collect", *SMALL, "episodes=2", f"dataset.root={root}"])
        err = capsys.readouterr().err
        assert code == 0, err
        summary = err.strip().splitlines()[-1]
        assert summary.startswith("collect: 2 episodes, success rate ") and f"dataset {root} (2 episodes)" in summary
        _check_episodes_read_back(root, 2)

        disk.limit(48 * 1024)  # less than one episode's files
        with disk.full():
            code = main(["collect", *SMALL, "episodes=2", f"dataset.root={root}", "dataset.append=true"])
        err = capsys.readouterr().err
        assert code == 4 and "Traceback" not in err, err
        stop = err.strip().splitlines()[-1]
        assert stop.startswith(f"robot-rl collect: stopped: could not write {root}/"), stop
        assert "No space left on device" in stop or "File too large" in stop, stop
        assert f"the dataset {root} holds its 2 complete episodes" in stop and "dataset.append=true" in stop, stop
        assert "was being written as episode 2 and is lost" in stop, stop  # which episode the full disk cost
        assert not [p for p in root.iterdir() if p.name.startswith("tmp")] and not (root / "images").exists()
        _check_episodes_read_back(root, 2)

        disk.space_is_back()
        policy = _gaussian_policy(tmp_path / "policy")
        code = main(["collect", *SMALL, "episodes=2", f"dataset.root={root}", "dataset.append=true",
                     f"policy={policy}"])
        assert code == 0, capsys.readouterr().err
        _check_episodes_read_back(root, 4)
        ds = _open(root)
        actors = [int(ds[i][keys.ACTOR_COL]) for i in range(len(ds))]
        first_policy_frame = int(ds.meta.episodes[2]["dataset_from_index"])
        assert set(actors[:first_policy_frame]) == {keys.ACTOR_HUMAN}
        assert set(actors[first_policy_frame:]) == {keys.ACTOR_POLICY}
        assert not any(bool(ds[i][keys.INTERVENTION_COL]) for i in range(first_policy_frame, len(ds)))
    finally:
        disk.close()


@pytest.mark.parametrize("args,message", [
    (["episods=3", "dataset.root=X"], "episods"),
    (["dataset.codec=h264", "dataset.root=X"], "dataset.codec"),
    (["episodes=3"], "dataset.root"),
    (["episodes=0", "dataset.root=X"], "episodes must be >= 1"),
    (["episodes=1", "dataset.root=X", "task=humanoid_walk"], "is not one of ['so101_lift', 'so101_pick'"),
])
def test_a_bad_collect_config_exits_2(tmp_path, capsys, args, message):
    args = [a.replace("=X", f"={tmp_path / 'ds'}") for a in args]
    assert main(["collect", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("robot-rl collect: error:") and message in err and "Traceback" not in err, err
    assert not (tmp_path / "ds").exists()


# ------------------------------------------------------------------------------------------------------- DART
class _ActionLog:
    """A stand-in recorder (named as such) that keeps the ``action`` each step hands it and ends env 0's episode
    at the sixth step; nothing is written."""

    def __init__(self) -> None:
        self.actions: list[torch.Tensor] = []

    def add(self, frames, action, reward, success, done, **kwargs) -> list:
        self.actions.append(action.clone())
        return [rec.WrittenEpisode(index=0, env=0, length=6, success=False)] if len(self.actions) == 6 else []


def test_dart_sends_the_disturbed_action_and_records_the_experts_own():
    """With ``disturbance``, the arm joints are sent with noise held for ``disturbance_steps``, the gripper is not,
    and what ``record`` writes as the action is the undisturbed expert's command for the same observation."""
    from robot_rl.cli.collect import CollectCommand, ExpertActor, record
    from sim.config import SimConfig
    from sim.experts import make_expert
    from sim.lerobot_view import LeRobotView
    from sim.registry import make_env, task_config

    class Labels(ExpertActor):
        def __call__(self, frames):
            out = super().__call__(frames)
            self.labels.append(self.label.clone())
            return out

    with make_env("so101_reach", SimConfig(num_envs=2, num_threads=1), task_config("so101_reach", {})) as env:
        view = LeRobotView(env, cameras=(), image_size=(32, 32))
        view.reset(seed=1)
        reference = make_expert(env)  # a second expert in the same state: the undisturbed command
        actor = ExpertActor(view, make_expert(env), disturbance=0.5, disturbance_steps=3, seed=0)
        diffs, draws = [], []
        for _ in range(4):
            clean = view.to_target(reference.act(view.env_obs))
            sent, _, who = actor(None)
            assert who == keys.ACTOR_HUMAN and torch.equal(actor.label, clean)
            diffs.append(sent - clean)
            draws.append(actor._noise.clone())
            view.step(sent)
        diff = torch.stack(diffs)  # [4 steps, N, 6] degrees
        # every step moves some arm joint off the expert's command (not all: an action already at the per-step cap
        # stays there when the noise pushes it further), never the gripper
        assert (diff[:, :, :5].abs() > 1e-3).flatten(1).any(dim=1).all() and (diff[:, :, 5] == 0).all()
        assert torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])  # held 3 steps ...
        assert not torch.equal(draws[2], draws[3])  # ... then drawn again
        log, labelled = _ActionLog(), Labels(view, make_expert(env), disturbance=0.5, seed=0)
        labelled.labels = []
        record(view, labelled, log, 1, seed=1)
        assert len(log.actions) == 6 and all(torch.equal(a, b) for a, b in zip(log.actions, labelled.labels))
    with pytest.raises(ValueError, match="disturbance"):
        ExpertActor(view, reference, disturbance=-0.1)
    with pytest.raises(ValueError, match="cannot be combined"):
        CollectCommand(policy="runs/x", disturbance=0.2)


def test_dart_during_approach_leaves_the_grasp_undisturbed():
    """``during="approach"``: on so101_lift the arm is sent off the expert's command while the expert goes above the
    cube and exactly its command once it descends, closes and lifts; reach's expert approaches all episode long."""
    from robot_rl.cli.collect import CollectCommand, ExpertActor
    from sim.config import SimConfig
    from sim.experts import make_expert
    from sim.lerobot_view import LeRobotView
    from sim.registry import make_env, task_config

    with make_env("so101_reach", SimConfig(num_envs=2, num_threads=1), task_config("so101_reach", {})) as env:
        assert make_expert(env).approaching.tolist() == [True, True]
    with make_env("so101_lift", SimConfig(num_envs=2, num_threads=1), task_config("so101_lift", {})) as env:
        view = LeRobotView(env, cameras=(), image_size=(32, 32))
        view.reset(seed=3)
        reference = make_expert(env)
        actor = ExpertActor(view, make_expert(env), disturbance=0.5, disturbance_steps=2, seed=0, during="approach")
        off = {True: [], False: []}  # approaching -> per env-step: how far an arm joint was sent off the command
        calm_phases = set()  # the expert's phases on the steps that were not disturbed
        for _ in range(45):
            clean = view.to_target(reference.act(view.env_obs))
            sent, _, _ = actor(None)
            assert torch.equal(actor.label, clean)  # the same observations: the two experts stay in step
            for approaching, d in zip(actor.expert.approaching, (sent - clean)[:, :5].abs().amax(dim=1)):
                off[bool(approaching)].append(float(d))
            calm_phases |= set(actor.expert.phase[~actor.expert.approaching].tolist())
            view.step(sent)
        assert len(off[True]) >= 10 and len(off[False]) >= 10  # both kinds of steps were seen
        assert sum(d > 1e-3 for d in off[True]) >= 0.8 * len(off[True])  # the approach is disturbed ...
        assert max(off[False]) == 0.0  # ... the descent (phase 2) and the grasp (3) are not
        assert {2, 3} <= calm_phases
    with pytest.raises(ValueError, match="disturbance_during"):
        CollectCommand(disturbance=0.2, disturbance_during="grasp")
