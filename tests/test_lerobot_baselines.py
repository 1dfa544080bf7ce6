"""LeRobot's ACT and Diffusion Policy as baselines: trained by lerobot-train on a real LeRobotDataset v3 on disk, run
through our Policy contract (benchmarks/lerobot_baselines.py)."""

from __future__ import annotations

import json
import math

# lerobot, accelerate (which lerobot-train needs) and diffusers (LeRobot's Diffusion Policy) come with the `lerobot`
# extra that `make test` installs: imported plainly, so a broken install fails here instead of skipping these tests.
import accelerate  # noqa: F401
import diffusers  # noqa: F401
import lerobot  # noqa: F401
import numpy as np
import pytest
import torch

from benchmarks import lerobot_baselines
from benchmarks.lerobot_baselines import (
    TRAIN_RECORD,
    LeRobotHistoryAdapter,
    LeRobotPolicyAdapter,
    load_lerobot_adapter,
    parse_step_line,
    push_history,
    train_lerobot_policy,
)
from policies import ActionQueue
from policies.keys import ACTION_COL, OBS_STATE, TASK, lerobot_image_key
from sim.so101 import LEROBOT_STATE_NAMES

FRONT = lerobot_image_key("front")
SIZE = 32
TASKS = ("pick up the cube", "push the cube left", "reach the target")
ACTION_MEAN = 35.0  # degrees: far from 0, so un-normalised actions are told from normalised ones
TINY_ACT = {"policy.dim_model": 32, "policy.n_heads": 2, "policy.dim_feedforward": 64, "policy.n_encoder_layers": 1,
            "policy.n_vae_encoder_layers": 1, "policy.latent_dim": 8, "policy.chunk_size": 8,
            "policy.n_action_steps": 4}
# horizon 8: a multiple of 2^len(down_dims); drop_n_last_frames = horizon - n_action_steps - n_obs_steps + 1
TINY_DIFFUSION = {"policy.down_dims": [16, 32], "policy.kernel_size": 3, "policy.n_groups": 4,
                  "policy.diffusion_step_embed_dim": 16, "policy.spatial_softmax_num_keypoints": 8,
                  "policy.horizon": 8, "policy.n_action_steps": 4, "policy.drop_n_last_frames": 3,
                  "policy.num_inference_steps": 4}


def _make_dataset(root) -> None:
    """3 episodes x 20 frames at 30 Hz: six SO-101 joints in degrees, one 32x32 video camera, a task each."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    names = list(LEROBOT_STATE_NAMES)
    features = {OBS_STATE: {"dtype": "float32", "shape": (6,), "names": names},
                ACTION_COL: {"dtype": "float32", "shape": (6,), "names": names},
                FRONT: {"dtype": "video", "shape": (SIZE, SIZE, 3), "names": ["height", "width", "channels"]}}
    ds = LeRobotDataset.create("local/tiny_so101", fps=30, features=features, root=root, robot_type="so101_follower",
                               use_videos=True)
    rng = np.random.default_rng(0)
    for ep, task in enumerate(TASKS):
        for t in range(20):
            q = (ACTION_MEAN - 5 + 10 * np.sin(0.2 * t + ep + np.arange(6))).astype(np.float32)
            image = np.full((SIZE, SIZE, 3), 40 * ep, np.uint8) + rng.integers(0, 30, (SIZE, SIZE, 3), dtype=np.uint8)
            ds.add_frame({OBS_STATE: q, ACTION_COL: q + 5, FRONT: image, "task": task})
        ds.save_episode()
    ds.finalize()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny ACT trained for 2 steps by lerobot-train: (pretrained_model folder, out_dir)."""
    root = tmp_path_factory.mktemp("ds") / "tiny_so101"
    _make_dataset(root)
    out = tmp_path_factory.mktemp("act")
    path = train_lerobot_policy("act", root, "local/tiny_so101", out, wall_clock_s=240, seed=0, batch_size=4,
                                overrides=TINY_ACT, steps=2, checkpoints=1)
    return path, out


