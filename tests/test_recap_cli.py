"""``robot-rl offline algo=recap|awr`` end to end: the dataset is byte-for-byte untouched after a failed and a
successful run, a dataset without ``next.success`` is refused before any training (naming the column and how to add
it), a recording in the schema of LeRobot's HIL-SERL recorder labels its outcomes from ``next.reward`` or from named
episodes, the export carries β and acts without the value model, and a tiny dataset recorded by ``robot-rl collect``
trains and evaluates."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from policies import keys, load_policy
from policies.flow_vla import CONDITION_KEY
from robot_rl.algos.recap import indicator_weights
from robot_rl.checkpoint import POLICY_DIR, load_checkpoint
from robot_rl.cli.main import main
from robot_rl.data.labels import read_sidecar
from robot_rl.data.lerobot_format import read_meta
from tests.test_lerobot_loader import JOINTS, make_dataset, tree_hash
from tests.test_offline_cli import TINY

TINY_VALUE = ["algo.value.steps=4", "algo.value.batch_size=8", "algo.value.model.conv_channels=[8,8]",
              "algo.value.model.conv_strides=[2,2]", "algo.value.model.image_feature_dim=16",
              "algo.value.model.hidden_dim=32", "algo.value.model.text_dim=8", "algo.labels.n_step=3"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("recap") / "so101_demo")


def _no_success_dataset(root: Path) -> Path:
    """A LeRobot dataset (LeRobot's own writer) with state, action and one camera but no outcome column."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {keys.OBS_STATE: {"dtype": "float32", "shape": (6,), "names": JOINTS},
                keys.ACTION_COL: {"dtype": "float32", "shape": (6,), "names": JOINTS},
                keys.lerobot_image_key("front"): {"dtype": "image", "shape": (16, 16, 3),
                                                  "names": ["height", "width", "channels"]}}
    ds = LeRobotDataset.create("local/" + root.name, fps=30, features=features, root=root, use_videos=False)
    for _ in range(2):
        for i in range(10):
            ds.add_frame({keys.OBS_STATE: np.full(6, i, np.float32), keys.ACTION_COL: np.full(6, i + 1, np.float32),
                          keys.lerobot_image_key("front"): np.zeros((16, 16, 3), np.uint8), "task": "lift the cube"})
        ds.save_episode()
    ds.finalize()
    return root


def _offline(algo: str, root: Path, run_dir: Path, *extra: str) -> int:
    value = TINY_VALUE if algo != "bc" else []
    return main(["offline", f"algo={algo}", f"dataset.root={root}", f"run_dir={run_dir}", *TINY, *value, *extra])


def test_a_dataset_without_next_success_fails_before_training_and_stays_untouched(tmp_path, capsys):
    root = _no_success_dataset(tmp_path / "no_success")
    before = tree_hash(root)
    for algo in ("recap", "awr"):
        code = _offline(algo, root, tmp_path / algo, "steps=2")
        err = capsys.readouterr().err
        assert code == 2, err
        assert "'next.success'" in err and "add_features" in err and "robot-rl collect" in err, err
        assert "HIL-SERL" not in err  # that hint only where the dataset has next.reward to read instead
        assert not (tmp_path / algo).exists()  # refused before anything was trained or written
    assert tree_hash(root) == before
    assert _offline("bc", root, tmp_path / "bc", "steps=2") == 0  # BC needs no outcome
    assert tree_hash(root) == before


