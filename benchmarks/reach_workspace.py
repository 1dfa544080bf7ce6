"""Which so101_reach targets the SO-101 can reach: an IK survey of the target box, and the cylinder the task excludes.

so101_reach draws targets uniformly from a box, less a cylinder in front of the base (``ReachConfig.unreachable_radius``
and ``unreachable_z``) that the tool frame cannot fold into. This survey is why: damped-least-squares IK
(``sim.ik.solve_ik``, from the home pose and from random starts within the joint ranges) on targets drawn from the
whole box and, densely, from the slab next to the base; a target whose best solve leaves the tool frame more than
the task's success threshold (2 cm) away is out of reach. Goal: every such target lies inside the excluded cylinder.

    python benchmarks/reach_workspace.py                # ~15 s on 2 cores
    python benchmarks/reach_workspace.py --out /tmp/ws

Writes ``benchmarks/results/reach_workspace.json`` and ``reach_workspace.png`` (the residual of every surveyed target
against its distance from the base's axis and its height, the cylinder drawn).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import robot_rl  # noqa: F401, I001  (before torch: OpenMP's spin, robot_rl.OPENMP_SPIN)
import mujoco
import numpy as np
import torch

from benchmarks.common import RESULTS, goal, save_figure, write_result
from sim import ik, so101
from sim.registry import make_task
from sim.tasks.so101_reach import ReachConfig

SITE = "ee"  # the tool frame so101_reach scores


def survey(targets: np.ndarray, starts: int, seed: int) -> np.ndarray:
    """[N] the closest the tool frame gets to each target [N, 3] (m): the best of ``starts`` IK solves (the home
    pose, then random poses within the joint ranges)."""
    model = make_task("so101_reach").build_spec().compile()
    data = mujoco.MjData(model)
    joints = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, n) for n in so101.ARM_JOINTS]
    qadr = np.array([model.jnt_qposadr[j] for j in joints])
    low, high = model.jnt_range[joints, 0], model.jnt_range[joints, 1]
    rng = np.random.default_rng(seed)
    best = np.full(len(targets), np.inf)
    for k, target in enumerate(targets):
        for s in range(starts):
            q0 = np.zeros(len(joints)) if s == 0 else low + rng.random(len(joints)) * (high - low)
            q = ik.solve_ik(model, data, SITE, target, q0, joints, iters=100)
            data.qpos[qadr] = q
            mujoco.mj_kinematics(model, data)
            best[k] = min(best[k], float(np.linalg.norm(data.site(SITE).xpos - target)))
            if best[k] < 0.005:
                break
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--box", type=int, default=3000, help="targets drawn from the whole box")
    p.add_argument("--near", type=int, default=4000, help="targets drawn from the slab next to the base")
    p.add_argument("--starts", type=int, default=4, help="IK solves per target (the home pose, then random)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()

    cfg = ReachConfig()
    threshold, radius, (z_low, z_high) = cfg.success_threshold, cfg.unreachable_radius, cfg.unreachable_z
    task = make_task("so101_reach", cfg)
    rng = np.random.default_rng(a.seed)
    box_low, box_high = np.array(cfg.target_low), np.array(cfg.target_high)
    near_low, near_high = box_low.copy(), box_high.copy()
    near_low[1], near_high[0], near_high[1] = -0.14, box_low[0] + 0.05, 0.14  # x within 5 cm of the box's front
    bounds = {"box": (box_low, box_high, a.box), "near_base": (near_low, near_high, a.near)}
    parts = {name: low + rng.random((n, 3)) * (high - low) for name, (low, high, n) in bounds.items()}
    data: dict = {"success_threshold_m": threshold, "cylinder": {"radius_m": radius, "z_m": [z_low, z_high]},
                  "ik": {"starts": a.starts, "iters": 100, "site": SITE}, "surveys": {}}
    many = box_low + rng.random((1_000_000, 3)) * (box_high - box_low)  # the cylinder's share of the box, closely
    data["cylinder_share_of_box"] = round(float(task.unreachable(torch.as_tensor(many)).double().mean()), 4)
    goals, fig_parts = [], []
    for name, targets in parts.items():
        closest = survey(targets, a.starts, a.seed)
        out = closest > threshold
        inside = task.unreachable(torch.as_tensor(targets, dtype=torch.float32)).numpy()
        r = np.hypot(targets[:, 0], targets[:, 1])
        data["surveys"][name] = {
            "targets": len(targets), "box_low_m": bounds[name][0].tolist(), "box_high_m": bounds[name][1].tolist(),
            "out_of_reach_share": round(float(out.mean()), 4),
            "over_1cm_share": round(float((closest > 0.01).mean()), 4),
            "out_of_reach_r_m": [round(float(r[out].min()), 4), round(float(r[out].max()), 4)] if out.any() else None,
            "out_of_reach_z_m": ([round(float(targets[out, 2].min()), 4), round(float(targets[out, 2].max()), 4)]
                                 if out.any() else None),
            "out_of_reach_outside_cylinder": int((out & ~inside).sum()),
            "reachable_inside_cylinder": int((~out & inside).sum()),
            "cylinder_share_of_these_targets": round(float(inside.mean()), 4),
        }
        goals.append(goal(f"out_of_reach_targets_outside_the_cylinder_{name}", float((out & ~inside).sum()), 0.0, "<="))
        fig_parts.append((name, r, targets[:, 2], closest))
        print(f"{name}: {out.mean():.2%} of {len(targets)} targets out of reach, {(out & ~inside).sum()} of them "
              f"outside the cylinder; the cylinder holds {inside.mean():.2%} of the targets")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (name, r, z, closest) in zip(axes, fig_parts, strict=True):
        sc = ax.scatter(r, z, c=np.minimum(closest, 0.05) * 100, s=4, cmap="viridis")
        ax.add_patch(plt.Rectangle((0, z_low), radius, z_high - z_low, fill=False, ec="red", lw=1.5,
                                   label=f"excluded: r < {radius} m, {z_low}-{z_high} m up"))
        ax.set(xlabel="r = hypot(x, y) (m)", ylabel="z (m)", title=f"so101_reach targets ({name}): IK's closest (cm)")
        ax.set_xlim(left=0.08)
        ax.legend(loc="upper right", fontsize=8)
        fig.colorbar(sc, ax=ax, label="closest tool-to-target distance (cm, capped at 5)")
    fig.tight_layout()
    a.out.mkdir(parents=True, exist_ok=True)
    save_figure(fig, a.out / "reach_workspace.png")
    print(f"wrote {write_result('reach_workspace', data, goals, a.out)}")


if __name__ == "__main__":
    main()
