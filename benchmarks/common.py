"""Shared benchmark plumbing: the result record of DESIGN.md §9 (machine, date, commit, command, goals)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    gpu = "none"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except (ImportError, RuntimeError) as err:  # no torch, or a CUDA that fails to initialise: recorded as such
        gpu = f"unknown ({type(err).__name__})"
    return {"cores": os.cpu_count(), "gpu": gpu, "platform": platform.platform(), "python": platform.python_version()}


def robot_rl_command() -> list[str]:
    """The ``robot-rl`` console script of this interpreter's environment (``python -m`` where it is not installed)."""
    exe = Path(sys.executable).parent / "robot-rl"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "robot_rl.cli.main"]


def run_robot_rl(args: list[str], what: str) -> float:
    """Run ``robot-rl <args>`` (offscreen rendering); its wall-clock seconds. A failure stops the benchmark with the
    command's last output, naming ``what`` failed."""
    import time

    start = time.perf_counter()
    proc = subprocess.run([*robot_rl_command(), *args], capture_output=True, text=True, check=False,
                          env={**os.environ, "MUJOCO_GL": "egl"})
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=Path(__file__).parent).strip()
    except (OSError, subprocess.CalledProcessError):  # no git, or not a checkout
        return "unknown"


def goal(name: str, value: float, target: float, direction: str) -> dict[str, Any]:
    """A goal whose ``met`` is computed from the measured value, never typed in."""
    if direction not in (">=", "<="):
        raise ValueError(f"direction must be '>=' or '<=', got {direction!r}")
    met = value >= target if direction == ">=" else value <= target
    return {"name": name, "value": round(float(value), 4), "target": target, "direction": direction, "met": bool(met)}


def provenance(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """What a merged result says of one result file it took runs from (and, in turn, of that file's sources)."""
    return {"file": str(path), **{k: record.get(k) for k in ("command", "commit", "date")},
            "merged_from": record.get("merged_from", [])}


def write_result(name: str, data: dict[str, Any], goals: list[dict[str, Any]], out_dir: Path | None = None) -> Path:
    """Write ``<out_dir>/<name>.json``: the record (machine, date, commit, command), ``data`` and ``goals``.

    A result file already there is not wiped: its top-level keys that this run does not write (notes, one-off
    trials, earlier runs' summaries) are carried over, and the earlier run's date, commit, command and goals are kept
    under ``previous_run_<its date>``, so re-running a benchmark into ``benchmarks/results/`` loses no history (a
    carried key may describe an earlier run: delete the file first for a record of this run alone).
    """
    out_dir = Path(out_dir or RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "name": name,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        **data,
        "goals": goals,
    }
    path = out_dir / f"{name}.json"
    if path.is_file():
        old = json.loads(path.read_text())
        record.update({k: v for k, v in old.items() if k not in record})
        if "date" in old:
            record[f"previous_run_{old['date']}"] = {k: old.get(k) for k in ("date", "commit", "command", "goals")}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> None:
    """Lay out, write and close a benchmark's matplotlib figure (the PNG beside its JSON)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
