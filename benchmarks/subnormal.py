"""Subnormal floats in a trained ELU network's gradients, and what they cost PPO on the CPU.

Found by the soak test (``tests/sim/test_soak.py``): ``robot-rl train`` PPO so101_reach slowed from 6.5 k to 5.2-5.7 k
env steps/s over 2 M env steps, the time outside the simulator growing by 20-25 %, while its policy had long
converged. Resumed from its 2 M-step checkpoint, its update ran slower than a fresh run's. Counting the float32 outputs
of every torch op in one iteration: ~39 k subnormal values (below 1.2e-38), all from ``elu_backward``. An ELU's
backward computes grad·exp(x) from its input; a trained network has units far enough below 0 (x < -87) that exp(x)
is subnormal, and those gradients then go through the next layers' matrix products, which run 100-200x slower on
subnormal inputs. ``torch.set_flush_denormal(True)`` does not fix it at 2 threads: it sets the calling thread's
flags only, not those of torch's OpenMP workers (measured here on a bare matrix product).

The fix (``policies/mlp.py``): ELU in place, whose backward computes grad·(y + 1) from its output, exactly 0 once y
rounds to -1 (x < -17). Forward values are the same.

This runs, one at a time:
1. a bare matrix product [1536, 256] x [256, 256] on normal and on subnormal inputs, at 1 and 2 torch threads, with
   and without ``torch.set_flush_denormal(True)`` (each in its own process);
2. ``robot-rl train`` PPO so101_reach for ``--train-steps`` (default 1.5 M), to get a trained network;
3. alternating, ``--rounds`` times: resumed from that checkpoint for ``--ab-steps`` more env steps with the ELU out of
   place (as before) and in place (now); and a fresh run of ``--ab-steps`` with each. Per run: env steps/s, the time
   outside ``env.step`` per env step (the curve's own clocks), and the subnormal outputs of one iteration.

    python benchmarks/subnormal.py                 # ~20 min on 2 cores
    python benchmarks/subnormal.py --train-steps 500000 --rounds 1 --ab-steps 100000 --out /tmp/res   # a smoke run
    python benchmarks/subnormal.py --replot         # redraw the PNG from the committed JSON

Writes ``benchmarks/results/subnormal.json`` + ``subnormal.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, robot_rl_command, save_figure, write_result

NAME = "subnormal"
ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["train", "task=so101_reach", "algo=ppo", "eval.enabled=false", "logger.progress=false"]

# The start of every child: robot_rl before torch (the OpenMP spin, as robot-rl itself), and with argv[1] ==
# "out_of_place" the ELU built out of place (the code before the fix).
PREFIX = r"""
import sys
import robot_rl  # noqa: F401
from torch import nn
if sys.argv[1] == "out_of_place":
    init = nn.ELU.__init__
    nn.ELU.__init__ = lambda self, alpha=1.0, inplace=False: init(self, alpha, False)
"""

# The robot-rl CLI.
CHILD = PREFIX + r"""
from robot_rl.cli.main import main
sys.exit(main(sys.argv[2:]))
"""

# One iteration of a (resumed) run, counting the subnormal float32 outputs of each aten op.
COUNT = PREFIX + r"""
import collections, json
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from robot_rl.cli.build import build_training, compose
tiny = torch.finfo(torch.float32).tiny
class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.by_op = collections.Counter()
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(o, torch.Tensor) and o.dtype == torch.float32 and o.numel():
                k = int(((o != 0) & (o.abs() < tiny)).sum())
                if k:
                    self.by_op[str(func)] += k
        return out
t = build_training(compose("train", sys.argv[2:]))
t.runner.run_iteration()
count = Count()
with count:
    t.runner.run_iteration()
t.close()
print(json.dumps(dict(count.by_op)))
"""

MATMUL = r"""
import sys, time, json
import robot_rl  # noqa: F401
import torch
threads, ftz = int(sys.argv[1]), sys.argv[2] == "on"
torch.set_num_threads(threads)
a, b = torch.randn(1536, 256), torch.randn(256, 256)
sub = a * 1e-41  # every element subnormal (made before flushing is on)
torch.set_flush_denormal(ftz)
def ms(x):
    for _ in range(3):
        x @ b
    start = time.perf_counter()
    for _ in range(20):
        x @ b
    return 1e3 * (time.perf_counter() - start) / 20