def _frame(n: int, seed: int) -> dict:
    """Our frame convention: state float32 [N, 6] degrees, images uint8 [N, 3, H, W], task list[str]."""
    g = torch.Generator().manual_seed(seed)
    return {OBS_STATE: ACTION_MEAN + 10 * torch.randn(n, 6, generator=g),
            FRONT: torch.randint(0, 256, (n, 3, SIZE, SIZE), dtype=torch.uint8, generator=g),
            TASK: [TASKS[i % 3] for i in range(n)]}


def _rows(obs: dict, ids: list[int]) -> dict:
    return {k: ([v[i] for i in ids] if isinstance(v, list) else v[ids]) for k, v in obs.items()}


def test_train_writes_lerobot_model_and_record(trained):
    path, out = trained
    for name in ("config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json"):
        assert (path / name).is_file(), name
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["type"] == "act" and cfg["pretrained_backbone_weights"] is None
    assert (cfg["chunk_size"], cfg["n_action_steps"], cfg["dim_model"]) == (8, 4, 32)
    rec = json.loads((out / TRAIN_RECORD).read_text())
    assert rec["steps_in_model"] == rec["steps_logged"] == 2 and not rec["stopped_at_budget"]
    assert [c["step"] for c in rec["curve"]] == [1, 2]
    assert all(math.isfinite(c["loss"]) and c["loss"] > 0 for c in rec["curve"])
    assert 0 < rec["curve"][0]["wall_s"] < rec["curve"][1]["wall_s"] < rec["wall_s"] <= 240
    assert rec["peak_rss_mb"] > 200  # torch + lerobot + a ResNet-18 at least
    assert rec["num_learnable_params"] > 11_000_000  # the ResNet-18 backbone is kept
    assert rec["dataset.num_frames"] == 60 and rec["dataset.num_episodes"] == 3
    assert len(list((out / "run" / "checkpoints").glob("[0-9]*"))) == 1


def test_adapter_chunks_in_degrees_batched_and_per_env(trained):
    path, _ = trained
    policy = load_lerobot_adapter(path)
    assert isinstance(policy, LeRobotPolicyAdapter) and (policy.horizon, policy.executed_steps) == (8, 4)
    obs = _frame(3, seed=1)
    chunk = policy.act(obs)
    assert chunk.shape == (3, 8, 6) and chunk.dtype == torch.float32 and torch.isfinite(chunk).all()
    # un-normalised by the dataset's statistics: around the actions' mean, in degrees (normalised would be ~0)
    assert chunk.abs().max() < 180 and abs(chunk.mean().item() - ACTION_MEAN) < 15
    # each env's chunk depends on its own observation only
    torch.testing.assert_close(policy.act(_rows(obs, [1]))[0], chunk[1], atol=1e-4, rtol=1e-4)
    # float images in [0, 1] (what datasets hold) give the same actions as uint8 ones
    as_float = {**obs, FRONT: obs[FRONT].float() / 255}
    torch.testing.assert_close(policy.act(as_float), chunk, atol=1e-4, rtol=1e-4)


def test_reset_of_one_env_keeps_the_others_queue(trained):
    path, _ = trained
    policy = LeRobotPolicyAdapter(path)
    queue = ActionQueue(policy, num_envs=2, action_dim=6)
    obs0 = _frame(2, seed=2)
    first = policy.act(obs0)  # what both envs were given at step 0
    torch.testing.assert_close(queue(obs0), first[:, 0], atol=1e-4, rtol=1e-4)
    obs1 = _frame(2, seed=3)  # new observations: env 0 keeps executing its chunk regardless
    torch.testing.assert_close(queue(obs1), first[:, 1], atol=1e-4, rtol=1e-4)
    queue.reset(torch.tensor([1]))
    obs2 = _frame(2, seed=4)
    a2 = queue(obs2)
    torch.testing.assert_close(a2[0], first[0, 2], atol=1e-4, rtol=1e-4)  # env 0 undisturbed
    torch.testing.assert_close(a2[1], policy.act(_rows(obs2, [1]))[0, 0], atol=1e-4, rtol=1e-4)  # env 1 re-asked
    assert not torch.allclose(a2[1], first[1, 2], atol=1e-3)


