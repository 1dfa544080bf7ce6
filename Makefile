# Set-up and the two jobs of the README. `python3` resolves to 3.12 here through .python-version (pyenv);
# set PY=/path/to/python3.12 elsewhere.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export MUJOCO_GL ?= egl

.PHONY: help setup train test test-slow bench-sim clean

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(wildcard plugins/*/pyproject.toml)
	$(PY) -c 'import sys; assert sys.version_info >= (3, 12), "robot_rl needs Python 3.12+ (LeRobot does); set PY=python3.12"'
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[all,dev]'
# LeRobot plugins (so101_sim robot, so101_sim_leader teleop, robot_rl policy): LeRobot's CLIs import them by name
	$(BIN)/pip install -q --no-build-isolation $(foreach p,$(wildcard plugins/lerobot_*),-e $(p))
	touch $@

train: setup  ## the main job: PPO on so101_reach on the CPU default, then a curve and a video
	$(BIN)/robot-rl train task=so101_reach algo=ppo

test: setup  ## the default test tier (slow learning checks excluded)
	$(BIN)/python -m pytest -q

test-slow: setup  ## the slow learning checks (pytest -m slow)
	$(BIN)/python -m pytest -q -m slow

bench-sim: setup  ## the simulator-throughput benchmark
	$(BIN)/python benchmarks/sim_throughput.py

clean:  ## remove the venv, runs and outputs
	rm -rf $(VENV) *.egg-info runs outputs
