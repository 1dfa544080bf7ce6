"""A LeRobotDataset v3 as FlashSAC's demonstration buffer (issue 15, offline-to-online): ``robot-rl collect
env_state=true`` -> ``robot_rl.data.demo_buffer`` -> ``robot-rl train algo=flashsac demo_dataset.root=DIR``.

Real MuJoCo, the real recorder and real datasets on disk. The ground truth is what the env itself returned at every
step (observations, applied actions, rewards, terminated / truncated, the final observation), logged by a thin
wrapper around the real env while ``robot_rl.cli.collect.record`` recorded the dataset the way ``robot-rl collect``
does; the demo buffer must hold exactly those transitions.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from policies import keys
from robot_rl import returns
from robot_rl.cli.main import main
from robot_rl.data.demo_buffer import (
    EpisodeEnds,
    demo_buffer,
    episode_transitions,
    load_demo_buffer,
    read_transitions,
)
from robot_rl.data.lerobot_format import DatasetError
from robot_rl.data.recorder import DatasetSpec, EpisodeRecorder, RecorderConfig

LENGTH = 32  # control steps: the expert lifts the cube in ~29, a flawed one runs into the time limit
GROUPS = (keys.POLICY, keys.CRITIC)


def tree_hash(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


class StepLog:
    """The real env, unchanged, logging what each step returned for every env (the ground truth)."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self.steps: list[dict[str, Any]] = []
        self._obs: dict[str, torch.Tensor] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        obs, info = self._env.reset(*args, **kwargs)
        self._obs = {g: obs[g].clone() for g in GROUPS}
        return obs, info

    def step(self, action: torch.Tensor, actor: Any = None) -> Any:
        obs, reward, terminated, truncated, info = self._env.step(action, actor)
        self.steps.append({"obs": self._obs, "action": info[keys.APPLIED_ACTION].clone(), "reward": reward.clone(),
                           "terminated": terminated.clone(), "truncated": truncated.clone(),
                           "next_obs": {g: info[keys.FINAL_OBS][g].clone() for g in GROUPS}})
        self._obs = {g: obs[g].clone() for g in GROUPS}
        return obs, reward, terminated, truncated, info

    def episodes(self) -> list[list[dict[str, Any]]]:
        """Every finished episode of every env, as its list of transitions."""
        n = self._env.num_envs
        running: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        done_eps = []
        for s in self.steps:
            for i in range(n):
                running[i].append({k: ({g: v[i] for g, v in s[k].items()} if isinstance(s[k], dict) else s[k][i])
                                   for k in s})
                if bool(s["terminated"][i] | s["truncated"][i]):
                    done_eps.append(running[i])
                    running[i] = []
        return done_eps


@pytest.fixture(scope="module")
def lift_demos(tmp_path_factory):
    """Six short so101_lift episodes of the scripted expert (quality 0.85: some lift the cube and end, some run into
    the time limit), two envs, no cameras, recorded with ``env_state=true``'s columns."""
    from robot_rl.cli.collect import ExpertActor, env_state_columns, record
    from sim.config import SimConfig
    from sim.experts import make_expert
    from sim.lerobot_view import LeRobotView
    from sim.registry import make_env, task_config
    from sim.so101 import LEROBOT_STATE_NAMES

    root = tmp_path_factory.mktemp("demos") / "lift"
    env = make_env("so101_lift", SimConfig(num_envs=2, num_threads=1),
                   task_config("so101_lift", {"episode_length": LENGTH, "cameras": []}))
    with env:
        log = StepLog(env)
        view = LeRobotView(log, cameras=(), image_size=(32, 32))
        cols = env_state_columns(env)
        vectors = {**{c: env.obs_spec.shapes[g][0] for c, g in cols.items()}, keys.ENV_ACTION_COL: env.action_dim}
        spec = DatasetSpec(round(1 / env.control_dt), LEROBOT_STATE_NAMES, {}, vectors=vectors)
        recorder = EpisodeRecorder(RecorderConfig(root=str(root)), spec, env.num_envs, env.max_episode_length)
        out = record(view, ExpertActor(view, make_expert(env, quality=0.85, seed=1)), recorder, 6, seed=1,
                     env_state=cols)
        recorder.close()
        dims = {g: env.obs_spec.shapes[g][0] for g in GROUPS}
    return root, log.episodes(), out, dims


