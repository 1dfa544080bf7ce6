"""OpenMP's spin default (robot_rl.openmp_spin): set before torch loads, never over a user's choice, and a warning
when it comes too late to act while torch runs on several threads next to the CPU simulator."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from robot_rl import OPENMP_SPIN_DEFAULT, openmp_spin

ROOT = Path(__file__).resolve().parents[1]


def test_sets_the_spin_count_when_nothing_is_chosen_and_torch_is_not_loaded():
    env: dict[str, str] = {}
    assert openmp_spin(env, openmp_loaded=False) == "set"
    assert env == {"GOMP_SPINCOUNT": OPENMP_SPIN_DEFAULT}


@pytest.mark.parametrize("chosen", [{"GOMP_SPINCOUNT": "5"}, {"OMP_WAIT_POLICY": "PASSIVE"},
                                    {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "INFINITE"}])
def test_a_users_choice_is_left_alone(chosen):
    env = dict(chosen)
    assert openmp_spin(env, openmp_loaded=False) == "user"
    assert env == chosen


def test_nothing_is_set_once_torch_is_loaded():
    env: dict[str, str] = {}
    assert openmp_spin(env, openmp_loaded=True) == "late"
    assert env == {}


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          check=True)


MAKE_ENV = ("torch.set_num_threads(2)\n"
            "from sim.config import SimConfig\n"
            "from sim.registry import make_env\n"
            "make_env('so101_reach', SimConfig(num_envs=2, num_threads=1)).close()\n"
            "print('one physics thread done', file=sys.stderr, flush=True)\n"
            "make_env('so101_reach', SimConfig(num_envs=2, num_threads=2)).close()\n"
            "make_env('so101_reach', SimConfig(num_envs=2, num_threads=2)).close()\n"
            "print(os.environ.get('GOMP_SPINCOUNT'), robot_rl.OPENMP_SPIN)\n")


def test_importing_sim_first_sets_it_for_the_process_and_the_simulator_stays_quiet():
    out = _run("import os\nimport sys\nimport sim\nimport robot_rl\nimport torch\n" + MAKE_ENV)
    assert out.stdout.split() == [OPENMP_SPIN_DEFAULT, "set"]
    assert "busy-wait" not in out.stderr


def test_torch_imported_first_leaves_it_unset_and_the_cpu_simulator_says_how_to_fix_it():
    out = _run("import os\nimport sys\nimport torch\nimport sim\nimport robot_rl\n" + MAKE_ENV)
    assert out.stdout.split() == ["None", "late"]
    assert f"GOMP_SPINCOUNT={OPENMP_SPIN_DEFAULT}" in out.stderr and "Import sim or robot_rl before torch" in out.stderr
    # only where the physics has threads of its own for torch's to spin against, and once
    assert out.stderr.index("one physics thread done") < out.stderr.index("busy-wait")
    assert out.stderr.count("busy-wait") == 1
