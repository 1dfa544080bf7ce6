"""Calibration files that a kill cannot corrupt (RELIABILITY A10).

LeRobot writes an arm's calibration (``lerobot-calibrate``, or a robot's ``calibrate()`` at connect) with
``open(path, "w")`` and ``draccus.dump``: the file is emptied first, then written, so a process killed or a machine
losing power in between leaves a truncated file, and the arm cannot connect until it is calibrated again by hand.

``save_calibration`` writes the same JSON to a temporary file beside the target, flushes and fsyncs it, renames it
over the target (``os.replace``, atomic on POSIX) and fsyncs the folder: after a kill at any instant the file holds
the old calibration or the new one, whole. ``install()`` makes LeRobot's own ``Robot._save_calibration`` and
``Teleoperator._save_calibration`` do this; robot-rl's LeRobot plugins call it on import, so every LeRobot CLI of a
machine where robot-rl is set up (``lerobot-calibrate`` included: it imports the installed plugins at start) saves
calibrations this way. The content is byte for byte what LeRobot writes.

If the old file survives a kill that came after the motors took the new calibration, ``real.robot_env.safe_connect``
finds the two differ and refuses to connect, naming the ``lerobot-calibrate`` command to run.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from robot_rl.checkpoint import write_atomic

_TMP_SUFFIX = ".tmp"


def _tmp_name(path: Path, pid: int) -> Path:
    return path.with_name(f".{path.name}.{pid}{_TMP_SUFFIX}")


def _remove_stale_temporaries(path: Path) -> None:
    """Temporaries of ``path`` left by a writer that was killed (its process is gone)."""
    for tmp in path.parent.glob(f".{path.name}.*{_TMP_SUFFIX}"):
        try:
            pid = int(tmp.name[len(path.name) + 2: -len(_TMP_SUFFIX)])
        except ValueError:
            continue
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except PermissionError:  # alive, another user's
            pass


def calibration_json(calibration: Any) -> str:
    """The text LeRobot writes for ``calibration`` (``{motor: MotorCalibration}``): draccus's JSON, indent 4."""
    import draccus

    buf = io.StringIO()
    with draccus.config_type("json"):
        draccus.dump(calibration, buf, indent=4)
    return buf.getvalue()


def save_calibration(calibration: Any, path: str | Path) -> None:
    """Write ``calibration`` to ``path`` atomically: old or new content after a kill at any instant, never a part."""
    path = Path(path)
    text = calibration_json(calibration)  # serialise first: a bad value raises before anything is touched
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(path)
    write_atomic(path, text.encode(), _tmp_name(path, os.getpid()))


def _save_method(self: Any, fpath: Path | None = None) -> None:
    save_calibration(self.calibration, self.calibration_fpath if fpath is None else fpath)


_save_method.robot_rl_atomic = True  # type: ignore[attr-defined]
LEROBOT_SAVE: dict[str, Any] = {}  # class name -> LeRobot's own method, kept by install()


def install() -> None:
    """Make LeRobot's ``Robot`` and ``Teleoperator`` save their calibration with ``save_calibration`` (idempotent)."""
    from lerobot.robots.robot import Robot
    from lerobot.teleoperators.teleoperator import Teleoperator

    for cls in (Robot, Teleoperator):
        if not getattr(cls._save_calibration, "robot_rl_atomic", False):
            LEROBOT_SAVE[cls.__name__] = cls._save_calibration
            cls._save_calibration = _save_method


def installed() -> bool:
    """Whether LeRobot's robots and teleoperators save calibrations atomically in this process."""
    from lerobot.robots.robot import Robot
    from lerobot.teleoperators.teleoperator import Teleoperator

    return all(getattr(c._save_calibration, "robot_rl_atomic", False) for c in (Robot, Teleoperator))
