"""FlashSAC on so101_lift from scratch, with logged demonstrations (RLPD 50/50 batches) and with a person taking over
online (HIL-SERL), at equal env steps.

1. **Demos.** ``robot-rl collect task=so101_lift env_state=true task.cameras=[]`` records ``--demos`` episodes of the
   scripted expert (``--quality``: 1.0 the expert as written; lower adds its flaws: noise, pauses, detours, missed
   grasps, dropped cubes) into a LeRobotDataset v3 (parquet only, no cameras).
2. **Training.** ``robot-rl train task=so101_lift algo=flashsac`` built the CLI's way (``robot_rl.cli.build``), once
   as it is and once with ``demo_dataset.root=<the demos>``, per seed; everything else identical (configs/algo/
   flashsac.yaml: 16 envs, batch 256, ...). Every ``--eval-every`` env steps the deterministic policy is evaluated
   on 50 seeded episodes (the same seeds for every run). Runs go ``--workers`` at a time, one process each with one
   torch thread, so two fit two cores.
3. **HIL** (the ``hil`` arms): no demos; ``hil.person=expert`` instead: the same scripted expert watches the
   training and takes over, and its transitions make up RLPD's offline half. ``hil``: where the policy's action
   strays from its own (``hil.judge=gap``, ``robot_rl.hil.ActionGap``); ``hil_deadline``: from step 50 of an
   episode the policy has not finished, to its end (``hil.judge=deadline``). Evaluations are the policy's alone;
   each point also records the env steps the expert drove so far (to set beside the demos' frames).
4. **Result.** Success against env steps (env steps do not depend on how loaded the machine is; the wall-clock does,
   and is recorded too); the env steps each run took to reach ``--target`` success. Goal: with demos, ``--target``
   in at most half the env steps from scratch needs (a run that never gets there counts as the budget, so the ratio
   is then an upper bound). The HIL arm's ratio is reported beside it.

    python benchmarks/flashsac_demos.py                      # 50 expert demos, 3 seeds, 250k env steps, all arms
    python benchmarks/flashsac_demos.py --arms hil --reuse benchmarks/results/flashsac_demos.json   # one arm anew
    python benchmarks/flashsac_demos.py --seeds 0 --env-steps 60000 --name flashsac_demos_reduced   # a short pass

Sizing: FlashSAC steps so101_lift at ~1,000 env steps/s per process with one torch thread and two processes on 2
cores (2026-12-07), so a 250k run takes ~4-5 min with its 26 evaluations; 6 runs (two arms, 3 seeds) took 17 min.
A pass with other settings than the defaults is marked ``"reduced": true`` in its JSON; keep it under another
``--name``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, goal, save_figure, write_result

TASK, EVAL_EPISODES, EVAL_SEED = "so101_lift", 50, 10_000
ARMS = ("scratch", "demos", "hil", "hil_deadline")
HIL_ARMS = {"hil": ["hil.person=expert", "hil.judge=gap"], "hil_deadline": ["hil.person=expert", "hil.judge=deadline"]}


def collect_demos(root: Path, episodes: int, quality: float, seed: int) -> dict[str, Any]:
    """Record the demonstrations with ``robot-rl collect`` (state columns, no cameras)."""
    from robot_rl.cli.build import compose
    from robot_rl.cli.collect import collect

    t = time.perf_counter()
    cfg = compose("collect", [f"task={TASK}", f"episodes={episodes}", f"dataset.root={root}", "env_state=true",
                              "task.cameras=[]", f"quality={quality}", f"seed={seed}", "sim.num_envs=16",
                              "sim.num_threads=2", "progress=false"])
    out = collect(cfg)
    return {"episodes": out.episodes, "successes": out.successes, "frames": out.frames,
            "seconds": round(time.perf_counter() - t, 1), "quality": quality, "seed": seed}


def train_run(arm: str, seed: int, demos: str | None, env_steps: int, eval_every: int,
              extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One FlashSAC run as ``robot-rl train`` builds it (with ``demo_dataset.root`` for the demos arm,
    ``HIL_ARMS``' settings for the hil arms; ``extra`` overrides for every arm), driven iteration by iteration to
    ``env_steps``, evaluated every ``eval_every`` env steps (the clock excludes it)."""
    import torch
    from omegaconf import OmegaConf

    from robot_rl.checkpoint import CheckpointManager
    from robot_rl.cli.build import (
        build_algorithm,
        build_demo_buffer,
        build_env,
        build_hil,
        build_runner,
        compose,
        seed_everything,
    )
    from robot_rl.cli.config import DemoDatasetSettings, HilSettings
    from robot_rl.evaluation import evaluate
    from robot_rl.logging import LoggerConfig, RunLogger
    from robot_rl.runners.common import RunLimits
    from sim.config import SimConfig
    from sim.registry import config_from_dict, make_env, task_config

    torch.set_num_threads(1)
    overrides = [f"task={TASK}", "algo=flashsac", f"seed={seed}", "sim.num_threads=1",
                 *HIL_ARMS.get(arm, []), *extra]
    cfg = OmegaConf.to_container(compose("train", overrides), resolve=True)
    algo_raw, task_raw = dict(cfg["algo"]), dict(cfg["task"])
    algo_name = algo_raw.pop("name")
    seed_everything(seed)
    env = build_env(task_raw, cfg["sim"])
    algo, runner_keys = build_algorithm(algo_name, algo_raw, env, torch.device("cpu"))
    task_cfg = config_from_dict(task_raw.pop("name"), task_raw)
    demo = build_demo_buffer(DemoDatasetSettings(root=demos), algo_name, env, algo, task_cfg, torch.device("cpu"))
    hil = build_hil(HilSettings(**cfg["hil"]), algo_name, env, seed)
    tmp = Path(tempfile.mkdtemp(prefix=f"flashsac_demos_{arm}_{seed}_"))
    logger = RunLogger(tmp, LoggerConfig(progress=False, tensorboard=False))
    runner = build_runner(algo_name, env, algo, runner_keys, RunLimits(total_steps=None, max_minutes=1e9, seed=seed),
                          logger, CheckpointManager(tmp / "c"), {}, demo, hil=hil)
    ev = make_env(TASK, SimConfig(num_envs=EVAL_EPISODES, num_threads=1, seed=EVAL_SEED), task_config(TASK))
    policy = algo.policy
    curve, next_eval = [], 0
    runner.start()
    while True:
        if runner.env_steps >= next_eval or runner.env_steps >= env_steps:
            policy.eval()
            r = evaluate(ev, lambda o: policy.act(o, deterministic=True), EVAL_EPISODES, seed=EVAL_SEED)
            point = {"env_steps": runner.env_steps, "wall_s": round(runner.elapsed_s, 1),
                     "success_rate": round(r.success_rate, 4), "mean_return": round(r.mean_return, 3)}
            if hil is not None:  # env steps the expert drove so far, the share of all, take-overs
                rep = hil.report()
                point.update({"expert_steps": int(rep["hil/steps/human"]),
                              "intervention_rate": round(rep["hil/intervention_rate"], 4),
                              "takeovers": int(rep["hil/takeovers"])})
            curve.append(point)
            print(f"  {arm:7s} seed {seed}: {runner.env_steps:7d} env steps {runner.elapsed_s:6.1f} s "
                  f"success {r.success_rate:.2f} return {r.mean_return:8.2f}", flush=True)
            next_eval += eval_every
            if runner.env_steps >= env_steps:
                break
        runner.run_iteration()
    env.close()
    ev.close()
    logger.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return {"arm": arm, "seed": seed, "curve": curve,
            "demo_transitions": 0 if demo is None else demo.num_transitions}