def _hil_serl_dataset(root: Path) -> Path:
    """A dataset in the schema of LeRobot's HIL-SERL recorder (lerobot/rl/gym_manipulator.py, mode=record), written
    with LeRobot's own API: end-effector delta actions, unnamed state, channels-first video, ``next.reward`` 1.0 on
    the frame success is flagged, ``next.done``, the discrete gripper penalty; no ``next.success``. Episodes 0 and 2
    succeed (12 and 15 frames), 1 and 3 fail (9 and 10). Plus the learner's saved replay buffer's
    ``complementary_info.is_intervention`` (0.0 / 1.0): a human took over frames 4-6 of episode 1."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    cam = {"dtype": "video", "shape": (3, 32, 32), "names": ["channels", "height", "width"]}
    features = {keys.ACTION_COL: {"dtype": "float32", "shape": (4,), "names": ["delta_x", "delta_y", "delta_z",
                                                                             "gripper"]},
                keys.REWARD_COL: {"dtype": "float32", "shape": (1,), "names": None},
                "next.done": {"dtype": "bool", "shape": (1,), "names": None},
                "complementary_info.discrete_penalty": {"dtype": "float32", "shape": (1,),
                                                        "names": ["discrete_penalty"]},
                "complementary_info.is_intervention": {"dtype": "float32", "shape": (1,), "names": None},
                keys.OBS_STATE: {"dtype": "float32", "shape": (18,), "names": None},
                keys.lerobot_image_key("front"): cam}
    ds = LeRobotDataset.create("local/" + root.name, fps=10, features=features, root=root, use_videos=True)
    rng = np.random.default_rng(0)
    for e, (length, ok) in enumerate(((12, True), (9, False), (15, True), (10, False))):
        for i in range(length):
            last = i == length - 1
            ds.add_frame({keys.OBS_STATE: rng.normal(size=18).astype(np.float32),
                          keys.lerobot_image_key("front"): rng.integers(0, 255, (3, 32, 32), dtype=np.uint8),
                          keys.ACTION_COL: rng.normal(size=4).astype(np.float32),
                          keys.REWARD_COL: np.array([float(ok and last)], np.float32), "next.done": np.array([last]),
                          "complementary_info.discrete_penalty": np.zeros(1, np.float32),
                          "complementary_info.is_intervention": np.array([float(e == 1 and 4 <= i <= 6)], np.float32),
                          "task": "pick up the cube"})
        ds.save_episode()
    ds.finalize()
    return root


def test_a_hil_serl_recording_labels_outcomes_from_next_reward_and_corrections_from_is_intervention(tmp_path, capsys):
    root = _hil_serl_dataset(tmp_path / "hil_serl")
    before = tree_hash(root)
    assert _offline("recap", root, tmp_path / "refused", "steps=2") == 2
    err = capsys.readouterr().err
    assert "no 'next.success' column" in err and "algo.labels.success_column=next.reward" in err, err
    assert "algo.labels.successful_episodes" in err and not (tmp_path / "refused").exists()
    # M = 15 (the longest episode): a success's targets -(frames to its last frame) / 15, a failure's -1
    expected = np.concatenate([-np.arange(11, -1, -1) / 15, -np.ones(9), -np.arange(14, -1, -1) / 15, -np.ones(10)])
    for algo, how in (("recap", "algo.labels.success_column=next.reward"),
                      ("awr", "algo.labels.successful_episodes=[0,2]"), ("awr", "algo.labels.failed_episodes=[1,3]")):
        run = tmp_path / how.split("=")[0].split(".")[-1]
        assert _offline(algo, root, run, "steps=2", how) == 0, capsys.readouterr().err
        err = capsys.readouterr().err
        assert "outcomes: 2 of 4 episodes succeed" in err and f"\n{algo}: labelled 46 frames" in err  # its own name
        assert "value scale M = 15 frames, the longest episode" in err  # M not given: which stands in, said
        labels, _ = read_sidecar(run / "labels")
        np.testing.assert_allclose(labels.value_target, expected, atol=1e-6, err_msg=how)
        assert not labels.intervention.any()  # no 'intervention' column: no corrections
    run = tmp_path / "corrections"
    assert _offline("recap", root, run, "steps=2", "algo.labels.success_column=next.reward",
                    "algo.labels.intervention_column=complementary_info.is_intervention") == 0
    assert ("outcomes: 2 of 4 episodes succeed (next.reward >= 0.5); 1 with complementary_info.is_intervention "
            "frames") in capsys.readouterr().err
    labels, _ = read_sidecar(run / "labels")
    taken_over = np.zeros(46, dtype=bool)
    taken_over[12 + 4:12 + 7] = True
    np.testing.assert_array_equal(labels.intervention, taken_over)
    assert labels.advantage_indicator[taken_over].all()  # corrections are forced positive
    assert _offline("awr", root, tmp_path / "bad_list", "steps=2", "algo.labels.successful_episodes=[0,7]") == 2
    assert "episodes [7]" in capsys.readouterr().err and not (tmp_path / "bad_list").exists()
    # outcomes that name no success (a real arm's recording: next.success false throughout) are refused, unwritten
    for how in ("algo.labels.successful_episodes=[]", "algo.labels.success_threshold=2.0"):
        assert _offline("recap", root, tmp_path / "no_success", "steps=2", "algo.labels.success_column=next.reward",
                        how) == 2
        err = capsys.readouterr().err
        assert "no episode of dataset" in err and "successful_episodes" in err, err
        assert not (tmp_path / "no_success").exists()
    # the success column read from the data files alone: refused before any video is decoded
    import robot_rl.data.lerobot_loader as loader

    def no_decoding(*a, **kw):
        raise AssertionError("the dataset was loaded (its videos decoded) before the refusal")

    original, loader.ChunkSampler.__init__ = loader.ChunkSampler.__init__, no_decoding
    try:
        assert _offline("recap", root, tmp_path / "no_success", "steps=2", "algo.labels.success_column=next.reward",
                        "algo.labels.success_threshold=2.0") == 2
    finally:
        loader.ChunkSampler.__init__ = original
    assert "no episode of dataset" in capsys.readouterr().err
    assert tree_hash(root) == before


def test_recap_on_a_mix_of_our_dataset_and_one_without_corrections(dataset, tmp_path, capsys):
    """dataset.mix: ours (intervention recorded) beside a lerobot-eval-like recording without the column; the labels
    cover both in one episode numbering, corrections come from ours alone, and neither dataset is written."""
    theirs = make_dataset(tmp_path / "theirs", lengths=[10, 18], without=(keys.INTERVENTION_COL,))
    before = {p: tree_hash(p) for p in (dataset, theirs)}
    run = tmp_path / "mixed"
    assert _offline("recap", dataset, run, "steps=2", f"dataset.mix=[{theirs}]") == 0, capsys.readouterr().err
    labels, _ = read_sidecar(run / "labels")
    assert len(labels.index) == 47 + 28 and sorted(set(labels.episode_index.tolist())) == [0, 1, 2, 3, 4]
    assert labels.intervention[:47].any() and not labels.intervention[47:].any()
    assert labels.value_target[47 + 9] == 0.0 and labels.value_target[-1] == 0.0  # theirs' episodes end solved
    # named episodes are checked against the one numbering before anything is written
    assert _offline("awr", dataset, tmp_path / "bad", "steps=2", f"dataset.mix=[{theirs}]",
                    "algo.labels.successful_episodes=[0,5]") == 2
    assert "episodes [5]" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert {p: tree_hash(p) for p in (dataset, theirs)} == before


def test_recap_trains_a_conditioned_policy_that_carries_beta_and_leaves_the_dataset_untouched(dataset, tmp_path,
                                                                                             capsys):
    before = tree_hash(dataset)
    run = tmp_path / "recap"
    assert _offline("recap", dataset, run, "steps=6", "algo.policy.guidance_beta=1.5") == 0
    assert tree_hash(dataset) == before
    labels, meta = read_sidecar(run / "labels")
    assert meta["dataset"] and len(labels.index) == 47  # every frame of the 12 + 20 + 15
    assert labels.advantage_indicator[labels.intervention].all()  # interventions (odd frames) forced positive
    assert np.isfinite(labels.value).all() and ((labels.value >= -1) & (labels.value <= 0)).all()
    ckpt = load_checkpoint(run)
    assert ckpt.meta["algo"] == "recap" and ckpt.meta["labels"]["positive_fraction"] >= 0.3
    policy = load_policy(ckpt.path / POLICY_DIR)  # no value model, no training code
    assert policy.cfg.conditioning and policy.cfg.guidance_beta == 1.5
    frame = {keys.OBS_STATE: torch.zeros(2, 6), keys.TASK: ["pick the cube 0"] * 2,
             **{keys.lerobot_image_key(c): torch.zeros(2, 3, 32, 32, dtype=torch.uint8) for c in ("front", "wrist")}}
    chunk = policy.act(frame)
    assert chunk.shape == (2, 4, 6) and torch.isfinite(chunk).all()
    # a resumed run reuses the value model and the labels, and continues the policy's training exactly
    capsys.readouterr()
    assert _offline("recap", dataset, run, "steps=9", "algo.policy.guidance_beta=1.5", f"resume={run}") == 0
    assert "reusing the labels" in capsys.readouterr().err
    assert load_checkpoint(run).meta["updates"] == 9
    assert tree_hash(dataset) == before


def test_relabelling_with_another_n_step_reuses_the_value_model(dataset, tmp_path, capsys):
    first = tmp_path / "n3"
    assert _offline("recap", dataset, first, "steps=1") == 0
    second = tmp_path / "n1"
    second.mkdir()
    shutil.copytree(first / "value", second / "value")
    capsys.readouterr()
    tiny = [o for o in TINY_VALUE if not o.startswith("algo.labels.n_step=")]
    assert main(["offline", "algo=recap", f"dataset.root={dataset}", f"run_dir={second}", *TINY, *tiny,
                 "algo.labels.n_step=1", "steps=1"]) == 0
    assert "reusing the value model" in capsys.readouterr().err  # N changes the labels, not the value targets
    (a, meta_a), (b, meta_b) = read_sidecar(first / "labels"), read_sidecar(second / "labels")
    assert meta_a["settings"]["labels"]["n_step"] == 3 and meta_b["settings"]["labels"]["n_step"] == 1
    np.testing.assert_array_equal(a.value, b.value)  # the same model's values
    assert not np.allclose(a.advantage, b.advantage)


def test_a_value_model_with_state_lags_labels_each_frame_with_its_joints_frames_back(dataset, tmp_path):
    """algo.value.model.state_lags: the value model is fitted and labels with the joints L frames back (clamped at
    each episode's start), read from the dataset as ChunkSampler.state_lags gives them."""
    from robot_rl.algos.value_learning import load_value_model
    from robot_rl.data.lerobot_loader import ChunkDatasetConfig, ChunkSampler

    run = tmp_path / "lags"
    assert _offline("recap", dataset, run, "steps=1", "algo.value.model.state_lags=[1,3]") == 0
    model, _ = load_value_model(run / "value")
    assert model.cfg.state_lags == [1, 3]
    labels, _ = read_sidecar(run / "labels")
    s = ChunkSampler(ChunkDatasetConfig(root=str(dataset), horizon=1, augment=False, progress=False, batch_size=1))
    rows = torch.arange(s.num_frames)
    frame = {**s.batch(rows), keys.OBS_STATE_LAGS: s.state_lags(rows, [1, 3])}
    with torch.no_grad():
        np.testing.assert_allclose(labels.value, model.value(frame).numpy(), rtol=0, atol=1e-6)
        still = frame[keys.OBS_STATE][:, None].repeat(1, 2, 1)  # the same frames as if the joints had not moved
        assert not np.allclose(labels.value, model.value({**frame, keys.OBS_STATE_LAGS: still}).numpy(), atol=1e-6)


def test_a_pretrained_value_model_labels_another_dataset_without_training(dataset, tmp_path, capsys, monkeypatch):
    """algo.value.pretrained: a value model fitted on one dataset labels another (same cameras, tasks and M): no
    value training, the model copied into the run as it was (read from disk once per run), both datasets
    untouched, and its values are the labels' (on the dataset it was fitted on, they equal that run's own
    labels)."""
    import robot_rl.algos.advantages as advantages_mod
    import robot_rl.algos.value_learning as value_mod

    first = tmp_path / "fitted"
    m20 = "algo.labels.max_episode_length=20"  # one M for both tasks, here and on the other dataset
    assert _offline("recap", dataset, first, "steps=1", m20) == 0
    loads = []
    real_load = value_mod.load_value_model
    for mod in (value_mod, advantages_mod):  # every module that loads a value model from disk
        monkeypatch.setattr(mod, "load_value_model", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k))
    other = make_dataset(tmp_path / "other", lengths=[20, 9, 14, 11])  # other episodes
    before = tree_hash(dataset), tree_hash(other)
    for data, run in ((other, tmp_path / "on_other"), (dataset, tmp_path / "on_same")):
        capsys.readouterr()
        assert _offline("awr" if data == other else "recap", data, run, "steps=1", m20,
                        f"algo.value.pretrained={first / 'value'}") == 0
        err = capsys.readouterr().err
        assert "labelling with the pretrained value model" in err and "value model: step" not in err, err
        assert loads == [first / "value"], loads  # checked and used: one load
        loads.clear()
        fitted, copied = load_checkpoint(first / "value"), load_checkpoint(run / "value")
        assert fitted.state["model"].keys() == copied.state["model"].keys()
        assert all(torch.equal(fitted.state["model"][k], copied.state["model"][k]) for k in fitted.state["model"])
        meta = read_sidecar(run / "labels")[1]
        assert meta["summary"]["value_pretrained"]["path"] == str(first / "value")
        assert meta["summary"]["value_pretrained"]["fitted_on_dataset"] == read_sidecar(first / "labels")[1]["dataset"]
    assert len(read_sidecar(tmp_path / "on_other" / "labels")[0].index) == 54
    np.testing.assert_array_equal(read_sidecar(tmp_path / "on_same" / "labels")[0].value,
                                  read_sidecar(first / "labels")[0].value)
    assert (tree_hash(dataset), tree_hash(other)) == before