print(json.dumps({"normal_ms": ms(a), "subnormal_ms": ms(sub)}))
"""


def child(script: str, args: list[str]) -> str:
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{args} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def rates(curve: Path, after_steps: int) -> dict[str, float]:
    """Env steps/s and µs per env step outside env.step over the run's iterations past ``after_steps`` (skipping
    the first 5: start-up)."""
    rows = [json.loads(line) for line in curve.read_text().splitlines()]
    rows = [r for r in rows if r["env_steps"] > after_steps][5:]
    a, b = rows[0], rows[-1]
    steps, wall, sim = b["env_steps"] - a["env_steps"], b["wall_s"] - a["wall_s"], b["sim_s"] - a["sim_s"]
    return {"env_steps_per_s": round(steps / wall, 1), "outside_env_step_us": round(1e6 * (wall - sim) / steps, 2),
            "env_step_us": round(1e6 * sim / steps, 2), "env_steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-steps", type=int, default=1_500_000)
    ap.add_argument("--ab-steps", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON in --out, run nothing")
    args = ap.parse_args()
    if args.replot:
        path = (args.out or RESULTS) / f"{NAME}.json"
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return
    work = Path(tempfile.mkdtemp(prefix="subnormal_"))
    variants = ("out_of_place", "in_place")

    matmul = {}
    for threads in (1, 2):
        for ftz in ("off", "on"):
            matmul[f"{threads}_threads_flush_denormal_{ftz}"] = json.loads(child(MATMUL, [str(threads), ftz]))
            print("matmul", threads, ftz, matmul[f"{threads}_threads_flush_denormal_{ftz}"], flush=True)

    trained = work / "trained"
    print(f"training {args.train_steps} env steps ...", flush=True)
    subprocess.run([*robot_rl_command(), *TRAIN, f"total_steps={args.train_steps}", f"run_dir={trained}"], cwd=ROOT,
                   check=True, capture_output=True)
    trained_steps = json.loads((trained / "curve.jsonl").read_text().splitlines()[-1])["env_steps"]
    training = rates(trained / "curve.jsonl", 0)

    runs = {f"{start}_{v}": [] for start in ("trained", "fresh") for v in variants}
    for r in range(args.rounds):
        for start in ("trained", "fresh"):
            for v in variants:
                run_dir = work / f"{start}_{v}_{r}"
                if start == "trained":
                    shutil.copytree(trained, run_dir)
                    extra = [f"resume={run_dir}", f"total_steps={trained_steps + args.ab_steps}"]
                else:
                    extra = [f"total_steps={args.ab_steps}"]
                child(CHILD, [v, *TRAIN, f"run_dir={run_dir}", *extra])
                got = rates(run_dir / "curve.jsonl", trained_steps if start == "trained" else 0)
                runs[f"{start}_{v}"].append(got)
                print(f"round {r} {start} {v}: {got}", flush=True)
                shutil.rmtree(run_dir)

    counts = {}
    for v in variants:
        run_dir = work / f"count_{v}"
        shutil.copytree(trained, run_dir)
        counts[v] = json.loads(child(COUNT, [v, *TRAIN[1:], f"run_dir={run_dir}", f"resume={run_dir}",
                                             f"total_steps={trained_steps + 10_000}", "logger.tensorboard=false"]
                                    ).strip().splitlines()[-1])
        print("subnormal outputs of one iteration,", v, counts[v], flush=True)

    summary = {k: {m: statistics.median(x[m] for x in v) for m in ("env_steps_per_s", "outside_env_step_us",
                                                                     "env_step_us")} for k, v in runs.items()}
    ratios = {start: round(summary[f"{start}_in_place"]["outside_env_step_us"]
                           / summary[f"{start}_out_of_place"]["outside_env_step_us"], 3) for start in ("trained", "fresh")}
    data = {"settings": {"train_steps": args.train_steps, "trained_env_steps": trained_steps,
                         "ab_steps": args.ab_steps, "rounds": args.rounds, "task": "so101_reach", "algo": "ppo"},
            "matmul_ms": matmul, "training_run": training, "runs": runs, "medians": summary,
            "outside_env_step_in_place_over_out_of_place": ratios,
            "subnormal_outputs_one_iteration": counts,
            "note": "One run at a time, alternating variants within each round; env steps/s and the time outside "
                    "env.step come from the runs' own curve clocks (sim_s: time in env.step)."}
    path = write_result(NAME, data, [], args.out)
    plot(data, path.with_suffix(".png"))
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {path}")


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.4))
    m = data["matmul_ms"]
    labels = list(m)
    x = range(len(labels))
    ax0.bar([i - 0.2 for i in x], [m[k]["normal_ms"] for k in labels], 0.4, label="normal inputs")
    ax0.bar([i + 0.2 for i in x], [m[k]["subnormal_ms"] for k in labels], 0.4, label="subnormal inputs")
    ax0.set_yscale("log")
    ax0.set_xticks(list(x), [k.replace("_threads_flush_denormal_", " thr\nflush ") for k in labels], fontsize=8)
    ax0.set_ylabel("ms per [1536,256]x[256,256]")
    ax0.legend(fontsize=8)
    ax0.set_title("a matrix product on subnormal floats", fontsize=9)
    runs = data["runs"]
    keys = list(runs)
    for i, k in enumerate(keys):
        vals = [r["outside_env_step_us"] for r in runs[k]]
        ax1.scatter([i] * len(vals), vals, color="C0" if "out_of_place" in k else "C1")
        ax1.hlines(statistics.median(vals), i - 0.3, i + 0.3, color="k")
    ax1.set_xticks(range(len(keys)), [k.replace("_", "\n", 1).replace("_", " ") for k in keys], fontsize=8)
    ax1.set_ylabel("µs per env step outside env.step")
    ax1.set_title("PPO so101_reach: ELU out of place (before) vs in place (now)", fontsize=9)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