def _job(args: tuple) -> dict[str, Any]:
    return train_run(*args)


def steps_to(curve: list[dict[str, Any]], target: float) -> int | None:
    """Env steps at the first evaluation with success >= target (None: never)."""
    return next((p["env_steps"] for p in curve if p["success_rate"] >= target), None)


def summarize(runs: list[dict[str, Any]], target: float, budget: int) -> dict[str, Any]:
    """Per arm that ran: env steps to the target per seed, their median (a run that never got there counts as the
    budget), final success (the hil arms: also the env steps the expert drove until the target and in all); and the
    ratio of each arm's median to scratch's."""
    out: dict[str, Any] = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        hits = [steps_to(r["curve"], target) for r in mine]
        out[arm] = {"seeds": [r["seed"] for r in mine], "env_steps_to_target": hits,
                    "env_steps_to_target_median": statistics.median([budget if h is None else h for h in hits]),
                    "final_success": [r["curve"][-1]["success_rate"] for r in mine]}
        if arm in HIL_ARMS:
            out[arm]["expert_steps_to_target"] = [
                next((p["expert_steps"] for p in r["curve"] if p["success_rate"] >= target), None) for r in mine]
            out[arm]["expert_steps_total"] = [r["curve"][-1]["expert_steps"] for r in mine]
            out[arm]["final_intervention_rate"] = [r["curve"][-1]["intervention_rate"] for r in mine]
    for arm in ARMS[1:]:
        if arm in out and "scratch" in out:
            out[f"ratio_{arm}_over_scratch"] = round(out[arm]["env_steps_to_target_median"]
                                                    / out["scratch"]["env_steps_to_target_median"], 4)
    if "scratch" in out:
        out["scratch_reached_target"] = all(h is not None for h in out["scratch"]["env_steps_to_target"])
    return out