def test_a_pretrained_value_model_that_does_not_fit_is_refused_before_anything_is_written(dataset, tmp_path, capsys):
    fitted = tmp_path / "fitted"
    assert _offline("recap", dataset, fitted, "steps=1", "algo.labels.max_episode_length=20") == 0  # M = 20 for both
    short = make_dataset(tmp_path / "short", lengths=[8, 10], tasks=("push the cube 0",))  # M = 10, a new word
    cases = ((short, [], ["(20.0, 20.0)", "(10.0, 10.0)", "['push']"]),  # a new task: held to the model's one M
             (short, ["algo.labels.max_episode_length=20"], ["['push']"]),  # M as the model's: only the word is left
             (dataset, ["algo.labels.max_episode_length=20", "algo.labels.fail_penalty=5"], ["(20.0, 5.0)"]),
             (dataset, [], [("for 'pick the cube 0' it was fitted to targets with (M, C) = (20.0, 20.0) frames "
                             "and this data's labels use (15.0, 15.0)")]),  # each task's own longest episode
             (dataset, [], ["no value model there"]))
    for i, (data, extra, messages) in enumerate(cases):
        source = tmp_path / "nowhere" if "no value model there" in messages else fitted / "value"
        capsys.readouterr()
        assert _offline("recap", data, tmp_path / f"refused{i}", "steps=1", f"algo.value.pretrained={source}",
                        *extra) == 2
        err = capsys.readouterr().err
        assert all(m in err for m in messages), err
        if i == 1:
            assert "(M, C)" not in err, err
        assert not (tmp_path / f"refused{i}").exists()


