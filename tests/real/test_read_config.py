"""``read_policy_config`` gives what LeRobot's ``PreTrainedConfig.from_pretrained`` gives for a local folder, for
LeRobot's policy types and ours, and leaves no temporary file behind (LeRobot 0.6.1's leaves one per call)."""

from __future__ import annotations

import dataclasses
import tempfile

import pytest
import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.act.configuration_act import ACTConfig

from policies import keys
from policies.gaussian import GaussianPolicy, GaussianPolicyConfig, default_processor
from real.lerobot_policy import export_for_lerobot
from real.lerobot_policy.modeling_robot_rl import RobotRLPolicy
from real.lerobot_policy.read_config import read_policy_config


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """tempfile's folder, made private to the test so that what a call leaves there can be counted."""
    folder = tmp_path / "tempdir"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _saved_act(folder):
    cfg = ACTConfig(chunk_size=20, n_action_steps=5, dim_model=128)
    folder.mkdir()
    cfg._save_pretrained(folder)
    return cfg


def test_an_act_config_reads_back_equal_and_leaves_no_file(tmp_path, private_tmp):
    saved = _saved_act(tmp_path / "act")
    cfg = read_policy_config(tmp_path / "act")
    assert type(cfg) is ACTConfig
    assert (cfg.chunk_size, cfg.n_action_steps, cfg.dim_model) == (20, 5, 128)
    assert dataclasses.asdict(cfg) == dataclasses.asdict(saved)
    assert list(private_tmp.iterdir()) == []


def test_our_exported_policy_loads_through_it_and_leaves_no_file(tmp_path, private_tmp, capsys):
    torch.manual_seed(0)
    cfg = GaussianPolicyConfig(obs_dim=6, action_dim=6, hidden_dims=[8], obs_key=keys.PROPRIO, normalize_obs=False)
    GaussianPolicy(cfg, default_processor(keys.PROPRIO, 6, 6, False)).save(tmp_path / "gauss")
    out = export_for_lerobot(tmp_path / "gauss", tmp_path / "lerobot_gauss")
    # a bare folder (no checkpoint meta.json): the default action mapping is assumed, and said so
    assert "no meta.json beside" in capsys.readouterr().err
    ours = read_policy_config(out)
    assert dataclasses.asdict(ours) == dataclasses.asdict(PreTrainedConfig.from_pretrained(out))
    for leftover in private_tmp.iterdir():  # LeRobot's reader, the reference above, leaves its own: not ours
        leftover.unlink()
    policy = RobotRLPolicy.from_pretrained(out)  # no config given: the plugin reads it
    assert policy.kind == "proprio"
    assert list(private_tmp.iterdir()) == []


def test_a_folder_without_a_config_or_with_an_unknown_type_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        read_policy_config(tmp_path)
    (tmp_path / "config.json").write_text('{"type": "no_such_policy"}')
    with pytest.raises(ValueError, match="'no_such_policy' is not registered"):
        read_policy_config(tmp_path)
    (tmp_path / "config.json").write_text('{"chunk_size": 3}')
    with pytest.raises(ValueError, match="no 'type' field"):
        read_policy_config(tmp_path)
