"""benchmarks/ppo_vs_sb3.py --keep-runs: a run folder is read instead of retrained only when it holds a finished run
(at the target or the budget) of the very config the benchmark composes."""

from __future__ import annotations

import json

import yaml

from benchmarks.ppo_vs_sb3 import TARGET, _finished_run


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