def test_awr_oversamples_through_the_sampler(dataset, tmp_path):
    before = tree_hash(dataset)
    run = tmp_path / "awr"
    assert _offline("awr", dataset, run, "steps=3", "algo.awr.temperature=0.5") == 0
    assert tree_hash(dataset) == before
    ckpt = load_checkpoint(run)
    assert ckpt.meta["algo"] == "awr" and ckpt.state["sampler"]["weights"]  # drawn with advantage weights
    assert not load_policy(ckpt.path / POLICY_DIR).cfg.conditioning


def test_recap_can_draw_positives_at_a_share(dataset, tmp_path):
    run = tmp_path / "recap"
    assert _offline("recap", dataset, run, "steps=3", "algo.recap.positive_share=0.5") == 0
    ckpt = load_checkpoint(run)
    labels, _ = read_sidecar(run / "labels")
    expected = indicator_weights(labels.advantage_indicator, 0.5).numpy().tobytes()
    assert ckpt.state["sampler"]["weights"] == hashlib.sha256(expected).hexdigest()  # drawn by the indicator...
    assert load_policy(ckpt.path / POLICY_DIR).cfg.conditioning  # ...and still conditioned on it


@pytest.mark.parametrize("override, message", [("algo.policy.guidance_beta=0.5", "guidance_beta"),
                                               ("algo.labels.positive_fraction=1.5", "positive_fraction"),
                                               ("algo.recap.positive_share=0", "positive_share"),
                                               ("algo.value.model.loss=mse", "loss")])
