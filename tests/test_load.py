"""robot_rl.cli.load: other processes' load, measured apart from this process's own threads, and the warning that
names the thread settings to use beside it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from robot_rl.cli.load import other_load, thread_warning

pytestmark = pytest.mark.skipif(other_load(0.01) is None, reason="no /proc: the load is measured on Linux only")


def test_another_process_counts_and_this_ones_threads_do_not():
    stop = time.time() + 0.6

    def spin() -> None:
        while time.time() < stop:
            pass

    own = threading.Thread(target=spin)
    own.start()
    quiet = other_load(0.3)
    own.join()
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.2: pass"])
    try:
        time.sleep(0.3)  # the child is up and spinning
        loaded = other_load(0.3)
    finally:
        busy.wait()
    assert loaded - quiet >= 0.6  # one core's worth more (less the sampling's coarseness and the CI's other load)


def test_the_warning_names_the_settings_only_where_a_thread_must_wait():
    assert thread_warning(2, 2, 1.0) is not None and "torch_threads=1 update_threads=1" in thread_warning(2, 2, 1.0)
    assert thread_warning(2, 2, 0.3) is None  # nothing much else runs
    assert thread_warning(1, 2, 1.0) is None  # one thread waits on nobody
    assert thread_warning(2, 8, 1.0) is None  # enough free cores
    assert thread_warning(2, 2, None) is None  # not measurable here


def test_robot_rl_train_warns_beside_a_busy_core(tmp_path, capsys, monkeypatch):
    from robot_rl.cli import build
    from robot_rl.cli.main import main

    monkeypatch.setattr(build, "available_cores", lambda: 2)
    monkeypatch.setattr(build, "other_load", lambda sample_s: 1.0)
    small = ["train", "task=so101_reach", "sim.num_envs=2", "total_steps=96", "eval.enabled=false",
             "logger.progress=false", "logger.tensorboard=false"]
    assert main([*small, f"run_dir={tmp_path / 'a'}"]) == 0  # PPO's update on 2 threads by default
    assert "other processes hold 1.0 of this machine's 2 cores" in capsys.readouterr().err
    assert main([*small, "update_threads=1", f"run_dir={tmp_path / 'b'}"]) == 0
    assert "other processes hold" not in capsys.readouterr().err
