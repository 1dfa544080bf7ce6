"""Shared set-up for the tests that drive LeRobot's own classes and tools."""

import tempfile

import pytest


@pytest.fixture(autouse=True)
def _lerobot_temp_files_in_tmp_path(tmp_path, monkeypatch):
    """LeRobot 0.6.1's ``PreTrainedConfig.from_pretrained`` leaves a ``tmp*.json`` in the temp folder on every load
    (real/lerobot_policy/read_config.py); these tests call it on purpose, so theirs go to pytest's own folder, in this
    process and in the LeRobot tools they start."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