def test_bad_settings_exit_2_before_training(dataset, tmp_path, capsys, override, message):
    code = _offline("recap", dataset, tmp_path / "run", "steps=2", override)
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "run").exists()


def test_a_run_folder_inside_the_dataset_is_refused(dataset, tmp_path, capsys):
    before = tree_hash(dataset)
    assert _offline("awr", dataset, dataset / "runs" / "awr", "steps=2") == 2
    assert "inside the dataset" in capsys.readouterr().err
    assert tree_hash(dataset) == before and not (dataset / "runs").exists()


def test_end_to_end_on_a_collected_dataset(tmp_path, capsys):
    """robot-rl collect (scripted expert, flawed) -> offline recap -> eval of the export in simulation."""
    data = tmp_path / "lift"
    assert main(["collect", "task=so101_lift", "episodes=6", f"dataset.root={data}", "sim.num_envs=3",
                 "task.episode_length=45", "quality=0.6", "progress=false", "task.image_width=32",
                 "task.image_height=32"]) == 0
    before = tree_hash(data)
    run = tmp_path / "run"
    assert _offline("recap", data, run, "steps=4", "algo.labels.n_step=10") == 0
    assert tree_hash(data) == before
    labels, _ = read_sidecar(run / "labels")
    assert max(labels.max_episode_length.values()) <= 45 and len(np.unique(labels.episode_index)) == 6
    out = tmp_path / "eval"
    assert main(["eval", f"checkpoint={run}", "task=so101_lift", "task.episode_length=10", "num_episodes=2",
                 "num_envs=2", "video=false", f"out_dir={out}"]) == 0, capsys.readouterr().err
    assert json.loads((out / "eval.json").read_text())["eval"]["num_episodes"] == 2
    assert CONDITION_KEY == "advantage_indicator"
    # the loop takes this run as its round 0 (init_run): nothing trained, the policy evaluated, both sources untouched
    run_before, loop = tree_hash(run), tmp_path / "loop"
    args = ["recap", "task=so101_lift", "rounds=0", f"init_dataset={data}", f"init_run={run}",
            "task.episode_length=10", "task.image_width=32", "task.image_height=32", "eval_episodes=2", "eval_envs=2"]
    capsys.readouterr()
    assert main([*args, f"run_dir={loop}"]) == 0, capsys.readouterr().err
    assert "value model: step" not in capsys.readouterr().err
    state = json.loads((loop / "state.json").read_text())["done"]
    assert state["round_0/train"]["adopted"] == str(run) and state["round_0/eval"]["num_episodes"] == 2
    assert tree_hash(run) == run_before and tree_hash(data) == before
    # a run on another dataset, or of another algorithm, is refused before anything is copied
    bc_run = tmp_path / "bc"
    assert _offline("bc", data, bc_run, "steps=2") == 0
    for bad, message in ((f"init_dataset={tmp_path / 'eval'}", "was trained on"), (f"init_run={bc_run}", "algo=bc run"),
                         ("guidance_beta=0.5", "guidance_beta must be >= 1")):
        capsys.readouterr()
        key = bad.split("=")[0]
        assert main([*(a for a in args if not a.startswith(key + "=")), bad, f"run_dir={tmp_path / 'refused'}"]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "refused" / "data").exists()


