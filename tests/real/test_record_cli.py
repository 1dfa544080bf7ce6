"""``robot-rl record`` and the datasets a robot session writes (RELIABILITY.md C1, C2, C3, C7 subset), on so101_sim
with its simulated leader."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from policies import keys

ROOT = Path(__file__).resolve().parents[2]
CAMERAS = ("front", "wrist")
SIZE = 48
# watchdog at 3 s: a late tick in a full `make test` process (tests/real/test_deploy_cli.py says why)
REC = ["record", "robot=so101_sim", "robot.task=so101_lift", f"robot.image_height={SIZE}",
       f"robot.image_width={SIZE}", "teleop=so101_sim_leader", "safety.watchdog_s=3.0"]

# C2: a separate process opens every parquet (footer present) and decodes each video's last frame
CHECKER = r"""
import json, sys
from pathlib import Path
import av
import pyarrow.parquet as pq
root = Path(sys.argv[1])
rows = 0
for p in sorted(root.glob("data/*/*.parquet")):
    rows += pq.read_metadata(p).num_rows
for p in sorted(root.glob("meta/episodes/*/*.parquet")):
    pq.read_metadata(p)
last = {}
for p in sorted(root.glob("videos/*/*/*.mp4")):
    with av.open(str(p)) as c:
        frames = [f for f in c.decode(video=0)]
    last[str(p.relative_to(root))] = [len(frames), frames[-1].to_ndarray(format="rgb24").shape]
print(json.dumps({"rows": rows, "videos": last}))
"""


def run_main(argv: list[str]) -> int:
    from robot_rl.cli.main import main

    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """Three teleoperated episodes of so101_sim recorded through guarded_session, with a tap on what the recorder was
    handed, and the C2 check run by a separate process right after each episode is committed."""
    from real.config_sim_robot import SO101SimRobotConfig
    from real.config_sim_teleop import SO101SimLeaderConfig
    from real.robot_env import ControlClock, safe_connect
    from real.safety import SafetyConfig, SafetyFilter, limits_from_robot
    from real.sim_robot import SO101SimRobot
    from real.sim_teleop import SO101SimLeader
    from real.teleop import AlwaysHuman, guarded_session
    from robot_rl.data.recorder import DatasetSpec, EpisodeRecorder, RecorderConfig
    from sim.so101 import LEROBOT_STATE_NAMES

    tmp = tmp_path_factory.mktemp("record")
    root = tmp / "ds"
    # named, and the leader told which: robots of earlier tests may still be alive in this process (the leader
    # refuses to guess between several)
    robot = SO101SimRobot(SO101SimRobotConfig(task="so101_lift", id="record_cli_sim", calibration_dir=tmp,
                                              image_height=SIZE, image_width=SIZE, seed=3))
    leader = SO101SimLeader(SO101SimLeaderConfig(id="leader", calibration_dir=tmp, robot_id="record_cli_sim"))
    leader.connect()
    cfg = SafetyConfig(watchdog_s=3.0)
    safety = SafetyFilter(cfg, limits_from_robot(robot, cfg.margin_deg))
    safe_connect(robot, safety)
    tapped: list[dict] = []
    checks: list[dict] = []
    recorders = []

    def make_recorder():
        rec = EpisodeRecorder(RecorderConfig(root=str(root)), DatasetSpec(30, tuple(LEROBOT_STATE_NAMES),
                              dict.fromkeys(CAMERAS, (SIZE, SIZE)), robot_type="so101_sim"), 1, 120)
        add = rec.add

        def tap(frames, action, *a, **kw):
            tapped.append({"state": frames[keys.OBS_STATE].clone(), "action": action.clone(),
                           **{c: frames[keys.lerobot_image_key(c)].clone() for c in CAMERAS}})
            return add(frames, action, *a, **kw)

        rec.add = tap
        recorders.append(rec)
        return rec

    def on_written(ep):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHECKER, str(root)], check=False, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        checks.append({"episode": ep.index, "length": ep.length, **json.loads(out.stdout),
                       "check_s": time.perf_counter() - t0})

    res = guarded_session(robot, safety, {"cameras": CAMERAS, "max_episode_length": 120,
                                          "clock": ControlClock(30, sleep=False)},
                          episodes=3, teleop=leader, takeover=AlwaysHuman(), make_recorder=make_recorder,
                          stop_on_success=True, seed=3, on_written=on_written)
    return {"root": root, "res": res, "tapped": tapped, "checks": checks, "timings": dict(recorders[0].timings)}


def test_c2_each_episode_is_durable_the_moment_it_is_committed(session):
    """After each commit a separate process reads every parquet footer and decodes every video to its last frame; the
    rows and frames it sees are exactly the episodes committed so far (one video file per camera and episode). The
    commit (parquet footers, fsyncs, the commit record) adds 13-29 ms per episode here with a training run beside it
    (load average ~2 on 2 cores; ~60 ms at load average ~6): asserted <= 50 ms on average, RELIABILITY C2's bound."""
    checks, res = session["checks"], session["res"]
    assert res.written == 3 and [c["episode"] for c in checks] == [0, 1, 2]
    lengths = []
    for c in checks:
        lengths.append(c["length"])
        assert c["rows"] == sum(lengths)
        for cam in CAMERAS:
            files = sorted(k for k in c["videos"] if f"images.{cam}/" in k)
            assert [c["videos"][f][0] for f in files] == lengths
            assert all(c["videos"][f][1] == [SIZE, SIZE, 3] for f in files)
    assert session["timings"]["commit_s"] / 3 <= 0.05, session["timings"]


