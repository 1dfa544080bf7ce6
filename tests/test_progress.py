"""Dense rewards from a progress model (``robot_rl.rewards.progress``, ``robot-rl progress``, ``robot-rl train
reward.progress=``): targets by hand, a model trained on a real dataset recorded by ``robot-rl collect``, its files,
its errors, and the shaping it drives in a real training run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from policies import keys
from robot_rl.cli.main import main
from robot_rl.data.lerobot_format import DatasetError
from robot_rl.data.recorder import COMMIT_FILE, INFO_PATH
from robot_rl.rewards import ShapedEnv
from robot_rl.rewards.progress import (
    WEIGHTS_FILE,
    ProgressConfig,
    ProgressFileError,
    fit_progress,
    kept_features,
    load_progress,
    progress_targets,
    read_progress_data,
    split_episodes,
)

SPARSE = [f"task.reward_weights.{k}=0" for k in ("reach", "grasp", "lift", "pads", "near")]


def tree_hash(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_targets_by_hand():
    # episode 7: solved at frame 4 and after; episode 9: never solved
    episode = np.array([7, 7, 7, 7, 7, 7, 9, 9, 9])
    frame = np.array([0, 1, 2, 3, 4, 5, 0, 1, 2])
    success = np.array([0, 0, 0, 0, 1, 1, 0, 0, 0], dtype=bool)
    np.testing.assert_allclose(progress_targets(episode, frame, success, 0.0),
                               [0, 0.25, 0.5, 0.75, 1, 1, 0, 0, 0])
    np.testing.assert_allclose(progress_targets(episode, frame, success, 0.2)[6:], [0.2] * 3)
    assert np.isnan(progress_targets(episode, frame, success, None)[6:]).all()
    # solved at its first frame: complete throughout
    np.testing.assert_allclose(progress_targets(np.array([3, 3]), np.array([0, 1]), np.array([1, 0], dtype=bool)),
                               [1, 1])
    # time to go over a horizon of 8 steps: 1 - (4 - t) / 8; and clipped at 0 for a horizon shorter than the way
    np.testing.assert_allclose(progress_targets(episode, frame, success, 0.0, horizon=8),
                               [0.5, 0.625, 0.75, 0.875, 1, 1, 0, 0, 0])
    np.testing.assert_allclose(progress_targets(episode, frame, success, 0.0, horizon=2)[:6], [0, 0, 0, 0.5, 1, 1])


def test_kept_features_by_name():
    names = ["joint_pos.0", "joint_pos.1", "cube_pos.0", "cube_pos.1", "last_action.0"]
    assert kept_features(names, ["joint_pos", "last_action"]) == [2, 3]
    assert kept_features(names, ["joint_vel"]) == [0, 1, 2, 3, 4]  # a part the column lacks excludes nothing
    assert kept_features(names, []) == [0, 1, 2, 3, 4]
    with pytest.raises(DatasetError, match="names no features.*exclude_parts=\\[\\]"):
        kept_features(None, ["joint_pos"])
    with pytest.raises(DatasetError, match="leaves none"):
        kept_features(names, ["joint_pos", "cube_pos", "last_action"])


@pytest.fixture(scope="module")
def lift_data(tmp_path_factory):
    """so101_lift episodes of the scripted expert (quality 0.85: some time out), env state recorded, no cameras."""
    root = tmp_path_factory.mktemp("progress") / "lift"
    assert main(["collect", "task=so101_lift", "episodes=24", f"dataset.root={root}", "env_state=true",
                 "task.cameras=[]", "task.episode_length=60", "quality=0.85", "seed=3", "progress=false",
                 "sim.num_envs=8"]) == 0
    return root


def test_a_model_trained_on_collected_demos_rises_along_held_out_episodes(lift_data, tmp_path):
    before = tree_hash(lift_data)
    data = read_progress_data(lift_data)
    assert data.succeeded.any() and not data.succeeded.all(), "the fixture should hold successes and failures"
    # collect names the env state's features by the task's parts; the default horizon is the slowest success
    assert data.names[:2] == ["joint_pos.0", "joint_pos.1"] and len(data.names) == data.state.shape[1]
    firsts = [int(data.frame[data.episode == e][data.target[data.episode == e] == 1.0].min())
              for e in np.unique(data.episode[data.succeeded])]
    assert data.horizon == max(firsts) and data.target[data.succeeded].min() == 0.0
    train, held = split_episodes(data, 0.25, seed=0)
    won = np.unique(data.episode[data.succeeded])
    assert len(np.unique(data.episode[held])) == round(0.25 * len(won)) and data.succeeded[held].all()
    assert not (train & held).any() and (train | held).all()
    model, report = fit_progress(lift_data, ProgressConfig(steps=600, holdout=0.25, seed=0))
    assert report["held_out_voc"] > 0.6, report  # an untrained one scores near 0
    assert report["parts_read"] == ["grasp_pos", "cube_pos", "cube_rel", "cube_quat", "pad_contacts"]
    assert model.keep == [i for i, n in enumerate(data.names) if n.split(".")[0] in report["parts_read"]]
    assert tree_hash(lift_data) == before  # only read
    # it scores the frames of a solved episode near its end above those near its start
    ep = int(won[0])
    rows = data.episode == ep
    phi = model(torch.as_tensor(data.state[rows])).detach().numpy()
    assert phi[-3:].mean() > phi[:3].mean() + 0.3
    # saved and loaded, it gives the same numbers; a damaged file is refused by name
    model.save(tmp_path / "m")
    again = load_progress(tmp_path / "m")
    x = torch.as_tensor(data.state[:50])
    assert torch.equal(model(x), again(x)) and again.metrics["held_out_voc"] == report["held_out_voc"]
    (tmp_path / "m" / WEIGHTS_FILE).write_bytes(b"\x00" * 10)
    with pytest.raises(ProgressFileError, match=WEIGHTS_FILE):
        load_progress(tmp_path / "m")


def test_states_moved_off_the_demonstrations_score_low(lift_data):
    cfg = {"steps": 600, "holdout": 0.0, "seed": 0}
    plain, _ = fit_progress(lift_data, ProgressConfig(perturb_fraction=0.0, **cfg))
    perturbed, _ = fit_progress(lift_data, ProgressConfig(**cfg))
    data = read_progress_data(lift_data)
    gen = torch.Generator().manual_seed(1)
    x = torch.as_tensor(data.state)
    far = x + 2.0 * x.std(0) * torch.randn(x.shape, generator=gen)
    on = torch.as_tensor(data.succeeded & (data.target > 0.9))
    with torch.no_grad():
        assert float(perturbed(far).mean()) < 0.5 * float(plain(far).mean())
        assert float(perturbed(x[on]).mean()) > 0.7


def test_a_dataset_without_the_env_state_or_any_success_is_refused(tmp_path):
    plain = tmp_path / "plain"
    assert main(["collect", "task=so101_lift", "episodes=2", f"dataset.root={plain}", "task.cameras=[]",
                 "progress=false", "sim.num_envs=2"]) == 0
    with pytest.raises(DatasetError, match=r"observation\.environment_state.*env_state=true"):
        read_progress_data(plain)
    failed = tmp_path / "failed"
    assert main(["collect", "task=so101_lift", "episodes=2", f"dataset.root={failed}", "task.cameras=[]",
                 "env_state=true", "task.episode_length=5", "progress=false", "sim.num_envs=2"]) == 0
    with pytest.raises(DatasetError, match="no successful episode"):
        read_progress_data(failed)


def test_robot_rl_progress_then_train_with_its_shaping(lift_data, tmp_path, capsys):
    out = tmp_path / "prog"
    assert main(["progress", f"dataset.root={lift_data}", f"run_dir={out}", "steps=300", "progress=false"]) == 0
    meta = json.loads((out / "progress.json").read_text())
    assert meta["obs_column"] == keys.ENV_STATE_COL and meta["metrics"]["frames"] > 0
    assert (out / "progress.png").stat().st_size > 0
    run = tmp_path / "run"
    assert main(["train", "task=so101_lift", "algo=ppo", "sim.num_envs=16", "algo.num_steps=16", "total_steps=512",
                 *SPARSE, f"reward.progress={out}", "reward.scale=5", "eval.enabled=false", "logger.progress=false",
                 f"run_dir={run}"]) == 0
    assert (run / "checkpoints").is_dir()
    # the run's env pays the task's (sparse) reward + 5 (γ Φ(o') − Φ(o)), Φ the saved model
    from robot_rl.cli.build import build_training, compose

    built = build_training(compose("train", ["task=so101_lift", "algo=ppo", "sim.num_envs=16", *SPARSE,
                                             f"reward.progress={out}", "reward.scale=5", "logger.progress=false",
                                             f"run_dir={tmp_path / 'built'}"]))
    try:
        assert isinstance(built.env, ShapedEnv) and built.runner.env is built.env
        model = load_progress(out)
        obs, _ = built.env.reset(seed=0)
        phi = model.potential(obs)
        nxt, reward, terminated, truncated, _ = built.env.step(torch.zeros(16, built.env.action_dim))
        assert not (terminated | truncated).any()
        expected = 5.0 * (built.algo.cfg.gamma * model.potential(nxt) - phi)
        torch.testing.assert_close(reward, expected, rtol=1e-5, atol=1e-6)
        assert float(expected.abs().max()) > 0
    finally:
        built.close()
    # a model of another task's observation is refused before a run folder is made
    capsys.readouterr()
    assert main(["train", "task=so101_reach", "algo=ppo", f"reward.progress={out}", "eval.enabled=false",
                 f"run_dir={tmp_path / 'reach'}"]) == 2
    err = capsys.readouterr().err
    assert f"reads {meta['obs_dim']} values" in err and "env_state=true" in err
    assert not (tmp_path / "reach").exists()
    assert main(["train", "task=so101_lift", "algo=ppo", f"reward.progress={tmp_path / 'none'}",
                 "eval.enabled=false", f"run_dir={tmp_path / 'none_run'}"]) == 2
    assert "robot-rl progress" in capsys.readouterr().err


def test_an_episode_ends_scored_with_its_own_instruction():
    """so101_pick changes its instruction every episode: with a potential of the instruction alone and γ = 1 every
    shaping term is 0, also where an auto-reset brings a new instruction (scoring the finished episode's last frame
    with the next one's would not be)."""
    from sim.config import SimConfig
    from sim.registry import make_env, task_config

    env = make_env("so101_pick", SimConfig(num_envs=4, num_threads=1, seed=0),
                   task_config("so101_pick", {"episode_length": 4, "cameras": []}))

    def potential(obs, instructions):
        assert len(instructions) == 4
        return torch.tensor([float("red" in t) for t in instructions])

    rewards = []

    class Inner:  # the real env, its own rewards kept
        def __getattr__(self, name):
            return getattr(env, name)

        def step(self, action, actor=None):
            out = env.step(action, actor)
            rewards.append(out[1].clone())
            return out

    shaped = ShapedEnv(Inner(), potential, gamma=1.0, scale=1.0, reads_instructions=True)
    shaped.reset(seed=0)
    changed = ended = 0
    for _ in range(12):
        before = list(env.instructions)
        _, reward, terminated, truncated, _ = shaped.step(torch.zeros(4, env.action_dim))
        assert torch.equal(reward, rewards[-1])  # every term 0
        ended += int((terminated | truncated).sum())
        changed += sum(a != b for a, b in zip(before, env.instructions, strict=True))
    assert ended > 0 and changed > 0
    env.close()


def test_appending_to_a_dataset_recorded_before_features_were_named(lift_data, tmp_path):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(lift_data, old)
    info = json.loads((old / INFO_PATH).read_text())
    commit = json.loads((old / COMMIT_FILE).read_text())  # the recorder's record of its last whole write
    for col in (keys.ENV_STATE_COL, keys.ENV_CRITIC_STATE_COL):  # as robot-rl collect wrote them before
        info["features"][col]["names"] = commit["info"]["features"][col]["names"] = None
    (old / INFO_PATH).write_text(json.dumps(info, indent=4))
    (old / COMMIT_FILE).write_text(json.dumps(commit))
    assert main(["collect", "task=so101_lift", "episodes=2", f"dataset.root={old}", "dataset.append=true",
                 "env_state=true", "task.cameras=[]", "task.episode_length=60", "progress=false",
                 "sim.num_envs=2"]) == 0
    data = read_progress_data(old)
    assert data.names is None and len(np.unique(data.episode)) == 26
    with pytest.raises(DatasetError, match="exclude_parts"):
        fit_progress(old, ProgressConfig(steps=10))
    model, _ = fit_progress(old, ProgressConfig(steps=10, exclude_parts=[]))
    assert model.keep == list(range(data.state.shape[1]))


def test_a_nan_state_is_refused_naming_its_episode_and_frame(lift_data, tmp_path):
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad"
    shutil.copytree(lift_data, bad)
    path = min((bad / "data").rglob("*.parquet"))
    table = pq.read_table(path)
    col = table.column(keys.ENV_STATE_COL).to_pylist()
    col[7][3] = float("nan")
    i = table.schema.get_field_index(keys.ENV_STATE_COL)
    table = table.set_column(i, table.schema.field(i), pa.array(col, type=table.schema.field(i).type))
    pq.write_table(table, path)
    ep, frame = table.column("episode_index")[7].as_py(), table.column("frame_index")[7].as_py()
    with pytest.raises(DatasetError, match=f"episode {ep} .*'{keys.ENV_STATE_COL}' is NaN .* at frame {frame}"):
        read_progress_data(bad)


def test_a_model_of_several_instructions_tells_them_apart_and_shapes_so101_pick(tmp_path):
    """so101_pick's episodes each name a cube: the model embeds the instruction, and frames paired with another one
    (the synthesized failures) score low; a training run's env calls it with each env's instruction."""
    root = tmp_path / "pick"
    assert main(["collect", "task=so101_pick", "episodes=18", f"dataset.root={root}", "env_state=true",
                 "task.cameras=[]", "progress=false", "sim.num_envs=6", "seed=2"]) == 0
    model, report = fit_progress(root, ProgressConfig(steps=800, holdout=0.0, seed=0))
    data = read_progress_data(root)
    assert len(model.tasks) >= 2 and model.embed is not None and len(report["tasks"]) == len(model.tasks)
    late = torch.as_tensor(data.succeeded & (data.target > 0.8))
    x, own = torch.as_tensor(data.state)[late], torch.as_tensor(data.task)[late]
    other = (own + 1) % len(model.tasks)
    with torch.no_grad():
        assert float(model(x, own).mean()) > float(model(x, other).mean()) + 0.4
    with pytest.raises(ValueError, match="knows the instructions"):
        model.task_index(["pick up the purple cube"])
    out = tmp_path / "model"
    model.save(out)
    from robot_rl.cli.build import build_training, compose

    built = build_training(compose("train", ["task=so101_pick", "algo=ppo", "sim.num_envs=4", f"reward.progress={out}",
                                             "logger.progress=false", f"run_dir={tmp_path / 'run'}"]))
    try:
        assert isinstance(built.env, ShapedEnv) and built.env.reads_instructions
        obs, _ = built.env.reset(seed=0)
        expected = load_progress(out).potential(obs, list(built.env.instructions))
        torch.testing.assert_close(built.env.phi, expected)
    finally:
        built.close()