def test_the_improvement_loop_runs_records_interventions_and_resumes(tmp_path, capsys):
    """robot-rl recap: round 0 from a copied dataset (left untouched), one round of policy collection where the
    value model always calls the expert in (threshold 0), retraining and evaluation; rerun after losing a stage
    redoes only that stage."""
    from robot_rl.data.lerobot_format import read_frames, read_meta

    source = tmp_path / "source"
    assert main(["collect", "task=so101_lift", "episodes=2", f"dataset.root={source}", "sim.num_envs=2",
                 "task.episode_length=30", "progress=false", "task.image_width=32", "task.image_height=32"]) == 0
    before = tree_hash(source)
    run = tmp_path / "loop"
    offline = [*TINY, *TINY_VALUE, "algo.value.model.state_lags=[1,2]"]  # the watcher feeds the joints' lags live
    args = ["recap", "task=so101_lift", "rounds=1", f"run_dir={run}", f"init_dataset={source}",
            "episodes_per_round=2", "task.episode_length=30", "task.image_width=32", "task.image_height=32",
            "sim.num_envs=2", "steps=3", "eval_episodes=2", "eval_envs=2", "intervene_after=2",
            "intervene_below=0.0", "intervene_patience=1", "warm_start=true", "guidance_beta=2.0",
            "offline=[" + ",".join(f"'{o}'" for o in offline) + "]"]
    assert main(args) == 0, capsys.readouterr().err
    assert tree_hash(source) == before
    results = json.loads((run / "results.json").read_text())["rounds"]
    assert [r["round"] for r in results] == [0, 1]
    assert results[1]["collected_episodes"] == 2 and results[1]["intervention_rate"] == 1.0
    won = round(results[1]["collected_success_rate"] * 2)  # both episodes were taken over
    assert results[1]["takeovers_per_success"] == (2 / won if won else None)
    for r in results:
        assert 0.0 <= r["success_rate"] <= 1.0 and r["failure_rate"] == pytest.approx(1.0 - r["success_rate"])
    assert (run / "recap.png").is_file() and "| round |" in (run / "table.md").read_text()
    meta = read_meta(run / "data")
    cols = read_frames(meta, np.array([2, 3]), [keys.INTERVENTION_COL]).columns
    inter = cols[keys.INTERVENTION_COL].reshape(-1).astype(bool)
    assert inter.any() and not inter.all()  # the policy acted first, then the expert took over
    round0 = load_checkpoint(run / "round_000" / "train")
    assert load_checkpoint(run / "round_001" / "train").meta["init_policy"] == str(round0.path / POLICY_DIR)
    labels, _ = read_sidecar(run / "round_001" / "train" / "labels")
    assert labels.advantage_indicator[labels.intervention].all() and labels.intervention.any()
    # lose the last stage: the rerun evaluates again and collects nothing more
    state = json.loads((run / "state.json").read_text())
    del state["done"]["round_1/eval"]
    (run / "state.json").write_text(json.dumps(state))
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "collected" not in err and "round 1: success" in err
    assert int(read_meta(run / "data").info["total_episodes"]) == 4
    # killed while round 1's collection wrote an episode (its info.json torn): the rerun rolls the dataset back to
    # its last whole episode and goes on from there
    for stage in ("round_1/collect", "round_1/train", "round_1/eval"):
        state["done"].pop(stage, None)
    (run / "state.json").write_text(json.dumps(state))
    info = run / "data" / "meta" / "info.json"
    info.write_text(info.read_text()[:40])
    assert main(args) == 0, capsys.readouterr().err
    assert "rolled back" in capsys.readouterr().err
    assert int(read_meta(run / "data").info["total_episodes"]) == 4
    # resuming with other settings is refused, naming them, and the run's config.yaml is left as it was
    config = (run / "config.yaml").read_text()
    changed = [a if not a.startswith("episodes_per_round=") else "episodes_per_round=3" for a in args]
    assert main(changed) == 2
    err = capsys.readouterr().err
    assert "episodes_per_round: 2 then, 3 now" in err and "give a new run_dir" in err
    assert (run / "config.yaml").read_text() == config


