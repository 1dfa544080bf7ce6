"""Take-over triggers side by side (``robot_rl.hil``): one RECAP policy collects so101_lift episodes while its value
model watches, and the scripted expert, playing the human, takes over an episode when the trigger asks; every
trigger on the same seeds, one collection at a time.

What a HIL report needs (DESIGN.md §5): the collection's success rate, the share of episodes a person took over,
the share of frames they drove (their effort), take-overs per success, and where the trigger fired: how many steps
into the episode, and how the episodes it left to the policy ended (a missed failure is one the policy lost with no
one called in).

    # round 0 of the loop: the recap benchmark's mixed data and its recap_balanced run (~15 min here)
    python benchmarks/recap.py --methods recap_balanced --seeds 1 --steps 3000 --value-steps 1500 --loop-rounds 0 \
        --betas 2.5 --eval-episodes 50 --no-video --work /tmp/hil/recap --out /tmp/hil/recap_out
    python benchmarks/hil_triggers.py --run /tmp/hil/recap/recap_balanced_s0 --work /tmp/hil/collect --episodes 200

Recovery before the person (``robot-rl recap recovery=true``; the memory: the run's training data's intervention
frames, keyed by its value model): the ``+recovery`` arms send an episode's first request to a joint-space recovery
and only a later one to the person; ``recovery_only`` never calls the person. Their record goes to its own file:

    python benchmarks/hil_triggers.py --run /tmp/hil/recap/recap_balanced_s0 --work /tmp/hil/collect --episodes 200 \
        --triggers policy_alone,threshold,threshold+recovery,stall_w20_p0.25,stall_w20_p0.25+recovery,recovery_only \
        --name hil_recovery

Writes ``NAME.json`` + ``NAME.png`` into ``--out`` (default benchmarks/results; NAME ``--name``, default
hil_triggers); ``--plot-only`` redraws the PNG from the JSON there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import robot_rl  # noqa: F401, I001  (before torch: OpenMP's spin, robot_rl.OPENMP_SPIN)
import numpy as np
import torch

from benchmarks.common import RESULTS, save_figure, write_result
from benchmarks.recap import TASK, VISUAL_DR, _overrides

NAME = "hil_triggers"
# name -> robot-rl recap settings of the trigger; "policy_alone": nobody is called in (the baseline)
TRIGGERS: dict[str, list[str]] = {
    "policy_alone": ["interventions=false"],
    "threshold": ["intervene_trigger=threshold"],  # V < -0.8 for 3 steps (the loop's default)
    "threshold_-0.7": ["intervene_trigger=threshold", "intervene_below=-0.7"],
    "threshold_-0.6": ["intervene_trigger=threshold", "intervene_below=-0.6"],
    "stall_w20_p0.25": ["intervene_trigger=stall", "intervene_window=20", "intervene_min_progress=0.25"],
    "stall_w20_p0.5": ["intervene_trigger=stall", "intervene_window=20", "intervene_min_progress=0.5"],
    "stall_w10_p0.25": ["intervene_trigger=stall", "intervene_window=10", "intervene_min_progress=0.25"],
    "stall_w20_p0": ["intervene_trigger=stall", "intervene_window=20", "intervene_min_progress=0.0"],
    "stall_w20_p0.25_c-0.3": ["intervene_trigger=stall", "intervene_window=20", "intervene_min_progress=0.25",
                              "intervene_ceiling=-0.3"],
    "threshold+recovery": ["intervene_trigger=threshold", "recovery=true"],
    "threshold+recovery_k64": ["intervene_trigger=threshold", "recovery=true", "recovery_k=64"],
    "stall_w20_p0.25+recovery": ["intervene_trigger=stall", "intervene_window=20", "intervene_min_progress=0.25",
                                 "recovery=true"],
    # every request a recovery, nobody called in
    "recovery_only": ["intervene_trigger=stall", "intervene_window=20", "intervene_min_progress=0.25",
                      "recovery=true", "recoveries=1000000"],
}


def collect_with(trigger: list[str], run: Path, data: Path, episodes: int, num_envs: int, seed: int,
                 beta: float | None) -> dict[str, Any]:
    """``robot-rl recap``'s collection stage with the run's exported policy (at CFG β ``beta``) and value model,
    under the trigger's settings."""
    from omegaconf import OmegaConf

    from policies import load_policy
    from robot_rl.algos.advantages import VALUE_DIR
    from robot_rl.algos.value_learning import load_value_model
    from robot_rl.checkpoint import load_meta
    from robot_rl.cli.build import compose
    from robot_rl.cli.config import typed
    from robot_rl.cli.recap import RecapCommand, _exported, _task_and_sim, _with_beta, collect_round

    cfg = compose("recap", [f"task={TASK}", f"sim.num_envs={num_envs}", *_overrides(VISUAL_DR, "sim.randomization"),
                            *trigger])
    raw = OmegaConf.to_container(cfg, resolve=True)
    task, task_cfg, sim_cfg = _task_and_sim(raw)
    cmd = typed(RecapCommand, {k: v for k, v in raw.items() if k not in ("task", "sim")}, "")
    policy = _with_beta(load_policy(_exported(run)).eval(), beta)
    value, _ = load_value_model(run / VALUE_DIR, "cpu")
    shutil.rmtree(data, ignore_errors=True)
    trained_on = Path(load_meta(run)[1]["dataset_root"])  # the recovery's memory: its intervention frames
    out = collect_round(cmd, task, task_cfg, sim_cfg, data, episodes, seed, policy, value, memory_data=trained_on)
    return {"collect": out, **episode_table(data)}