def test_history_adapter_keeps_queues_per_env(trained):
    """The step adapter (Diffusion's route) on ACT, whose history is one frame: per-env queues and resets."""
    path, _ = trained
    chunked, policy = LeRobotPolicyAdapter(path), LeRobotHistoryAdapter(path)
    assert policy.horizon == 1 and policy.n_obs == 1 and policy.n_act == 4
    obs0 = _frame(2, seed=5)
    first = chunked.act(obs0)
    torch.testing.assert_close(policy.act(obs0), first[:, 0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(policy.act(_frame(2, seed=6)), first[:, 1], atol=1e-4, rtol=1e-4)
    policy.reset(torch.tensor([0]))
    obs2 = _frame(2, seed=7)
    a2 = policy.act(obs2)
    torch.testing.assert_close(a2[0], chunked.act(_rows(obs2, [0]))[0, 0], atol=1e-4, rtol=1e-4)  # re-asked
    torch.testing.assert_close(a2[1], first[1, 2], atol=1e-4, rtol=1e-4)  # undisturbed
    out = ActionQueue(policy, num_envs=2, action_dim=6)(_frame(2, seed=8))
    assert out.shape == (2, 6) and torch.isfinite(out).all()


def test_push_history_by_hand():
    history = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # N=2 envs, T=2 steps of a scalar
    out = push_history(history, torch.tensor([5.0, 6.0]), torch.tensor([False, True]))
    torch.testing.assert_close(out, torch.tensor([[2.0, 5.0], [6.0, 6.0]]))  # env 1 restarted: filled with 6
    images = torch.zeros(1, 3, 2, 2, 2)
    out = push_history(images, torch.ones(1, 2, 2, 2), torch.tensor([False]))
    assert out[0, :2].sum() == 0 and out[0, 2].sum() == 8


def test_parse_lerobot_step_log():
    line = ("INFO 2026-12-01 00:28:53 ot_train.py:641 step:1K smpl:8K ep:2 epch:0.13 loss:72.081 grdn:1228.126 "
            "lr:1.0e-05 updt_s:1.459 data_s:0.109 smp/s:5 l1_loss:0.860 kld_loss:7.122\n")
    assert parse_step_line(line) == {"epch": 0.13, "loss": 72.081, "grdn": 1228.126, "lr": 1e-5, "updt_s": 1.459,
                                     "data_s": 0.109, "smp/s": 5.0, "l1_loss": 0.86, "kld_loss": 7.122}
    assert parse_step_line("INFO ... ot_train.py:687 Checkpoint policy after step 6") is None


def test_adapter_names_what_is_missing_or_malformed(trained):
    path, _ = trained
    policy = LeRobotPolicyAdapter(path)
    obs = _frame(2, seed=9)
    with pytest.raises(ValueError, match="observation.images.front"):
        policy.act({k: v for k, v in obs.items() if k != FRONT})
    with pytest.raises(ValueError, match="observation.images.front"):
        policy.act({**obs, FRONT: obs[FRONT][:, :, :16]})
    with pytest.raises(ValueError, match="3 instructions for 2 envs"):
        policy.act({**obs, TASK: list(TASKS)})
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_lerobot_adapter(path.parent)


def test_train_refuses_bad_requests(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        train_lerobot_policy("pi0", tmp_path, "x/y", tmp_path / "o", 60)
    with pytest.raises(ValueError, match="steps"):
        train_lerobot_policy("act", tmp_path, "x/y", tmp_path / "o", 60, overrides={"steps": 3})
    with pytest.raises(FileNotFoundError, match="meta/info.json"):
        train_lerobot_policy("act", tmp_path, "x/y", tmp_path / "o", 60)


def test_diffusion_without_diffusers_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(lerobot_baselines, "diffusion_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"lerobot\[diffusion\]"):
        train_lerobot_policy("diffusion", tmp_path, "x/y", tmp_path / "o", 60)


@pytest.fixture(scope="module")
def trained_diffusion(tmp_path_factory):
    """A tiny Diffusion Policy (2 observation steps, chunks of 8, 4 executed) trained for 2 steps by lerobot-train."""
    root = tmp_path_factory.mktemp("ds") / "tiny_so101"
    _make_dataset(root)
    out = tmp_path_factory.mktemp("diffusion")
    return train_lerobot_policy("diffusion", root, "local/tiny_so101", out, wall_clock_s=240, seed=0, batch_size=4,
                                overrides=TINY_DIFFUSION, steps=2, checkpoints=1)


def _diffusion_chunk(policy: LeRobotHistoryAdapter, frames: list[dict], seed: int) -> torch.Tensor:
    """What LeRobot's Diffusion Policy predicts, in degrees, from ``frames`` stacked as its observation history,
    with the global RNG (its noise) seeded."""
    batches = [policy.pre(lerobot_baselines._frame_to_batch(f, policy.cfg, policy.processor, policy.device))
               for f in frames]
    stacked = {k: torch.stack([b[k] for b in batches], dim=1) for k in policy.cfg.input_features}
    torch.manual_seed(seed)
    return policy.post(policy.lerobot.predict_action_chunk(stacked)).float()


def test_diffusion_reads_its_history_per_env(trained_diffusion):
    """LeRobot's Diffusion Policy through the history adapter: an episode's first observation fills the history, a
    new chunk comes from the last two observations once an env's queue is spent, each env keeps its own queue."""
    policy = load_lerobot_adapter(trained_diffusion)
    assert isinstance(policy, LeRobotHistoryAdapter) and policy.lerobot.config.type == "diffusion"
    assert (policy.n_obs, policy.n_act, policy.horizon) == (2, 4, 1)
    frames = [_frame(2, seed=20 + t) for t in range(5)]
    torch.manual_seed(0)
    a0 = policy.act(frames[0])
    first = _diffusion_chunk(policy, [frames[0], frames[0]], seed=0)  # the chunk's executed steps
    assert first.shape == (2, 4, 6) and torch.isfinite(first).all()
    torch.testing.assert_close(a0, first[:, 0], atol=1e-4, rtol=1e-4)
    assert abs(a0.mean().item() - ACTION_MEAN) < 30  # degrees, un-normalised by the dataset's statistics
    for t in (1, 2, 3):  # the rest of the queue, whatever the new observations
        torch.testing.assert_close(policy.act(frames[t]), first[:, t], atol=1e-4, rtol=1e-4)
    policy.reset(torch.tensor([1]))  # env 1 starts an episode: its history is frames[4] alone
    torch.manual_seed(1)
    a4 = policy.act(frames[4])  # both queues are spent: one prediction for both envs
    env0, env1 = _rows(frames[3], [0]), _rows(frames[4], [1])
    previous = {k: (v + env1[k] if isinstance(v, list) else torch.cat([v, env1[k]]))
                for k, v in env0.items()}  # env 0 saw frames[3] before; env 1's first frame stands in for it
    expected = _diffusion_chunk(policy, [previous, frames[4]], seed=1)[:, 0]
    torch.testing.assert_close(a4, expected, atol=1e-4, rtol=1e-4)
    no_reset = _diffusion_chunk(policy, [frames[3], frames[4]], seed=1)[:, 0]
    torch.testing.assert_close(a4[0], no_reset[0], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(a4[1], no_reset[1], atol=1e-3)  # the reset changed env 1's history only


@pytest.mark.slow
def test_budgeted_training_ends_inside_the_budget(tmp_path):
    """Calibration sizes the steps so that the whole lerobot-train run fits the wall-clock budget (~2 min)."""
    root = tmp_path / "tiny_so101"
    _make_dataset(root)
    budget = 60.0
    path = train_lerobot_policy("act", root, "local/tiny_so101", tmp_path / "act", wall_clock_s=budget,
                                batch_size=4, overrides=TINY_ACT, calibration_steps=4)
    rec = json.loads((tmp_path / "act" / TRAIN_RECORD).read_text())
    cal = rec["calibration"]
    assert cal["steps"] == 4 and cal["step_s"] > 0 and cal["startup_s"] > 0
    assert rec["steps_planned"] >= 2 and rec["wall_s"] <= budget + 1
    assert rec["steps_in_model"] == rec["steps_planned"] or rec["stopped_at_budget"]
    assert (path / "model.safetensors").is_file() and not (tmp_path / "act" / "calibration" / "run").exists()
