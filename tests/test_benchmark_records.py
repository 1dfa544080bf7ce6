"""benchmarks/common.py's result record: a re-run into a results folder keeps the file's history."""

from __future__ import annotations

import json

from benchmarks.common import goal, write_result


def test_a_rerun_keeps_notes_and_the_earlier_runs_record(tmp_path):
    first = write_result("bench", {"summary": {"ratio": 0.9}}, [goal("ratio", 0.9, 1.0, "<=")], tmp_path)
    old = json.loads(first.read_text())
    old["reading"] = "a note written after the first run"  # what a session adds by hand
    first.write_text(json.dumps(old, indent=2) + "\n")

    path = write_result("bench", {"summary": {"ratio": 1.1}}, [goal("ratio", 1.1, 1.0, "<=")], tmp_path)
    new = json.loads(path.read_text())
    assert path.read_text().endswith("}\n")
    assert new["summary"] == {"ratio": 1.1} and new["goals"][0]["met"] is False  # this run's data wins
    assert new["reading"] == "a note written after the first run"  # keys this run does not write are carried
    earlier = new[f"previous_run_{old['date']}"]
    assert earlier["goals"][0]["value"] == 0.9 and earlier["commit"] == old["commit"]


def test_a_first_run_writes_only_its_record(tmp_path):
    path = write_result("fresh", {"x": 1}, [], tmp_path)
    assert set(json.loads(path.read_text())) == {"name", "date", "commit", "command", "machine", "x", "goals"}
