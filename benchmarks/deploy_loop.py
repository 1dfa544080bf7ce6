"""The deploy loop on the simulated SO-101: control-loop timing at 30 Hz, and sim-to-"real" transfer with and without
domain randomization (issue 16, "Show it").

Two parts, run separately (``--part``), each merged into ``benchmarks/results/deploy_loop.{json,png}``:

* ``--part transfer`` (success rates: load-immune). State policies are trained in the simulator with
  ``robot-rl train`` -- ``task=so101_reach algo=ppo`` and ``task=so101_lift algo=flashsac`` -- once as they are and
  once with domain randomization (``sim.randomization.*``: friction, masses, joint damping, actuator gain, action
  latency; ``--dr``), the same env-step / wall-clock budget for both. Each policy is then deployed through our deploy
  path (``real.teleop.guarded_session``: ``RobotEnv`` + ``SafetyFilter`` + ``PolicyDriver``, as ``robot-rl deploy``
  runs it) on ``so101_sim`` three times: with the training simulator's nominal physics (the reference), with other
  physical parameters and action latency inside the DR ranges (``--shift``: the "real" arm) and with a harder shift
  past them (``--hard-shift``: latency 4 ticks, servo gain x0.6). Success rate over ``--episodes`` seeded
  scenes (the same seeds for every policy and arm).
* ``--part timing`` (needs a quiet machine: run it last, when nothing heavy runs). ``robot-rl deploy``'s loop paced at
  30 Hz (``ControlClock``, sleeping) on ``so101_sim`` with a state policy (the reach PPO policy of the transfer part,
  or an untrained one of the same size) and with the flow VLA on the CPU (``--vla`` a trained export, default an
  untrained ``FlowVLAConfig()`` of the default size at 64x64 with two cameras: the same compute). Tick work p50 / p99
  (ms) and missed deadlines (count) over ``--ticks`` ticks each; the load average and core count are recorded. The
  VLA runs twice: its chunk computed inside the tick that needs it (``flow_vla``) and in a background thread
  ``--lookahead`` ticks ahead (``flow_vla_async``: ``robot-rl deploy lookahead=2``).

    python benchmarks/deploy_loop.py --part transfer            # trains 4 policies (reuses finished ones in --work)
    python benchmarks/deploy_loop.py --part timing              # ~1 min, on a quiet machine

Goals (computed from the measurements): per task, the policy without DR solves its training simulator (>= 0.8: else
the comparison says little); on the shifted arm, the DR policy's success >= the policy's without DR; the DR policy
keeps >= 0.8 of its nominal success under the shift; at 30 Hz, the state policy's p99 tick
<= 33.3 ms with 0 missed deadlines, the VLA's p99 tick <= 33.3 ms (and, with asynchronous inference, 0 missed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, goal, save_figure, write_result

NAME = "deploy_loop"
TASKS = {"so101_reach": "ppo", "so101_lift": "flashsac"}
ARMS = ("no_dr", "dr")
# sim.randomization.* of the DR arm: ranges drawn per env at every reset (sim/randomization.py)
DR = {"friction": [0.6, 1.4], "mass": [0.75, 1.3], "joint_damping": [0.6, 1.6], "actuator_gain": [0.75, 1.25],
      "action_latency": [0, 2]}
# so101_sim's physical parameters for the "real" arm (real.config_sim_robot.SO101SimRobotConfig): other friction, masses,
# damping, servo gain and latency than the training simulator's nominal ones
SHIFT = {"friction_scale": 0.7, "mass_scale": 1.25, "damping_scale": 1.5, "actuator_gain_scale": 0.8,
         "action_latency_steps": 2}
# a harder "real" arm, past the DR ranges in latency and servo gain
HARD_SHIFT = {"friction_scale": 0.5, "mass_scale": 1.5, "damping_scale": 2.0, "actuator_gain_scale": 0.6,
              "action_latency_steps": 4}
EVAL_SEED = 20_000  # scene seed of episode i: EVAL_SEED + i, for every policy and arm
PERIOD_MS = 1000.0 / 30


def _kv(s: str) -> tuple[str, Any]:
    k, _, v = s.partition("=")
    if not _:
        raise argparse.ArgumentTypeError(f"expected key=value, got {s!r}")
    return k, json.loads(v)


# ------------------------------------------------------------------------------------------------ training
def train(task: str, arm: str, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``robot-rl train`` of one policy into ``run_dir`` (reused when a finished run is there)."""
    done = run_dir / "deploy_loop_train.json"
    if done.is_file():
        return json.loads(done.read_text())
    shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished run: trained again from the start
    algo = TASKS[task]
    steps = args.reach_steps if task == "so101_reach" else args.lift_steps
    minutes = args.reach_minutes if task == "so101_reach" else args.lift_minutes
    cmd = [sys.executable, "-m", "robot_rl.cli.main", "train", f"task={task}", f"algo={algo}", f"run_dir={run_dir}",
           f"seed={args.seed}", f"total_steps={steps}", f"max_minutes={minutes}", "eval.enabled=false",
           "torch_threads=1", "sim.num_threads=1", "logger.progress=false"]
    if arm == "dr":
        cmd += [f"sim.randomization.{k}={json.dumps(v).replace(' ', '')}" for k, v in args.dr.items()]
    t = time.perf_counter()
    log = run_dir.parent / f"{run_dir.name}.log"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise RuntimeError(f"training {task} {arm} failed (exit {rc}); see {log}")
    from robot_rl.checkpoint import load_meta

    _, meta = load_meta(run_dir)
    out = {"task": task, "algo": algo, "arm": arm, "run_dir": str(run_dir), "env_steps": meta.get("env_steps"),
           "wall_s": round(time.perf_counter() - t, 1), "command": " ".join(cmd[2:])}
    done.write_text(json.dumps(out, indent=2))
    return out