def test_init_policy_starts_from_another_runs_weights_and_refuses_a_misfit(dataset, tmp_path, capsys):
    from robot_rl.cli.build import compose
    from robot_rl.cli.offline import build_offline

    first = tmp_path / "first"
    assert _offline("bc", dataset, first, "steps=2") == 0
    source = load_policy(load_checkpoint(first).path / POLICY_DIR)
    built = build_offline(compose("offline", ["algo=bc", f"dataset.root={dataset}", f"run_dir={tmp_path / 'next'}",
                                              *TINY, "steps=2", f"init_policy={first}"]))
    fresh = build_offline(compose("offline", ["algo=bc", f"dataset.root={dataset}", f"run_dir={tmp_path / 'new'}",
                                              *TINY, "steps=2"]))
    for name, w in source.model.state_dict().items():
        torch.testing.assert_close(built.algo.policy.model.state_dict()[name], w)
    assert any(not torch.equal(fresh.algo.policy.model.state_dict()[n], w)
               for n, w in source.model.state_dict().items())  # not what a fresh start draws
    code = _offline("bc", dataset, tmp_path / "misfit", "steps=2", f"init_policy={first}",
                    "algo.policy.hidden_dim=16")
    assert code == 2 and "does not fit" in capsys.readouterr().err


def test_configs_hold_the_dataclass_defaults():
    """algo=recap|awr and configs/recap.yaml compose from the dataclasses (every key overridable, a misspelled one
    refused)."""
    import dataclasses

    from hydra.errors import ConfigCompositionException

    from robot_rl.algos.value_learning import ValueTrainConfig
    from robot_rl.cli.build import compose
    from robot_rl.cli.offline import VALUE_SIZED
    from robot_rl.cli.recap import RecapCommand
    from robot_rl.models.value import ValueConfig

    algo = compose("offline", ["algo=recap", "algo.value.steps=7"]).algo
    assert algo.value.steps == 7 and algo.labels.n_step == 50 and "conditioning" not in algo.policy
    assert set(algo.value.model) == {f.name for f in dataclasses.fields(ValueConfig)} - set(VALUE_SIZED)
    assert set(algo.value) == {f.name for f in dataclasses.fields(ValueTrainConfig)}
    assert compose("offline", ["algo=awr"]).algo.awr.max_weight == 20.0
    with pytest.raises(ConfigCompositionException, match="algo.value.stepz"):
        compose("offline", ["algo=recap", "algo.value.stepz=1"])
    recap = compose("recap", [])
    defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                for f in dataclasses.fields(RecapCommand) if f.name not in ("task", "sim")}
    assert {k: v for k, v in recap.items() if k not in ("task", "sim")} == defaults
    assert recap.task.name == "so101_lift"
    # the defaults come from the dataclass (configs/recap.yaml lists none of them), misspelled keys are refused
    yaml_text = (Path(__file__).resolve().parents[1] / "configs" / "recap.yaml").read_text()
    assert "\nrounds:" not in yaml_text and "- recap_schema" in yaml_text
    with pytest.raises(ConfigCompositionException, match="roundz"):
        compose("recap", ["roundz=3"])


def test_the_loops_takeover_trigger_is_chosen_by_setting_and_older_runs_still_resume(tmp_path):
    """intervene_trigger picks robot_rl.hil's trigger (the stall's slope in units of the task's value scale M); a run
    folder written before a setting existed resumes when the setting is at its default, and is refused otherwise."""
    from omegaconf import OmegaConf

    from robot_rl.cli.recap import RecapCommand, _State, check_resume_settings, intervention_trigger
    from robot_rl.hil import ValueStall, ValueThreshold

    trig = intervention_trigger(RecapCommand(), 3, 150)
    assert isinstance(trig, ValueThreshold) and (trig.threshold, trig.patience, trig.after) == (-0.8, 3, 10)
    stall = intervention_trigger(RecapCommand(intervene_trigger="stall", intervene_window=8), 3, 150)
    assert isinstance(stall, ValueStall) and stall.window == 8 and stall.min_slope == pytest.approx(0.25 / 150)
    with pytest.raises(ValueError, match="intervene_trigger='slope'; allowed"):
        RecapCommand(intervene_trigger="slope")
    run = tmp_path / "run"
    run.mkdir()
    now = dataclasses.asdict(RecapCommand())
    older = {k: v for k, v in now.items() if not k.startswith(("intervene_trigger", "intervene_window",
                                                               "intervene_min", "intervene_ceiling"))}
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(older)))
    (run / "state.json").write_text(json.dumps({"done": {"round_0/collect": {}}, "started": {}}))
    check_resume_settings(run, now, _State(run / "state.json"))  # the new settings at their defaults: as then
    with pytest.raises(ValueError, match="intervene_trigger: 'threshold' then, 'stall' now"):
        check_resume_settings(run, {**now, "intervene_trigger": "stall"}, _State(run / "state.json"))