def _expected(episode: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The env's transitions of one episode as a demo buffer must hold them: a time-out's last transition (its o'
    is not in the dataset) dropped, the one before it truncated."""
    if bool(episode[-1]["terminated"]):
        return episode
    kept = [dict(t) for t in episode[:-1]]
    kept[-1]["truncated"] = torch.tensor(True)
    return kept


def test_the_demo_buffer_holds_exactly_the_recorded_transitions(lift_demos):
    root, truth, out, dims = lift_demos
    buffer, tr = load_demo_buffer(root, dims, 6, EpisodeEnds(LENGTH, terminate_on_success=True))
    assert tr.num_episodes == 6 and tr.action_source == keys.ENV_ACTION_COL
    ends = [bool(ep[-1]["terminated"]) for ep in truth]
    assert any(ends) and not all(ends), "the fixture should hold both successes and time-outs"
    assert tr.num_successes == out["successes"] == sum(ends)
    first_obs = [ep[0]["obs"][keys.POLICY] for ep in truth]
    seen = 0
    for e in torch.unique(tr.episode).tolist():
        rows = torch.nonzero(tr.episode == e).flatten()
        match = [i for i, o in enumerate(first_obs) if torch.equal(o, tr.obs[keys.POLICY][rows[0]])]
        assert len(match) == 1, f"dataset episode {e} matches no (or several) env episodes"
        want = _expected(truth[match[0]])
        assert len(rows) == len(want), e
        for j, (r, w) in enumerate(zip(rows.tolist(), want, strict=True)):
            for g in GROUPS:
                assert torch.equal(tr.obs[g][r], w["obs"][g]), (e, j, g)
                if not bool(w["terminated"]):  # a terminal's o' is never read (discount 0)
                    assert torch.equal(tr.next_obs[g][r], w["next_obs"][g]), (e, j, g)
            assert torch.equal(tr.action[r], w["action"]), (e, j)
            assert tr.reward[r] == w["reward"], (e, j)
            assert bool(tr.terminated[r]) == bool(w["terminated"]) and bool(tr.truncated[r]) == bool(w["truncated"])
            assert int(tr.frame[r]) == j
        seen += 1
    assert seen == 6
    # the buffer: one column of M rows, exactly full, in the transitions' order
    assert buffer.num_envs == 1 and buffer.size == buffer.rows == len(tr) and buffer.pos == 0
    for g in GROUPS:
        assert torch.equal(buffer.obs[g][:, 0], tr.obs[g]) and torch.equal(buffer.next_obs[g][:, 0], tr.next_obs[g])
    assert torch.equal(buffer.action[:, 0], tr.action) and torch.equal(buffer.reward[:, 0], tr.reward)
    assert torch.equal(buffer.terminated[:, 0], tr.terminated) and torch.equal(buffer.truncated[:, 0], tr.truncated)
    # who acted, from the dataset's actor column: collect records the scripted expert as the person demonstrating
    assert tr.actor is not None and bool((tr.actor == keys.ACTOR_HUMAN).all())
    assert torch.equal(buffer.actor[:, 0], tr.actor)


def test_lerobots_degree_targets_convert_to_the_applied_actions(lift_demos):
    """A dataset without ``env_action`` gets its actions from LeRobot's degree targets and the recorded joints
    (``robot_rl.cli.build.target_to_env_action``, what ``sim.lerobot_view`` does when it steps): on this noise-free
    env that is the applied action back, to float32 rounding of degrees."""
    from robot_rl.cli.build import target_to_env_action
    from robot_rl.data.lerobot_format import read_frames, read_meta
    from sim.config import SimConfig
    from sim.registry import make_env, task_config

    root, *_ = lift_demos
    meta = read_meta(root)
    cols = read_frames(meta, meta.episodes["episode_index"], [keys.OBS_STATE, keys.ACTION_COL, keys.ENV_ACTION_COL]
                       ).columns
    with make_env("so101_lift", SimConfig(num_envs=1, num_threads=1), task_config("so101_lift")) as env:
        convert = target_to_env_action(env)
        got = convert(torch.as_tensor(cols[keys.OBS_STATE]), torch.as_tensor(cols[keys.ACTION_COL]))
    want = torch.as_tensor(cols[keys.ENV_ACTION_COL])
    assert got.shape == want.shape == (len(want), 6)
    assert float((got - want).abs().max()) < 1e-4
    assert float(want.abs().mean()) > 0.05  # the expert moves: not a comparison of zeros


def test_the_ends_of_episodes_follow_the_envs_rules():
    """Hand-made: A (3 frames, success at frame 1), B (4 frames = the limit, no success), C (2 frames, no success,
    ended early: a failure), D (1 frame = a limit of 1... here a one-frame time-out under a limit of 1)."""
    episode = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2])
    success = np.array([0, 1, 1, 0, 0, 0, 0, 0, 0], bool)
    start = np.array([0, 0, 0, 3, 3, 3, 3, 7, 7])
    end = np.array([2, 2, 2, 6, 6, 6, 6, 8, 8])
    rows, nxt, term, trunc = episode_transitions(episode, success, start, end, EpisodeEnds(4, True))
    assert rows.tolist() == [0, 1, 3, 4, 5, 7, 8]  # A cut at its success; B's last frame dropped (no o')
    assert nxt.tolist() == [1, 1, 4, 5, 6, 8, 8]  # terminals point at themselves (never read)
    assert term.tolist() == [False, True, False, False, False, False, True]
    assert trunc.tolist() == [False, False, False, False, True, False, False]
    # success does not end episodes: A runs to its end (3 < 4 frames: a termination), frames after success kept
    rows, nxt, term, trunc = episode_transitions(episode, success, start, end, EpisodeEnds(4, False))
    assert rows.tolist() == [0, 1, 2, 3, 4, 5, 7, 8] and term.tolist() == [0, 0, 1, 0, 0, 0, 0, 1]
    # a one-frame time-out gives no transition
    rows, *_ = episode_transitions(np.array([0]), np.array([False]), np.array([0]), np.array([0]), EpisodeEnds(1))
    assert rows.tolist() == []


def test_n_step_targets_stop_at_each_demo_episodes_end(lift_demos):
    """n-step windows in the demo buffer never run from one episode into the next: every sampled discount is
    γ^m with m up to the episode's end, and 0 only where a terminal was reached."""
    root, _, _, dims = lift_demos
    tr = read_transitions(root, dims, 6, EpisodeEnds(LENGTH))
    buf = demo_buffer(tr)
    torch.manual_seed(0)
    batch = buf.sample(512, n_step=3, gamma=0.5)
    assert set(torch.round(batch["discount"], decimals=6).tolist()) <= {0.0, 0.5, 0.25, 0.125}
    # every transition that ends an episode, sampled as a window start, has a 1-step window
    ends = torch.nonzero(tr.terminated | tr.truncated).flatten()
    for k in ends.tolist():
        want = 0.0 if bool(tr.terminated[k]) else 0.5
        w = slice(k, k + 3)  # rows of the one-column buffer are the transitions' indices
        ret, disc, _ = returns.nstep_targets(buf.reward[w, 0][None], buf.terminated[w, 0][None],
                                             buf.truncated[w, 0][None], torch.ones(1, min(3, len(tr) - k), dtype=bool),
                                             0.5)
        assert float(ret) == float(tr.reward[k]) and float(disc) == want, k


def _stateless_dataset(root: Path) -> None:
    """A real two-episode dataset in LeRobot's frame only (what ``robot-rl collect`` writes by default)."""
    spec = DatasetSpec(30, tuple(f"j{i}.pos" for i in range(6)))
    with EpisodeRecorder(RecorderConfig(root=str(root)), spec, 1, 8) as rec:
        for t in range(6):
            frame = {keys.OBS_STATE: torch.full((1, 6), float(t)), keys.TASK: ["lift"]}
            rec.add(frame, torch.zeros(1, 6), torch.tensor([0.5]), torch.tensor([t == 2]), torch.tensor([t in (2, 5)]))


def test_a_dataset_without_the_env_state_is_refused_naming_it_and_how_to_record_it(tmp_path, lift_demos):
    root = tmp_path / "plain"
    _stateless_dataset(root)
    with pytest.raises(DatasetError) as e:
        read_transitions(root, {keys.POLICY: 33}, 6, EpisodeEnds(150))
    msg = str(e.value)
    assert keys.ENV_STATE_COL in msg and "env_state=true" in msg and keys.ENV_ACTION_COL in msg and str(root) in msg
    demos, _, _, dims = lift_demos
    with pytest.raises(DatasetError, match=r"'observation.environment_state' holds \[33\] values per frame, the env's "
                                           r"'policy' observation 30"):
        read_transitions(demos, {**dims, keys.POLICY: 30}, 6, EpisodeEnds(LENGTH))
    with pytest.raises(DatasetError, match=r"'env_action' holds \[6\] values per frame, the env's actions 7"):
        read_transitions(demos, dims, 7, EpisodeEnds(LENGTH))


def test_a_dataset_without_env_action_gets_its_actions_converted_from_lerobots(tmp_path):
    """Hand-made real dataset: env state [t, -t], joints t degrees, targets t + 1; episode 0 (frames 0-2) succeeds
    at its last frame, episode 1 (frames 0-2, t = 3..5) runs into a time limit of 3."""
    root = tmp_path / "noaction"
    spec = DatasetSpec(30, tuple(f"j{i}.pos" for i in range(6)), vectors={keys.ENV_STATE_COL: 2})
    with EpisodeRecorder(RecorderConfig(root=str(root)), spec, 1, 8) as rec:
        for t in range(6):
            frame = {keys.OBS_STATE: torch.full((1, 6), float(t)), keys.TASK: ["lift"]}
            rec.add(frame, torch.full((1, 6), t + 1.0), torch.tensor([float(t)]), torch.tensor([t == 2]),
                    torch.tensor([t in (2, 5)]), extras={keys.ENV_STATE_COL: torch.tensor([[t, -t]], dtype=torch.float)})
    with pytest.raises(DatasetError, match="env_action"):
        read_transitions(root, {keys.POLICY: 2}, 6, EpisodeEnds(3))
    tr = read_transitions(root, {keys.POLICY: 2}, 6, EpisodeEnds(3), to_env_action=lambda s, a: (a - s) / 2)
    assert tr.action_source == "action (converted)" and tr.num_episodes == 2 and tr.num_successes == 1
    assert tr.obs[keys.POLICY][:, 0].tolist() == [0, 1, 2, 3, 4]  # frame 5 (a time-out's last) dropped
    assert tr.next_obs[keys.POLICY][:, 0].tolist() == [1, 2, 2, 4, 5]
    assert tr.reward.tolist() == [0, 1, 2, 3, 4] and torch.equal(tr.action, torch.full((5, 6), 0.5))
    assert tr.terminated.tolist() == [False, False, True, False, False]
    assert tr.truncated.tolist() == [False, False, False, False, True]


def test_a_next_done_before_an_episodes_last_frame_is_refused(tmp_path):
    """Written by LeRobot's own API: ``next.done`` set at frame 1 of a 3-frame episode."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    vec = {"dtype": "float32", "shape": (2,), "names": None}
    flag = {"dtype": "bool", "shape": (1,), "names": None}
    feats = {keys.ENV_STATE_COL: vec, keys.ENV_ACTION_COL: vec, keys.REWARD_COL: {**flag, "dtype": "float32"},
             keys.SUCCESS_COL: flag, keys.DONE_COL: flag}
    ds = LeRobotDataset.create("local/done", 30, feats, root=tmp_path / "done", use_videos=False)
    for t in range(3):
        ds.add_frame({keys.ENV_STATE_COL: np.zeros(2, np.float32), keys.ENV_ACTION_COL: np.zeros(2, np.float32),
                      keys.REWARD_COL: np.zeros(1, np.float32), keys.SUCCESS_COL: np.array([False]),
                      keys.DONE_COL: np.array([t >= 1]), keys.TASK: "x"})
    ds.save_episode()
    ds.finalize()
    with pytest.raises(DatasetError, match=r"episode 0: 'next.done' is True at frame 1, but that frame is not the "):
        read_transitions(tmp_path / "done", {keys.POLICY: 2}, 2, EpisodeEnds(10))


def test_the_recorder_requires_exactly_its_extra_columns(tmp_path):
    spec = DatasetSpec(30, tuple(f"j{i}.pos" for i in range(6)), vectors={keys.ENV_STATE_COL: 3})
    with EpisodeRecorder(RecorderConfig(root=str(tmp_path / "d")), spec, 1, 8) as rec:
        frame = {keys.OBS_STATE: torch.zeros(1, 6), keys.TASK: ["x"]}
        args = (frame, torch.zeros(1, 6), torch.zeros(1), torch.zeros(1, dtype=torch.bool))
        with pytest.raises(ValueError, match="extras must hold exactly"):
            rec.add(*args, torch.ones(1, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"observation.environment_state has shape \(1, 4\)"):
            rec.add(*args, torch.ones(1, dtype=torch.bool), extras={keys.ENV_STATE_COL: torch.zeros(1, 4)})
        with pytest.raises(ValueError, match="not finite"):
            rec.add(*args, torch.ones(1, dtype=torch.bool), extras={keys.ENV_STATE_COL: torch.full((1, 3), np.nan)})


def test_robot_rl_train_with_a_demo_dataset_end_to_end_leaves_it_untouched(lift_demos, tmp_path, capsys):
    root, _, _, _ = lift_demos
    before = tree_hash(root)
    run = tmp_path / "run"
    small = ["task=so101_lift", "algo=flashsac", f"task.episode_length={LENGTH}", "sim.num_envs=2",
             "sim.num_threads=1", "algo.learning_starts=64", "algo.batch_size=32", "algo.steps_per_iteration=16",
             "eval.enabled=false", "logger.progress=false", "logger.tensorboard=false"]
    assert main(["train", *small, f"demo_dataset.root={root}", "total_steps=320", f"run_dir={run}"]) == 0
    err = capsys.readouterr().err
    assert "demo buffer: " in err and "from 6 episodes" in err and "trained 320 env steps" in err
    assert tree_hash(root) == before  # the source is only read
    assert (run / "checkpoints").is_dir()


def test_bad_demo_settings_fail_before_a_run_folder_is_written(lift_demos, tmp_path, capsys):
    root, _, _, _ = lift_demos
    plain = tmp_path / "plain"
    _stateless_dataset(plain)
    before = tree_hash(plain)
    base = ["task=so101_lift", "sim.num_envs=2", "sim.num_threads=1", "logger.progress=false",
            "logger.tensorboard=false"]
    cases = [(["algo=flashsac", f"demo_dataset.root={plain}"], "env_state=true"),
             (["algo=flashsac", f"demo_dataset.rot={root}"], "demo_dataset.rot"),
             (["algo=ppo", f"demo_dataset.root={root}"], "off-policy learners"),
             (["algo=flashsac", f"demo_dataset.root={tmp_path / 'nowhere'}"], "does not exist")]
    for i, (extra, message) in enumerate(cases):
        run = tmp_path / f"run{i}"
        assert main(["train", *base, *extra, f"run_dir={run}"]) == 2, extra
        assert message in capsys.readouterr().err, extra
        assert not run.exists(), extra
    assert tree_hash(plain) == before