# ------------------------------------------------------------------------------------------------ deploying
def make_sim_robot(task: str, physics: dict[str, Any], cameras: list[str], size: tuple[int, int] = (64, 64)) -> Any:
    from real.config_sim_robot import SO101SimRobotConfig
    from real.sim_robot import SO101SimRobot

    return SO101SimRobot(SO101SimRobotConfig(task=task, camera_names=cameras, image_height=size[0],
                                             image_width=size[1], idle_reset_s=None, **physics))


def deploy(policy: Any, robot: Any, episodes: int, episode_len: int, realtime: bool, seed: int = EVAL_SEED,
           cameras: tuple[str, ...] = (), stop_on_success: bool = True, lookahead: int = 0) -> Any:
    """``robot-rl deploy``'s session (``guarded_session``: RobotEnv, SafetyFilter with the default limits, the
    watchdog) of ``policy`` on ``robot`` (``lookahead``: ``robot-rl deploy lookahead=``); returns the
    ``SessionResult``."""
    from real.robot_env import ControlClock, safe_connect
    from real.safety import SafetyConfig, SafetyFilter, limits_from_robot
    from real.teleop import PolicyDriver, guarded_session

    cfg = SafetyConfig(watchdog_s=2.0)  # a loaded shared machine: the measurement, not the watchdog, judges stalls
    safety = SafetyFilter(cfg, limits_from_robot(robot, cfg.margin_deg))
    safe_connect(robot, safety)
    kwargs = {"cameras": cameras, "fps": 30.0, "max_episode_length": episode_len,
              "clock": ControlClock(30, sleep=realtime)}
    return guarded_session(robot, safety, kwargs, episodes,
                           make_driver=lambda env: PolicyDriver(policy, safety, robot, env, lookahead), seed=seed,
                           stop_on_success=stop_on_success)