def episode_table(data: Path) -> dict[str, Any]:
    """Per episode of the collection: success, the person's first take-over step (None: none), its length and its
    recoveries; and the report's numbers over them (the person's frames are the actor column's human ones: a
    recovery's frames are interventions in LeRobot's column, not the person's effort)."""
    from policies import keys
    from robot_rl.data.lerobot_format import read_frames, read_meta

    meta = read_meta(data)
    eps = meta.episodes["episode_index"].astype(np.int64)
    who = keys.ACTOR_COL if keys.ACTOR_COL in meta.features else keys.INTERVENTION_COL  # LeRobot's tools: no actor
    cols = read_frames(meta, eps, [keys.SUCCESS_COL, who]).columns
    e = cols["episode_index"].reshape(-1)
    succ = cols[keys.SUCCESS_COL].reshape(-1).astype(bool)
    if who == keys.ACTOR_COL:
        actor = cols[who].reshape(-1)
        inter, rec = actor == keys.ACTOR_HUMAN, actor == keys.ACTOR_RECOVERY
    else:
        inter = cols[who].reshape(-1).astype(bool)
        rec = np.zeros_like(inter)
    rows = []
    for i in eps.tolist():
        m = e == i
        hit = np.flatnonzero(inter[m])
        r = rec[m].astype(np.int8)
        rows.append({"episode": i, "success": bool(succ[m].any()), "length": int(m.sum()),
                     "takeover_step": int(hit[0]) if len(hit) else None,
                     "recoveries": int(((r[1:] - r[:-1]) == 1).sum() + r[0]), "recovery_frames": int(r.sum())})
    n = len(rows)
    taken = [r for r in rows if r["takeover_step"] is not None]
    recovered = [r for r in rows if r["recoveries"]]
    left = [r for r in rows if r["takeover_step"] is None]
    successes = sum(r["success"] for r in rows)
    return {
        "episodes": n, "success_rate": successes / n, "takeover_rate": len(taken) / n,
        "human_frame_share": float(inter.mean()), "human_frames": int(inter.sum()), "frames": len(e),
        "human_frames_per_episode": float(inter.sum()) / n,
        "robot_frames_per_success": len(e) / successes if successes else None,
        "takeovers_per_success": len(taken) / successes if successes else None,
        "taken_over_success_rate": (sum(r["success"] for r in taken) / len(taken)) if taken else None,
        "left_to_policy_success_rate": (sum(r["success"] for r in left) / len(left)) if left else None,
        "missed_failures": sum(not r["success"] for r in left),
        "median_takeover_step": float(np.median([r["takeover_step"] for r in taken])) if taken else None,
        "recoveries": sum(r["recoveries"] for r in rows),
        "recovered_episodes": len(recovered),
        "recovery_frame_share": float(rec.mean()),
        # of the episodes with a recovery, those won with no person called in
        "recovered_success_alone_rate": (sum(r["success"] and r["takeover_step"] is None for r in recovered)
                                         / max(len(recovered), 1)),
        "per_episode": rows,
    }


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = data["triggers"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], "human_frames_per_episode", "expert frames per episode (the person's effort)"),
                           (axes[1], "robot_frames_per_success", "robot frames per success (1 / throughput)")):
        for i, (name, r) in enumerate(runs.items()):
            x = r[key]
            if x is None:
                continue
            marker = "s" if name.startswith("stall") else "o" if name.startswith("threshold") else "x"
            hollow = "recovery" in name and marker != "x"  # a recovery before the person
            ax.scatter(x, r["success_rate"], marker=marker, s=50, label=name, color=f"C{i}",
                       **({"facecolors": "none", "linewidths": 1.5} if hollow else {}))
        ax.set_xlabel(label)
        ax.set_ylabel("collection success rate")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"take-over triggers: {data['settings']['episodes']} so101_lift episodes each, same seeds; a RECAP "
                 "policy collects, its value model watches, the scripted expert takes over\n(o threshold, s stall; "
                 "hollow: a recovery first)",
                 fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a robot-rl offline algo=recap run (policy + value model)")
    p.add_argument("--work", type=Path, default=Path("/tmp/hil/collect"))
    p.add_argument("--episodes", type=int, default=60)
    p.add_argument("--num-envs", type=int, default=20)
    p.add_argument("--seed", type=int, default=7_000, help="the collections' env seed (other than the data's)")
    p.add_argument("--beta", type=float, default=2.5, help="CFG β the policy samples with (the loop's)")
    p.add_argument("--triggers", default=",".join(TRIGGERS))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default=NAME, help="file names of the results: NAME.json, NAME.png")
    p.add_argument("--plot-only", action="store_true", help="redraw NAME.png from NAME.json in --out")
    a = p.parse_args()
    if a.plot_only:
        plot(json.loads((a.out / f"{a.name}.json").read_text()), a.out / f"{a.name}.png")
        return
    os.environ.setdefault("MUJOCO_GL", "egl")
    torch.set_num_threads(2)
    data: dict[str, Any] = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                            "trigger_settings": {}, "triggers": {}}
    for name in a.triggers.split(","):
        torch.manual_seed(a.seed)
        start = time.perf_counter()
        data["trigger_settings"][name] = TRIGGERS[name]
        data["triggers"][name] = res = collect_with(TRIGGERS[name], a.run, a.work / name, a.episodes, a.num_envs,
                                                    a.seed, a.beta)
        res["seconds"] = round(time.perf_counter() - start, 1)
        print(f"{name}: success {res['success_rate']:.2f}, taken over {res['takeover_rate']:.2f}, expert frames "
              f"{res['human_frame_share']:.2f}, missed failures {res['missed_failures']}, recoveries "
              f"{res['recoveries']} ({res['seconds']} s)", file=sys.stderr)
    a.out.mkdir(parents=True, exist_ok=True)
    write_result(a.name, data, [], a.out)
    plot(data, a.out / f"{a.name}.png")
    print(json.dumps({n: {k: v for k, v in r.items() if k not in ("per_episode", "collect")}
                      for n, r in data["triggers"].items()}, indent=1))


if __name__ == "__main__":
    main()