def test_c3_the_recorded_dataset_validates(session):
    """Per episode frame_index 0..L-1, timestamps 1/fps apart (+-1e-4 s), episode_index and global index contiguous,
    each video holding the episode's frames, every feature's dtype and shape as info.json says, no NaN/inf in state
    or action; every frame is the person's (intervention, actor = human)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = session["root"]
    info = json.loads((root / "meta" / "info.json").read_text())
    ds = LeRobotDataset("local/ds", root=root)
    df = ds.hf_dataset.to_pandas()
    assert info["total_episodes"] == 3 and info["total_frames"] == len(df) == len(session["tapped"])
    assert list(df["index"]) == list(range(len(df)))
    eps = df["episode_index"].to_numpy()
    assert list(np.unique(eps)) == [0, 1, 2] and np.all(np.diff(eps) >= 0)
    for e in range(3):
        part = df[df["episode_index"] == e]
        n = len(part)
        assert list(part["frame_index"]) == list(range(n))
        assert np.allclose(np.diff(part["timestamp"].to_numpy()), 1 / 30, atol=1e-4)
        for cam in CAMERAS:
            meta = ds.meta.episodes[e]
            seconds = meta[f"videos/{keys.lerobot_image_key(cam)}/to_timestamp"] - \
                meta[f"videos/{keys.lerobot_image_key(cam)}/from_timestamp"]
            assert round(seconds * 30) == n
    for name in (keys.OBS_STATE, keys.ACTION_COL):
        a = np.stack(df[name].to_numpy())
        assert a.dtype == np.float32 and a.shape[1:] == tuple(info["features"][name]["shape"])
        assert np.isfinite(a).all()
    assert df[keys.INTERVENTION_COL].map(lambda v: bool(np.asarray(v).item())).all()
    assert (df[keys.ACTOR_COL].map(lambda v: int(np.asarray(v).item())) == keys.ACTOR_HUMAN).all()


def test_c7_round_trip_state_action_bitwise_and_video_psnr(session):
    """What the session handed the recorder comes back: state and action bitwise equal, the videos at PSNR >= 40 dB
    on every frame (H.264 4:4:4 at the default CRF 7, 48x48 renders: mean 44.1 dB, worst frame 41.0 dB), and the recorded
    action within the per-tick cap of the state."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/ds", root=session["root"])
    tapped = session["tapped"]
    psnrs = []
    for i in range(len(ds)):
        row, t = ds[i], tapped[i]
        assert torch.equal(row[keys.OBS_STATE], t["state"][0]) and torch.equal(row[keys.ACTION_COL], t["action"][0])
        for cam in CAMERAS:
            got = row[keys.lerobot_image_key(cam)].float() * 255
            mse = float(((got - t[cam][0].float()) ** 2).mean())
            psnrs.append(99.0 if mse == 0 else 10 * np.log10(255**2 / mse))
    assert min(psnrs) >= 40, (np.mean(psnrs), min(psnrs))
    state = torch.stack([t["state"][0] for t in tapped])
    action = torch.stack([t["action"][0] for t in tapped])
    assert bool(((action - state)[:, :5].abs() <= 5.0 + 1e-3).all())


def test_record_end_to_end(tmp_path):
    """robot-rl record on so101_sim with the simulated leader: 2 episodes, each committed as it ended; LeRobotDataset
    opens them; every frame an intervention by the person."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path / "ds"
    assert run_main([*REC, f"dataset.root={root}", "episodes=2", "realtime=false"]) == 0
    ds = LeRobotDataset("local/ds", root=root)
    assert ds.meta.total_episodes == 2 and ds.meta.robot_type == "so101_sim"
    assert all(bool(ds[i][keys.INTERVENTION_COL]) for i in (0, len(ds) - 1))
    assert run_main([*REC, f"dataset.root={root}", "episodes=1", "realtime=false"]) == 2  # exists: refused
    assert run_main([*REC, f"dataset.root={root}", "episodes=1", "realtime=false", "dataset.append=true"]) == 0
    assert LeRobotDataset("local/ds", root=root).meta.total_episodes == 3


def _kill_mid_recording(tmp_path: Path, seed: int) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from robot_rl.data.recorder import read_commit, repair_dataset

    root = tmp_path / f"ds{seed}"
    argv = [sys.executable, "-m", "robot_rl.cli.main", *REC, f"dataset.root={root}", "episodes=40", "realtime=false",
            "stop_on_success=false", "episode_s=0.4"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "MUJOCO_GL": "egl"})
    rng = random.Random(seed)
    want = rng.randint(1, 3)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        commit = read_commit(root) if (root / "meta" / "robot_rl_commit.json").exists() else None
        if commit and commit["total_episodes"] >= want:
            break
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 0.5))  # somewhere in the next episode: its frames, its write or its commit
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    committed = read_commit(root)["total_episodes"]
    assert committed >= want
    repair_dataset(root)
    ds = LeRobotDataset("local/ds", root=root)
    assert ds.meta.total_episodes == read_commit(root)["total_episodes"] >= committed
    info = json.loads((root / "meta" / "info.json").read_text())
    df = ds.hf_dataset.to_pandas()
    assert info["total_frames"] == len(df) == 12 * ds.meta.total_episodes
    assert sorted(set(df["episode_index"])) == list(range(ds.meta.total_episodes))


def test_c1_a_sigkilled_recording_keeps_every_committed_episode(tmp_path):
    """robot-rl record SIGKILLed at a random moment after 1..3 committed episodes: after repair_dataset the folder
    opens with every committed episode (none lost), indices contiguous, info.json's totals equal the rows."""
    _kill_mid_recording(tmp_path, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 6))
def test_c1_more_kills(tmp_path, seed):
    _kill_mid_recording(tmp_path, seed)