def transfer(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from robot_rl.cli.deploy import load_any_policy
    from sim.registry import task_config

    torch.set_num_threads(1)
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(task, arm) for task in args.tasks for arm in ARMS]  # a task's two arms side by side (equal load)
    with ThreadPoolExecutor(args.workers) as pool:
        done = pool.map(lambda ta: train(*ta, args.work / f"{ta[0]}_{ta[1]}", args), jobs)
        runs = {f"{task}/{arm}": r for (task, arm), r in zip(jobs, done, strict=True)}
    for k, r in runs.items():
        print(f"trained {k}: {r['env_steps']} env steps in {r['wall_s']} s", file=sys.stderr)
    conditions = {"nominal": {}, "shifted": dict(args.shift), "shifted_hard": dict(args.hard_shift)}
    success: dict[str, dict[str, dict[str, Any]]] = {}
    for task in args.tasks:
        length = task_config(task).episode_length
        for arm in ARMS:
            policy = load_any_policy(runs[f"{task}/{arm}"]["run_dir"], torch.device("cpu"))
            for cond, physics in conditions.items():
                t = time.perf_counter()
                res = deploy(policy, make_sim_robot(task, physics, []), args.episodes, length, realtime=False)
                rate = res.successes / res.episodes
                success.setdefault(task, {}).setdefault(arm, {})[cond] = {
                    "success_rate": rate, "successes": res.successes, "episodes": res.episodes,
                    "ticks": res.frames, "clips": res.clips, "rejects": res.rejects,
                    "seconds": round(time.perf_counter() - t, 1)}
                print(f"{task} {arm} {cond}: success {rate:.2f} ({res.successes}/{res.episodes})", file=sys.stderr)
    return {"runs": runs, "success": success, "episodes": args.episodes, "eval_seed": EVAL_SEED,
            "dr": args.dr, "shift": dict(args.shift), "hard_shift": dict(args.hard_shift), "train_budget": {
                "so101_reach": {"total_steps": args.reach_steps, "max_minutes": args.reach_minutes},
                "so101_lift": {"total_steps": args.lift_steps, "max_minutes": args.lift_minutes}},
            "command": " ".join([Path(sys.executable).name, *sys.argv])}


