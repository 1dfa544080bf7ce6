#!/usr/bin/env bash
# The GPU throughput check (issue 5) on a machine with python3.12, torch and jax[cuda] but no mujoco/mjx and no
# network: installs the wheels carried in .whl/ into /tmp/site, prints the GPU, runs benchmarks/gpu_throughput.py.
#
#   bash benchmarks/gpu_run.sh                 # results into $OUT (the device machine's), else benchmarks/results
#   bash benchmarks/gpu_run.sh --quick         # any extra arguments go to gpu_throughput.py
#
# .whl/ holds mujoco 4.0.0 (+ mujoco-core), mujoco-mjx 3.17.0, trimesh, gymnasium, farama-notifications, glfw and
# pyopengl (fetched with `pip download`, see the benchmark's docstring); everything else is on the machine.
# Set GIT_COMMIT=<hash> to record the commit when the checkout there has no .git.
set -uo pipefail
OUT=${OUT:-benchmarks/results}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=$SITE:$PWD
export PYTHONUNBUFFERED=1
export MUJOCO_GL=${MUJOCO_GL:-disable}  # no rendering here; skips OpenGL loading
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.6}  # JAX's pool; the rest for torch
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true
python3 -c "import jax, torch, mujoco; from mujoco import mjx; print('jax', jax.__version__, jax.devices(), \
'| torch', torch.__version__, torch.cuda.is_available(), '| mujoco', mujoco.__version__)" || exit 1
# Hard stop under 8 minutes (TIMEOUT_S); the benchmark budgets itself to ~5, rewrites its JSON after every
# measurement and once more when the timeout's SIGTERM arrives.
timeout -k 15 "${TIMEOUT_S:-450}" python3 benchmarks/gpu_throughput.py --out "$OUT" "$@" 2>&1 \
  | tee "$OUT/gpu_throughput.log"
exit "${PIPESTATUS[0]}"