def test_each_instruction_gets_its_own_value_scale_from_the_command_line(dataset, tmp_path, capsys):
    """algo.labels.max_episode_length_by_task (Hydra's map form): that task's M, the others max_episode_length; an
    instruction the data lacks is refused before anything is written."""
    run = tmp_path / "scales"
    assert _offline("recap", dataset, run, "steps=1", "algo.labels.max_episode_length=20",
                    "algo.labels.max_episode_length_by_task={pick the cube 1:40}") == 0, capsys.readouterr().err
    labels, _ = read_sidecar(run / "labels")
    tasks = list(read_meta(dataset).tasks)  # by task_index
    assert labels.max_episode_length == {tasks.index("pick the cube 0"): 20, tasks.index("pick the cube 1"): 40}
    capsys.readouterr()
    assert _offline("recap", dataset, tmp_path / "typo", "steps=1",
                    "algo.labels.max_episode_length_by_task={pick the cube 2:40}") == 2
    assert "names ['pick the cube 2'], which the data's instructions" in capsys.readouterr().err


def test_the_loop_recovers_before_calling_the_expert(tmp_path, capsys):
    """recovery=true: each episode's first take-over request sends the arm back to a remembered state (the memory:
    the dataset's intervention frames, keyed by the value model) along the straight joint line, at most
    recovery_max_step degrees per step; only a request after it calls the expert (recorded as actor human)."""
    from robot_rl.data.lerobot_format import read_frames, read_meta

    source = tmp_path / "source"
    assert main(["collect", "task=so101_lift", "episodes=2", f"dataset.root={source}", "sim.num_envs=2",
                 "task.episode_length=30", "progress=false", "task.image_width=32", "task.image_height=32"]) == 0
    run = tmp_path / "loop"
    args = ["recap", "task=so101_lift", "rounds=1", f"run_dir={run}", f"init_dataset={source}",
            "episodes_per_round=2", "task.episode_length=30", "task.image_width=32", "task.image_height=32",
            "sim.num_envs=2", "steps=3", "eval_episodes=2", "eval_envs=2", "intervene_after=2",
            "intervene_below=0.0", "intervene_patience=1", "recovery=true", "recovery_every=1",
            "recovery_max_steps=6", "recovery_max_step=2.0",
            "offline=[" + ",".join(f"'{o}'" for o in [*TINY, *TINY_VALUE]) + "]"]
    assert main(args) == 0, capsys.readouterr().err
    meta = read_meta(run / "data")
    cols = read_frames(meta, np.array([2, 3]), [keys.ACTOR_COL, keys.OBS_STATE, keys.ACTION_COL]).columns
    actor = cols[keys.ACTOR_COL].reshape(-1)
    ep = cols["episode_index"].reshape(-1)
    for e in (2, 3):
        who = actor[ep == e].tolist()
        # the policy first (intervene_after), then one recovery of at most 6 steps, then the expert to the end
        first_rec = who.index(keys.ACTOR_RECOVERY)
        assert set(who[:first_rec]) == {keys.ACTOR_POLICY}
        rec = [i for i, w in enumerate(who) if w == keys.ACTOR_RECOVERY]
        assert rec == list(range(first_rec, first_rec + len(rec))) and len(rec) <= 6
        assert keys.ACTOR_HUMAN in who[rec[-1]:] and who[-1] == keys.ACTOR_HUMAN
    moves = (cols[keys.ACTION_COL] - cols[keys.OBS_STATE])[actor == keys.ACTOR_RECOVERY]
    assert np.abs(moves).max() <= 2.0 + 1e-4
    # the next round's memory: the person's frames (the expert's demos and take-overs), never a recovery's
    from robot_rl.algos.value_learning import load_value_model
    from robot_rl.cli.recap import RecapCommand, recovery_memory

    every = read_frames(meta, np.arange(4), [keys.ACTOR_COL]).columns[keys.ACTOR_COL].reshape(-1)
    value, _ = load_value_model(run / "round_001" / "train" / "value")
    memory = recovery_memory(value, run / "data", RecapCommand(recovery=True, recovery_every=1))
    assert len(memory) == int((every == keys.ACTOR_HUMAN).sum()) < int((every != keys.ACTOR_POLICY).sum())