def plot(runs: list[dict[str, Any]], target: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hil = [r for r in runs if r["arm"] in HIL_ARMS]
    fig, axes = plt.subplots(1, 2 if hil else 1, figsize=(12 if hil else 7, 4.2), squeeze=False)
    ax = axes[0, 0]
    colours = dict(zip(ARMS, ("tab:gray", "tab:blue", "tab:orange", "tab:green"), strict=True))
    for arm, colour in colours.items():
        for i, r in enumerate(x for x in runs if x["arm"] == arm):
            xs = [p["env_steps"] for p in r["curve"]]
            ys = [p["success_rate"] for p in r["curve"]]
            ax.plot(xs, ys, color=colour, alpha=0.9, label=arm if i == 0 else None, marker=".")
    if hil:  # how much of the training the expert drove, per seed
        side = axes[0, 1]
        for r in hil:
            pts = r["curve"][1:]  # the first point is before any step
            first = r is next(x for x in hil if x["arm"] == r["arm"])
            side.plot([p["env_steps"] for p in pts], [p["intervention_rate"] for p in pts], color=colours[r["arm"]],
                      alpha=0.9, marker=".", label=r["arm"] if first else None)
        side.set_xlabel("env steps")
        side.set_ylabel("share of env steps the expert drove (run so far)")
        side.set_ylim(-0.02, 1.02)
        side.set_title("hil arms: the expert's share (cumulative, one line per seed)", fontsize=9)
        side.legend()
    ax.axhline(target, color="k", lw=0.8, ls=":")
    ax.set_xlabel("env steps")
    ax.set_ylabel(f"success rate ({EVAL_EPISODES} seeded episodes)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.legend()
    save_figure(fig, path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demos", type=int, default=50, help="scripted demonstration episodes")
    p.add_argument("--quality", type=float, default=1.0, help="the expert's quality in [0, 1] (sim.experts)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--env-steps", type=int, default=250_000, help="env steps per run (every arm)")
    p.add_argument("--eval-every", type=int, default=10_000, help="env steps between evaluations")
    p.add_argument("--target", type=float, default=0.8, help="success rate the env steps are counted to")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="the arms to run")
    p.add_argument("--reuse", type=Path, default=None,
                   help="a result JSON of this benchmark with the same settings: its runs of the arms not in --arms "
                        "join this pass's")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a `robot-rl train` override for every arm, e.g. algo.updates_per_step=2 (repeatable)")
    p.add_argument("--workers", type=int, default=2, help="runs at a time (one process and core each)")
    p.add_argument("--data", type=Path, default=None, help="demo dataset folder (default: a new temporary one)")
    p.add_argument("--name", default="flashsac_demos", help="result name (benchmarks/results/<name>.json/.png)")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()

    settings = {"task": TASK, "demos": a.demos, "quality": a.quality, "seeds": a.seeds, "env_steps": a.env_steps,
                "eval_every": a.eval_every, "target": a.target,
                "eval": f"{EVAL_EPISODES} deterministic episodes, reset seed {EVAL_SEED}",
                "algo": "configs/algo/flashsac.yaml (16 envs), algo.demo_fraction 0.5 with demos or interventions",
                "overrides": a.overrides, "workers": a.workers, "torch_threads": 1}
    record: dict[str, Any] = {}
    reused: list[dict[str, Any]] = []
    if a.reuse is not None:
        old = json.loads(a.reuse.read_text())
        differ = [k for k in ("demos", "quality", "seeds", "env_steps", "eval_every", "overrides")
                  if old["settings"].get(k) != settings[k]]
        if differ:
            raise SystemExit(f"--reuse {a.reuse}: its settings differ from this pass's in {differ}")
        reused = [r for r in old["runs"] if r["arm"] not in a.arms]
        record.update({k: old[k] for k in ("collect",) if k in old})
        record["reused_runs_from"] = {"file": str(a.reuse), "date": old.get("date"), "commit": old.get("commit"),
                                      "arms": sorted({r["arm"] for r in reused})}
    data = a.data or Path(tempfile.mkdtemp(prefix="flashsac_demos_data_")) / "demos"
    t0 = time.perf_counter()
    if "demos" in a.arms and not (data / "meta" / "info.json").is_file():
        record["collect"] = collect_demos(data, a.demos, a.quality, seed=123)
        print(f"collected {record['collect']}", flush=True)
    jobs = [(arm, s, str(data) if arm == "demos" else None, a.env_steps, a.eval_every, tuple(a.overrides))
            for s in a.seeds for arm in ARMS if arm in a.arms]
    with mp.get_context("spawn").Pool(a.workers) as pool:
        runs = reused + pool.map(_job, jobs, chunksize=1)
    summary = summarize(runs, a.target, a.env_steps)
    pct = round(a.target * 100)
    goals = []
    if "ratio_demos_over_scratch" in summary:
        goals = [goal(f"env_steps_to_{pct}pct_success_demos_over_scratch_{TASK}",
                      summary["ratio_demos_over_scratch"], 0.5, "<="),
                 goal(f"success_with_demos_at_{a.env_steps}_env_steps_{TASK}",
                      statistics.median(summary["demos"]["final_success"]), a.target, ">=")]
    arms = [arm for arm in ARMS if arm in summary]
    title = f"FlashSAC {TASK}, seeds {a.seeds}: {', '.join(arms)} ({a.demos} demos)"
    a.out.mkdir(parents=True, exist_ok=True)
    plot(runs, a.target, a.out / f"{a.name}.png", title)
    reduced = (a.demos, a.quality, a.seeds, a.env_steps, a.target, a.overrides) != (
        p.get_default("demos"), p.get_default("quality"), p.get_default("seeds"), p.get_default("env_steps"),
        p.get_default("target"), p.get_default("overrides"))
    data_out = {"reduced": reduced, "settings": settings,
                **record, "summary": summary, "runs": runs, "total_s": round(time.perf_counter() - t0, 1),
                "notes": "A run that never reached the target counts as the budget in the medians: the ratio is "
                         "then an upper bound of the true one. Wall-clock seconds are from runs sharing the "
                         "machine (--workers at a time) and are not comparable across machines; env steps are."}
    path = write_result(a.name, data_out, goals, a.out)
    if a.data is None:  # the temporary demo dataset made for this run
        shutil.rmtree(data.parent, ignore_errors=True)
    print(f"wrote {path}; goals: {goals}", flush=True)


if __name__ == "__main__":
    main()
