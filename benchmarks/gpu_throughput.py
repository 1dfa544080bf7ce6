"""MJX and MuJoCo Warp throughput on a GPU: env-steps/s of our tasks at thousands of envs, compile time apart, and
end to end.

For each backend (``mjx``, then ``warp`` when mujoco_warp is installed), each task (humanoid_walk, then so101_lift)
and N in 1024, 4096, 8192:

* compile   - seconds to jit the physics step and the reset forward (all sizes of a task compiled concurrently);
* physics   - ``MjxPhysics.step`` alone, controls held: env-steps/s (each = ``decimation`` physics steps);
* env       - ``MujocoFamilyEnv.step`` with random actions: task observations, rewards, terminations, auto-resets
              and fault checks included (what a learner sees);
* mlp       - a "PPO-shaped" loop: actor + critic MLPs ([512, 256, 128], ELU) on the batched observations every
              step, a Gaussian sample, ``env.step``: the collection side of on-policy RL;
* ppo       - (humanoid_walk, N = 4096) the real ``robot_rl`` PPO runner for a few iterations (24 steps per env,
              5 epochs x 4 minibatches): end-to-end env-steps/s, updates included.

Anchors (other systems, other hardware; for orientation only): mjlab ~125 k env-steps/s for a G1 at 4096 envs on
one RTX 5090; MuJoCo Playground ~47 k end-to-end PPO steps/s on an A100. Goal here: humanoid_walk env-steps/s
>= 100 k at 4096 envs on an H200.

    python benchmarks/gpu_throughput.py --out DIR          # on a GPU machine, ~5 minutes
    python benchmarks/gpu_throughput.py --quick --out DIR  # tiny sizes on the CPU: checks that everything runs

Results go to DIR/gpu_throughput.json (rewritten after every measurement, so a timeout keeps what was done)
and DIR/gpu_throughput.png.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.common import RESULTS, goal, save_figure, write_result

NAME = "gpu_throughput"
ANCHORS = {
    "mjlab_g1_rtx5090_4096_env_steps_per_s": 125_000,
    "playground_ppo_a100_end_to_end_steps_per_s": 47_000,
}


def recorded_commit(given: str | None) -> str:
    """The commit the record names: ``git rev-parse HEAD`` of this checkout; where there is no .git (a device
    machine gets the working tree only), the full 40-hex hash given by ``--commit`` / ``GIT_COMMIT``, checked here
    before any measuring. (A record once said "4fd", which is no commit.)"""
    try:
        head = subprocess.check_output(["git", "rev-parse", "HEAD"], text=True, cwd=Path(__file__).parent,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        head = None
    if head is not None:
        if given is not None and not head.startswith(given):
            raise SystemExit(f"--commit/GIT_COMMIT {given!r} is not this checkout's HEAD {head}")
        return head
    if given is None or not re.fullmatch(r"[0-9a-f]{40}", given):
        raise SystemExit(f"no .git here: pass the full commit, GIT_COMMIT=$(git rev-parse HEAD), got {given!r}")
    return given


def say(*a: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.perf_counter()
        self.rows: list[dict] = []
        self.ppo: dict = {}
        self.notes: list[str] = []
        self.device = args.device

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over_budget(self, reserve: float = 0.0, limit: float | None = None) -> bool:
        return self.elapsed() + reserve > (limit or self.args.budget_s)

    # ------------------------------------------------------------------------------------------ measures
    def build_envs(self, task: str, sizes: list[int], backend: str = "mjx") -> dict[int, object]:
        from sim.config import SimConfig
        from sim.registry import make_env

        envs, compile_s = {}, {}
        for n in sizes:
            t = time.perf_counter()
            envs[n] = make_env(task, SimConfig(backend=backend, num_envs=n, device=self.device, seed=0))
            say(f"{task} N={n}: model on device in {time.perf_counter() - t:.1f} s")

        def compile_one(n: int) -> float:
            t = time.perf_counter()
            envs[n].physics.precompile(envs[n].task.decimation)
            return time.perf_counter() - t

        say(f"{task}: compiling step + reset forward for N={sizes} ({len(sizes)} at once) ...")
        t = time.perf_counter()
        with ThreadPoolExecutor(len(sizes) if backend == "mjx" else 1) as pool:  # Warp loads kernels once
            for n, s in zip(sizes, pool.map(compile_one, sizes)):
                compile_s[n] = s
        wall = time.perf_counter() - t
        say(f"{task}: compiled in {wall:.1f} s wall ({', '.join(f'N={n}: {s:.1f} s' for n, s in compile_s.items())})")
        self.compile = {"task": task, "wall_s": wall, "per_size_s": compile_s}
        return envs

    def timed(self, fn, n: int) -> float:
        """env-steps/s of ``fn`` (one control step of n envs): up to --steps calls, at most --max-s seconds."""
        fn()  # warm-up
        sync()
        calls, t = 0, time.perf_counter()
        while calls < self.args.steps and (calls < 3 or time.perf_counter() - t < self.args.max_s):
            fn()
            calls += 1
        sync()
        return calls * n / (time.perf_counter() - t)

    def measure(self, task: str, n: int, env) -> dict:
        from policies import keys

        dec = env.task.decimation
        row = {"task": task, "backend": env.cfg.backend, "num_envs": n, "decimation": dec,
               "compile_s": self.compile["per_size_s"][n],
               "compile_wall_s_all_sizes": self.compile["wall_s"], "model": env.physics.describe()}
        t = time.perf_counter()
        env.reset(seed=0)
        sync()
        row["first_reset_s"] = time.perf_counter() - t
        # physics alone, controls held
        phys, ctrl = env.physics, env.physics.state.ctrl.clone()
        row["physics_env_steps_per_s"] = self.timed(lambda: phys.step(ctrl, dec), n)
        row["physics_substeps_per_s"] = row["physics_env_steps_per_s"] * dec
        # the full env step, random actions
        env.reset(seed=0)
        gen = torch.Generator(device=env.device).manual_seed(0)
        acts = [torch.rand(n, env.action_dim, generator=gen, device=env.device) * 2 - 1 for _ in range(8)]
        ended, calls = [0], [0]

        def env_step() -> None:
            _, _, term, trunc, _ = env.step(acts[calls[0] % 8])
            ended[0] += int((term | trunc).sum())
            calls[0] += 1

        row["env_steps_per_s"] = self.timed(env_step, n)
        row["episodes_ended_per_step"] = ended[0] / max(calls[0], 1)
        # PPO-shaped collection: actor + critic MLPs every step on the device
        actor = _mlp(env.obs_spec.shapes[keys.POLICY][0], env.action_dim, env.device)
        critic = _mlp(env.obs_spec.shapes[keys.CRITIC][0], 1, env.device)
        cur = [env.reset(seed=0)[0]]

        @torch.no_grad()
        def mlp_step() -> None:
            mean = actor(cur[0][keys.POLICY])
            critic(cur[0][keys.CRITIC])
            cur[0] = env.step((mean + 0.5 * torch.randn_like(mean)).clamp(-1, 1))[0]

        row["mlp_loop_steps_per_s"] = self.timed(mlp_step, n)
        say(f"{task} N={n}: physics {row['physics_env_steps_per_s']:,.0f} env-steps/s "
            f"({row['physics_substeps_per_s']:,.0f} substeps/s), env.step {row['env_steps_per_s']:,.0f}/s, "
            f"+MLPs {row['mlp_loop_steps_per_s']:,.0f}/s; compile {row['compile_s']:.1f} s, "
            f"{row['episodes_ended_per_step']:.1f} episodes ended per step")
        return row

    def ppo_run(self, env, iterations: int, num_steps: int) -> dict:
        """The real robot_rl PPO runner on ``env``: end-to-end env-steps/s (first iteration = warm-up)."""
        from policies import keys
        from policies.gaussian import GaussianPolicy, GaussianPolicyConfig
        from robot_rl.algos.ppo import PPO, PPOConfig
        from robot_rl.checkpoint import CheckpointManager
        from robot_rl.logging import LoggerConfig, RunLogger
        from robot_rl.models.critics import CriticConfig, MLPCritic
        from robot_rl.runners.on_policy import OnPolicyRunner, OnPolicyRunnerConfig

        shapes = env.obs_spec.shapes
        hidden = [512, 256, 128]  # DESIGN.md §5: humanoids
        policy = GaussianPolicy(GaussianPolicyConfig(obs_dim=shapes[keys.POLICY][0], action_dim=env.action_dim,
                                                     hidden_dims=hidden))
        critic = MLPCritic(CriticConfig(obs_dim=shapes[keys.CRITIC][0], hidden_dims=hidden))
        algo = PPO(policy, critic, PPOConfig(entropy_coef=0.005), device=env.device)
        run_dir = Path(tempfile.mkdtemp(prefix="gpu_throughput_ppo_"))
        per_iter = num_steps * env.num_envs
        logger = RunLogger(run_dir, LoggerConfig(progress=False, tensorboard=False))
        runner = OnPolicyRunner(env, algo, OnPolicyRunnerConfig(num_steps=num_steps, total_steps=per_iter,
                                                                checkpoint_every=10**9), logger,
                                CheckpointManager(run_dir / "checkpoints"), meta={"task": env.task.name})
        out = {"num_envs": env.num_envs, "num_steps": num_steps, "iterations_timed": iterations - 1}
        t = time.perf_counter()
        runner.learn()  # warm-up iteration (+ the checkpoint the runner always writes at its end)
        sync()
        out["warmup_s"] = time.perf_counter() - t
        runner.cfg.total_steps = per_iter * iterations
        t = time.perf_counter()
        scalars = runner.learn()  # the timed iterations, and again one checkpoint at the end
        sync()
        out["steps_per_s"] = per_iter * (iterations - 1) / (time.perf_counter() - t)
        out["collect_fraction"] = scalars.get("perf/collect_fraction")
        out["last_iteration_fps"] = scalars.get("perf/fps")
        say(f"  PPO: {out['steps_per_s']:,.0f} env-steps/s end to end over {iterations - 1} iterations "
            f"(collection {100 * (out['collect_fraction'] or float('nan')):.0f}% of an iteration)")
        logger.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        return out

    # ------------------------------------------------------------------------------------------- output
    def write(self) -> Path:
        a = self.args
        rows = self.rows
        goals = []
        for r in rows:
            if r["task"] == "humanoid_walk" and r["num_envs"] == 4096:
                goals.append(goal(f"humanoid_walk_{r['backend']}_env_steps_per_s_4096", r["env_steps_per_s"],
                                  100_000, ">="))
        if self.ppo.get("steps_per_s") is not None:
            goals.append(goal(f"ppo_end_to_end_steps_per_s_humanoid_walk_{self.ppo['num_envs']}",
                              self.ppo["steps_per_s"], 47_000, ">="))
        import jax

        data = {
            "device": str(self.device),
            "jax": {"version": jax.__version__, "backend": jax.default_backend(),
                    "devices": [str(d) for d in jax.devices()]},
            "torch": torch.__version__,
            "quick": bool(a.quick),
            "timed_steps": a.steps,
            "elapsed_s": round(self.elapsed(), 1),
            "anchors": ANCHORS,
            "results": rows,
            "ppo": self.ppo,
            "notes": self.notes,
        }
        data["commit"] = a.commit  # recorded_commit(): checked at the start
        path = write_result(NAME, data, goals, Path(a.out))
        self.plot(Path(a.out) / f"{NAME}.png")
        return path

    def plot(self, path: Path) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        tasks = sorted({r["task"] for r in self.rows})
        if not tasks:
            return
        fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
        for ax, task in zip(axes[0], tasks):
            for backend, style in (("mjx", "o-"), ("warp", "s--")):
                rs = [r for r in self.rows if r["task"] == task and r["backend"] == backend]
                ns = [r["num_envs"] for r in rs]
                for key, label in (("physics_env_steps_per_s", "physics only"), ("env_steps_per_s", "env.step"),
                                   ("mlp_loop_steps_per_s", "env.step + MLPs")):
                    if rs:
                        ax.plot(ns, [r[key] for r in rs], style, label=f"{backend}: {label}")
            if task == "humanoid_walk" and self.ppo.get("steps_per_s"):
                ax.plot([self.ppo["num_envs"]], [self.ppo["steps_per_s"]], "k*", ms=12, label="PPO end to end")
                ax.axhline(100_000, color="gray", ls="--", lw=1, label="goal 100 k")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("num_envs")
            ax.set_ylabel("env-steps/s")
            ax.set_title(f"{task} ({self.device})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        save_figure(fig, path, dpi=110)


def _mlp(inp: int, out: int, device: str) -> torch.nn.Module:
    """[512, 256, 128] ELU, the humanoid PPO networks of DESIGN.md §5."""
    dims, layers = [inp, 512, 256, 128], []
    for a, b in itertools.pairwise(dims):
        layers += [torch.nn.Linear(a, b), torch.nn.ELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(dims[-1], out)).to(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(RESULTS), help="folder for the JSON and PNG")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few steps (a CPU check that all runs)")
    p.add_argument("--tasks", default="humanoid_walk,so101_lift")
    p.add_argument("--backends", default="mjx,warp", help="warp is skipped (with a note) without mujoco_warp")
    p.add_argument("--sizes", default=None, help="comma-separated N (default 1024,4096,8192; quick: 2,4)")
    p.add_argument("--steps", type=int, default=None, help="most timed control steps per measurement")
    p.add_argument("--max-s", type=float, default=None, help="most seconds per measurement (at least 3 steps)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no new task (and no PPO run) within 60 s of this many seconds")
    p.add_argument("--hard-s", type=float, default=None,
                   help="start no measurement within 30 s of this (keep below the caller's timeout)")
    p.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    p.add_argument("--commit", default=os.environ.get("GIT_COMMIT"), help="recorded commit (no .git on the machine)")
    a = p.parse_args()
    a.commit = recorded_commit(a.commit)
    a.sizes = [int(s) for s in (a.sizes or ("2,4" if a.quick else "1024,4096,8192")).split(",")]
    a.steps = a.steps or (3 if a.quick else 100)
    a.max_s = a.max_s or (60.0 if a.quick else 6.0)
    a.budget_s = a.budget_s or (3600.0 if a.quick else 270.0)
    a.hard_s = a.hard_s or (3600.0 if a.quick else 420.0)
    if a.device == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    bench = Bench(a)

    def on_term(signum: int, _frame: object) -> None:  # `timeout` stops us: keep what was measured
        bench.notes.append(f"stopped by signal {signum} after {bench.elapsed():.0f} s")
        say(bench.notes[-1])
        bench.write()
        os._exit(124)  # compile threads may still run; exiting normally would wait for them

    signal.signal(signal.SIGTERM, on_term)
    import jax

    say(f"jax {jax.__version__} on {jax.devices()}; torch {torch.__version__}; device {a.device}; sizes {a.sizes}")
    ppo_n = a.sizes[len(a.sizes) // 2] if a.quick else 4096
    bench.write()  # a record exists even if the first compile never ends
    backends = a.backends.split(",")
    if "warp" in backends:
        try:
            import mujoco_warp  # noqa: F401 - the optional warp extra
            import warp as wp

            wp.config.log_level = wp.LOG_WARNING  # one "Module ... load" line per kernel module otherwise
        except ImportError as e:
            backends.remove("warp")
            bench.notes.append(f"warp: skipped, mujoco_warp not importable ({e}); pip install -e '.[warp]'")
            say(bench.notes[-1])
    for backend, task in itertools.product(backends, a.tasks.split(",")):
        if bench.over_budget(reserve=60.0):
            bench.notes.append(f"{backend} {task}: skipped, time budget ({a.budget_s:.0f} s) nearly spent")
            say(bench.notes[-1])
            continue
        try:
            envs = bench.build_envs(task, a.sizes, backend)
            for n in a.sizes:
                if bench.over_budget(reserve=30.0, limit=a.hard_s):
                    bench.notes.append(f"{backend} {task} N={n}: skipped, time budget spent")
                    say(bench.notes[-1])
                    continue
                bench.rows.append(bench.measure(task, n, envs[n]))
                bench.write()
            if backend == "mjx" and task == "humanoid_walk" and ppo_n in envs and not bench.over_budget(reserve=60.0):
                say(f"PPO runner on {task} N={ppo_n} ...")
                try:
                    bench.ppo = {"task": task, **bench.ppo_run(envs[ppo_n], iterations=2 if a.quick else 4,
                                                               num_steps=4 if a.quick else 24)}
                except Exception as e:  # noqa: BLE001 - a failing learner is reported, not fatal
                    bench.notes.append(f"PPO runner failed: {type(e).__name__}: {e}")
                    traceback.print_exc()
                bench.write()
            for env in envs.values():
                env.close()
            del envs
        except Exception as e:  # noqa: BLE001 - reported in the JSON; the other task still runs
            bench.notes.append(f"{backend} {task}: failed: {type(e).__name__}: {e}")
            traceback.print_exc()
        bench.write()
    path = bench.write()
    say(f"wrote {path} and {path.with_suffix('.png')} in {bench.elapsed():.0f} s")


if __name__ == "__main__":
    main()
