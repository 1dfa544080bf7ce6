"""benchmarks/ppo_vs_sb3.py's run folders: with --keep-runs a folder is read instead of retrained only when it holds a
finished run (at the target or the budget) of the very config the benchmark composes; without it none is left."""

from __future__ import annotations

import json
import tempfile

import yaml

from benchmarks.ppo_vs_sb3 import TARGET, _finished_run, run_ours


def _run(tmp_path, config: dict, curve: list[dict]):
    run = tmp_path / "so101_lift_s1"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({**config, "run_dir": str(run)}))
    (run / "curve.jsonl").write_text("".join(json.dumps(p) + "\n" for p in curve))
    return run


CONFIG = {"seed": 1, "max_minutes": 60.0, "algo": {"use_clipped_value_loss": False}}


def test_a_finished_run_of_the_same_config_is_read(tmp_path):
    run = _run(tmp_path, CONFIG, [{"success_rate": 0.5, "wall_s": 10.0}, {"success_rate": TARGET, "wall_s": 20.0}])
    assert _finished_run(run, {**CONFIG, "run_dir": "/elsewhere"}, 60.0)  # the folder's own path may differ


def test_another_config_or_an_unfinished_run_is_retrained(tmp_path):
    run = _run(tmp_path, CONFIG, [{"success_rate": 0.5, "wall_s": 10.0}])
    assert not _finished_run(run, CONFIG, 60.0)  # below the target and inside the budget: cut short
    assert _finished_run(run, CONFIG, 10.0 / 60)  # ... unless the budget was spent
    other = {**CONFIG, "algo": {"use_clipped_value_loss": True}}
    assert not _finished_run(run, other, 10.0 / 60)
    assert not _finished_run(tmp_path / "missing", CONFIG, 60.0)


def test_a_run_not_kept_leaves_no_folder_behind(tmp_path, monkeypatch):
    """``run_ours`` without ``--keep-runs`` trains in a temporary folder and removes it once its curve is read."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = run_ours("so101_reach", 0, budget_min=0.002)
    assert not result["reached"] and result["budget_s"] == 60 * 0.002  # stopped by the budget, its curve read
    assert list(tmp_path.glob("ppo_vs_sb3_ours_*")) == []