# ------------------------------------------------------------------------------------------------ timing
def timing(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from policies import FlowVLAConfig, FlowVLAPolicy, load_policy
    from robot_rl.cli.deploy import load_any_policy

    torch.set_num_threads(1)
    load_before = os.getloadavg()
    out: dict[str, Any] = {}
    state_run = args.state_run or args.work / "so101_reach_no_dr"
    if (state_run / "deploy_loop_train.json").is_file() or args.state_run is not None:
        state_policy, state_src = load_any_policy(str(state_run), torch.device("cpu")), str(state_run)
    else:
        raise SystemExit(f"no trained reach policy in {state_run}: run --part transfer first (or --work, or "
                         "--state-run a `robot-rl train task=so101_reach` run)")
    if args.vla is not None:
        vla, vla_src = load_policy(args.vla), str(args.vla)
    else:
        torch.manual_seed(0)
        vla, vla_src = FlowVLAPolicy(FlowVLAConfig(vocab=["pick", "up", "the", "red", "cube", "and", "lift", "it"])), \
            "untrained FlowVLAConfig() (default size, 64x64, front + wrist)"
    h, w = vla.cfg.image_size
    cases = {"state_policy": (state_policy, "so101_reach", [], state_src, 0),
             "flow_vla": (vla, "so101_lift", list(vla.cfg.cameras), vla_src, 0),
             "flow_vla_async": (vla, "so101_lift", list(vla.cfg.cameras), vla_src, args.lookahead)}
    for name, (policy, task, cams, src, lookahead) in cases.items():
        policy = policy.to("cpu").eval()
        res = deploy(policy, make_sim_robot(task, {}, cams, (h, w)), 1, args.ticks, realtime=True,
                     cameras=tuple(cams), stop_on_success=False, lookahead=lookahead)
        c = res.clock
        out[name] = {"policy": src, "task": task, "cameras": cams, "image_size": [h, w], "ticks": int(c["ticks"]),
                     "work_p50_ms": c["work_p50_ms"], "work_p99_ms": c["work_p99_ms"],
                     "work_max_ms": c["work_max_ms"], "period_p50_ms": c["period_p50_ms"],
                     "period_p99_ms": c["period_p99_ms"], "missed_deadlines": int(c["missed"]),
                     "horizon": int(policy.horizon), "executed_steps": int(policy.executed_steps),
                     "lookahead": lookahead}
        if name == "flow_vla":  # the chunk inference alone (one call per executed_steps ticks), on a frame of the loop
            out[name].update(_inference_ms(policy, cams, (h, w)))
        print(f"timing {name}: {out[name]}", file=sys.stderr)
    out["load_average_1_5_15"] = {"before": [round(x, 2) for x in load_before],
                                  "after": [round(x, 2) for x in os.getloadavg()]}
    out["cores"] = os.cpu_count()
    out["fps"] = 30
    out["torch_threads"] = 1
    out["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    return out


def _inference_ms(policy: Any, cameras: list[str], size: tuple[int, int], calls: int = 30) -> dict[str, float]:
    """p50 / p99 ms of ``policy.act`` on one frame of the deploy loop's shapes (state [1, 6] degrees, uint8 images)."""
    import numpy as np
    import torch

    from policies import keys

    frame = {keys.OBS_STATE: torch.zeros(1, 6), keys.TASK: ["Pick up the red cube and lift it."],
             **{keys.lerobot_image_key(c): torch.randint(0, 256, (1, 3, *size), dtype=torch.uint8) for c in cameras}}
    ms = []
    with torch.no_grad():
        for _ in range(calls):
            t = time.perf_counter()
            policy.act(frame, deterministic=True)
            ms.append((time.perf_counter() - t) * 1e3)
    return {"inference_p50_ms": float(np.percentile(ms, 50)), "inference_p99_ms": float(np.percentile(ms, 99))}


# ------------------------------------------------------------------------------------------------ report
def goals_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    g = []
    tr = data.get("transfer")
    if tr:
        for task, arms in tr["success"].items():
            if set(arms) >= set(ARMS):
                # the comparison below means something only if training solved the task in its own simulator
                g.append(goal(f"no_dr_success_nominal_{task}", arms["no_dr"]["nominal"]["success_rate"], 0.8, ">="))
                g.append(goal(f"dr_minus_no_dr_success_shifted_{task}", arms["dr"]["shifted"]["success_rate"]
                              - arms["no_dr"]["shifted"]["success_rate"], 0.0, ">="))
                nominal = arms["dr"]["nominal"]["success_rate"]
                kept = arms["dr"]["shifted"]["success_rate"] / nominal if nominal > 0 else 0.0
                g.append(goal(f"dr_success_kept_under_shift_{task}", kept, 0.8, ">="))
                if "shifted_hard" in arms["dr"]:
                    g.append(goal(f"dr_minus_no_dr_success_shifted_hard_{task}", arms["dr"]["shifted_hard"]
                                  ["success_rate"] - arms["no_dr"]["shifted_hard"]["success_rate"], 0.0, ">="))
    tm = data.get("timing")
    if tm:
        g.append(goal("state_policy_p99_tick_ms_30hz", tm["state_policy"]["work_p99_ms"], round(PERIOD_MS, 1), "<="))
        g.append(goal("state_policy_missed_deadlines_30hz", tm["state_policy"]["missed_deadlines"], 0, "<="))
        g.append(goal("flow_vla_p99_tick_ms_30hz", tm["flow_vla"]["work_p99_ms"], round(PERIOD_MS, 1), "<="))
        if "flow_vla_async" in tm:  # the chunk computed in the background, `lookahead` ticks ahead
            g.append(goal("flow_vla_async_p99_tick_ms_30hz", tm["flow_vla_async"]["work_p99_ms"], round(PERIOD_MS, 1),
                          "<="))
            g.append(goal("flow_vla_async_missed_deadlines_30hz", tm["flow_vla_async"]["missed_deadlines"], 0, "<="))
    return g


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    tr = data.get("transfer")
    ax = axes[0]
    if tr:
        labels, xs = [], 0
        for task, arms in tr["success"].items():
            for arm in ARMS:
                if arm not in arms:
                    continue
                conds = [c for c in ("nominal", "shifted", "shifted_hard") if c in arms[arm]]
                for j, cond in enumerate(conds):
                    v = arms[arm][cond]["success_rate"]
                    color = {"nominal": "tab:gray", "shifted": "tab:red", "shifted_hard": "darkred"}[cond]
                    ax.bar(xs + 0.27 * j, v, 0.27, color=color, label=cond if xs == 0 else None)
                    ax.text(xs + 0.27 * j, v + 0.01, f"{v:.2f}", ha="center", fontsize=7)
                labels.append((xs + 0.27, f"{task.removeprefix('so101_')}\n{arm}"))
                xs += 1
        ax.set_xticks([x for x, _ in labels], [s for _, s in labels])
        ax.set_ylim(0, 1.1)
        ax.set_ylabel(f"success rate ({tr['episodes']} seeded episodes)")
        ax.set_title("so101_sim: training physics vs shifted physics + latency")
        ax.legend()
    ax = axes[1]
    tm = data.get("timing")
    if tm:
        names = [n for n in ("state_policy", "flow_vla", "flow_vla_async") if n in tm]
        for i, n in enumerate(names):
            ax.bar(i - 0.2, tm[n]["work_p50_ms"], 0.4, color="tab:blue", label="p50" if i == 0 else None)
            ax.bar(i + 0.2, tm[n]["work_p99_ms"], 0.4, color="tab:orange", label="p99" if i == 0 else None)
            ax.text(i, max(tm[n]["work_p99_ms"], tm[n]["work_p50_ms"]) + 1, f"missed {tm[n]['missed_deadlines']}",
                    ha="center", fontsize=8)
        ax.axhline(PERIOD_MS, color="k", ls="--", label="33.3 ms (30 Hz)")
        ax.set_xticks(range(len(names)), [n.replace("_async", f"\nasync L={tm[n].get('lookahead')}") for n in names])
        ax.set_ylabel("tick work, ms")
        ax.set_title(f"deploy loop at 30 Hz (load {tm['load_average_1_5_15']['before'][0]} on {tm['cores']} cores)")
        ax.legend()
    save_figure(fig, path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("transfer", "timing"), required=True)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--work", type=Path, default=Path("/tmp/deploy_loop"), help="training run folders (reused)")
    p.add_argument("--episodes", type=int, default=50, help="seeded deploy episodes per policy and physics")
    p.add_argument("--reach-steps", type=int, default=300_000, help="env steps of each reach training")
    p.add_argument("--reach-minutes", type=float, default=8.0, help="wall-clock cap of each reach training")
    p.add_argument("--lift-steps", type=int, default=250_000, help="env steps of each lift training")
    p.add_argument("--lift-minutes", type=float, default=30.0, help="wall-clock cap of each lift training")
    p.add_argument("--seed", type=int, default=0, help="training seed")
    p.add_argument("--workers", type=int, default=2, help="trainings run at a time (one process each)")
    p.add_argument("--dr", type=_kv, nargs="*", default=list(DR.items()),
                   help="sim.randomization.<key>=<json> of the DR arm, e.g. friction=[0.6,1.4]")
    p.add_argument("--shift", type=_kv, nargs="*", default=list(SHIFT.items()),
                   help="so101_sim fields of the shifted arm, e.g. mass_scale=1.25 action_latency_steps=2")
    p.add_argument("--hard-shift", type=_kv, nargs="*", default=list(HARD_SHIFT.items()),
                   help="so101_sim fields of a harder shifted arm")
    p.add_argument("--ticks", type=int, default=600, help="timing: 30 Hz ticks per policy")
    p.add_argument("--vla", type=Path, default=None, help="timing: an exported flow VLA (default: untrained)")
    p.add_argument("--state-run", type=Path, default=None,
                   help="timing: the state policy's run (default: the transfer part's reach policy without DR)")
    p.add_argument("--lookahead", type=int, default=2,
                   help="timing: ticks ahead the flow VLA's next chunk is computed in the background (flow_vla_async)")
    p.add_argument("--note", default=None, help="a note kept with this part's results (how it was sized, the load)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    args.dr = dict(args.dr)
    path = args.out / f"{NAME}.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data = {k: data[k] for k in ("transfer", "timing", "notes") if k in data}
    data[args.part] = transfer(args) if args.part == "transfer" else timing(args)
    if args.note:
        data.setdefault("notes", {})[args.part] = args.note
    write_result(NAME, data, goals_of(data), args.out)
    plot(data, args.out / f"{NAME}.png")
    print(json.dumps(goals_of(data), indent=1))


if __name__ == "__main__":
    main()
