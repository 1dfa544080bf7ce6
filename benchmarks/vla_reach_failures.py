"""How a trained VLA fails so101_reach (and, with ``--task so101_pick``, so101_pick: which cube rose, how close the
grasp came to the named one, how far off and askew the jaws first closed, success by where the named cube started;
with ``--task so101_push``, so101_push: how close the jaws came to the cube, how far the cube moved and where it ended
against the goal). Reach, per episode: the closest and the last tool-to-target
distance, the tool's last position, the shoulder pan's course and whether the target lay inside the front camera's
frame, read from the simulator (diagnosis only; the policy sees what ``benchmarks/vla_bc.py`` shows it: cameras, joints,
instruction, under the same visual DR and seeds).

    python benchmarks/vla_reach_failures.py --policy RUN/checkpoints/iter_XXXXXXXX/policy --executed-steps 4

Prints a summary and writes ``--out`` (JSON: every episode, and the pan course of the first ``--traces`` envs'
first episodes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import robot_rl  # noqa: F401, I001  (before torch: OpenMP's spin, robot_rl.OPENMP_SPIN)
import torch

from policies.flow_vla.flow import SAMPLE_REDUCTIONS


def _rollout(policy: Any, task_name: str, episodes: int, num_envs: int, seed: int) -> Iterator[Any]:
    """Steps ``policy`` on vla_bc's env for ``task_name`` (its view, visual DR and seeding). Yields the env first,
    then after every step ``(done, counted, success)``, bool [N] each: the envs whose episode the step ended (their
    state is the next episode's already), those of them whose episode counts (each env's first
    ``episodes // num_envs``, as ``robot_rl.evaluation.evaluate`` counts them) and which of those succeeded. Ends when
    every env has its count."""
    from benchmarks.vla_bc import _env
    from policies import ActionQueue, keys
    from robot_rl.cli.build import policy_view
    from robot_rl.env import episode_mask
    from robot_rl.evaluation import _ask_images_for_due, _episodes_ended

    with torch.no_grad(), _env(task_name, num_envs, seed) as env:
        view = policy_view(env, policy)
        act = ActionQueue(policy, num_envs, view.action_dim, deterministic=True)
        obs, _ = view.reset(seed=seed)
        yield env
        quota, taken = episodes // num_envs, torch.zeros(num_envs, dtype=torch.long)
        while bool((taken < quota).any()):
            action = act(obs).to(env.device)
            _ask_images_for_due(view, act)
            obs, _, terminated, truncated, info = view.step(action)
            done = episode_mask(terminated, truncated).cpu()
            counted = done & (taken < quota)
            taken += counted.long()
            ended = keys.EPISODE in info  # the per-episode statistics come only with a step that ends one
            yield done, counted, (info[keys.EPISODE][keys.EP_SUCCESS].cpu().bool() if ended else torch.zeros_like(done))
            _episodes_ended(act, done)


def front_view_ndc(model: Any, points: torch.Tensor, camera: str = "front") -> torch.Tensor:
    """Where world ``points`` [P, 3] (m) fall in ``camera``'s image, [P, 2] (u right, v up) in [-1, 1] when inside the
    frame, from the model's nominal camera pose and field of view (square images; visual DR's camera jitter, ~1 cm,
    left out)."""
    import mujoco

    cid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
    rot = torch.as_tensor(model.cam_mat0[cid].reshape(3, 3), dtype=torch.float64)  # columns: x right, y up, z back
    d = (points.double() - torch.as_tensor(model.cam_pos0[cid], dtype=torch.float64)) @ rot
    f = 1.0 / math.tan(math.radians(float(model.cam_fovy[cid])) / 2)
    return torch.stack([f * d[:, 0] / -d[:, 2], f * d[:, 1] / -d[:, 2]], dim=1)


def _band(value: float, low: float, high: float, bands: int) -> int:
    """Which of ``bands`` equal bands of [low, high] holds ``value`` (the last band closed; outside: the nearest)."""
    return min(max(int((value - low) / (high - low) * bands), 0), bands - 1)


def success_by_band(values: list[float], success: list[bool], low: float, high: float, bands: int
                    ) -> dict[str, list[float]]:
    """Episodes and success rate per equal band of [low, high] (the last band closed; values outside go to the
    nearest band), keyed "lo-hi" (2 decimals); bands without episodes are left out."""
    cells: dict[int, list[bool]] = {}
    for v, ok in zip(values, success, strict=True):
        cells.setdefault(_band(v, low, high, bands), []).append(ok)
    step = (high - low) / bands
    return {f"{low + b * step:.2f}-{low + (b + 1) * step:.2f}": [len(v), round(sum(v) / len(v), 3)]
            for b, v in sorted(cells.items())}


def diagnose(policy: Any, episodes: int, num_envs: int, seed: int, traces: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    pan_traces: list[list[float]] = [[] for _ in range(traces)]
    steps = _rollout(policy, "so101_reach", episodes, num_envs, seed)
    env = next(steps)
    task = env.task
    target = task.target.cpu().clone()
    closest = torch.full((num_envs,), float("inf"))
    last, tool = torch.zeros(num_envs), torch.zeros(num_envs, 3)
    first_episode = torch.ones(num_envs, dtype=torch.bool)
    for done, counted, success in steps:
        state = env.physics.state
        ee = state.sensor("ee_pos").float().cpu()
        pan = torch.rad2deg(task.arm.qpos(state.qpos)[:, 0]).cpu()
        for i in range(num_envs):
            if done[i]:  # the state is the next episode's already: this episode's last step was the one before
                if counted[i]:
                    uv = front_view_ndc(env.physics.model, target[i : i + 1])[0]
                    rows.append({"success": bool(success[i]), "closest_m": round(float(closest[i]), 4),
                                 "last_m": round(float(last[i]), 4), "target": [round(float(x), 3) for x in target[i]],
                                 "tool_last": [round(float(x), 3) for x in tool[i]],
                                 "target_front_uv": [round(float(x), 3) for x in uv],
                                 "target_in_front_view": bool(uv.abs().max() < 1.0)})
                closest[i], first_episode[i] = float("inf"), False
            else:
                d = float(torch.linalg.norm(ee[i] - target[i]))
                closest[i], last[i], tool[i] = min(float(closest[i]), d), d, ee[i]
                if i < traces and first_episode[i]:
                    pan_traces[i].append(round(float(pan[i]), 1))
        target[done] = task.target.cpu()[done]
    fails = [r for r in rows if not r["success"]]
    far = [r for r in fails if r["last_m"] > 0.10]
    unseen = [r for r in rows if not r["target_in_front_view"]]  # the target's centre outside the front camera's frame
    return {
        "episodes": len(rows), "success": sum(r["success"] for r in rows) / len(rows),
        "failures": len(fails),
        "failures_closest_m_median": statistics.median(r["closest_m"] for r in fails) if fails else None,
        "failures_came_within_5cm": sum(r["closest_m"] < 0.05 for r in fails),
        "failures_ending_over_10cm_away": len(far),
        "far_failures_tool_last_abs_y_median": statistics.median(abs(r["tool_last"][1]) for r in far) if far else None,
        "target_out_of_front_view": len(unseen), "target_out_of_front_view_successes": sum(r["success"] for r in unseen),
        # the VLA's reach failures gathered at the box's top (2026-12-06: 8 of 10 at z >= 0.23 m in one training)
        "success_by_target_z (episodes, success)": success_by_band(
            [r["target"][2] for r in rows], [r["success"] for r in rows], task.cfg.target_low[2],
            task.cfg.target_high[2], 5),
        "pan_deg_first_episodes": pan_traces, "per_episode": rows,
    }


def face_yaw_error(jaw_yaw: float, cube_yaw: float, symmetry: float = math.pi / 2) -> float:
    """Signed angle (rad) from the nearest pair of a square cube's faces to the jaw axis, in [-symmetry/2,
    symmetry/2): 0 when the jaws close flat on two faces, ±45 deg on the corners."""
    return (jaw_yaw - cube_yaw + symmetry / 2) % symmetry - symmetry / 2


CLOSING_RAD = 0.6  # gripper joint (rad; open ~1.0, closed on a cube ~0): the jaws pass it when a grasp starts


def diagnose_pick(policy: Any, episodes: int, num_envs: int, seed: int) -> dict[str, Any]:
    """so101_pick's failures by kind, per episode: the highest the named cube and the other cubes rose (m above rest),
    the closest the grasp site came to the named cube, where the named cube started, and at the first step the jaws
    close past ``CLOSING_RAD``: the grasp site's offset from the named cube (xy and height, m) and the jaw axis' yaw
    from the cube's nearest faces (deg). Summaries: those offsets for successes and failures (medians), and success
    by where the named cube started (a 3 x 6 grid over the spawn box)."""
    import mujoco

    from sim.ik import quat_yaw
    from sim.tasks.so101_pick import CUBE_HALF

    rows: list[dict[str, Any]] = []
    steps = _rollout(policy, "so101_pick", episodes, num_envs, seed)
    env = next(steps)
    task = env.task
    model = env.physics.model
    scratch = mujoco.MjData(model)
    site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "grasp")
    grip_adr = int(model.jnt_qposadr[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, "gripper")])
    named = task.target.cpu().clone()
    rise_named, rise_other = torch.zeros(num_envs), torch.zeros(num_envs)
    closest = torch.full((num_envs,), float("inf"))
    start: list[list[float] | None] = [None] * num_envs
    first_close: list[dict[str, float] | None] = [None] * num_envs
    prev_grip = [-math.inf] * num_envs  # an episode starts closed (home): only a closing after opening counts
    for done, counted, success in steps:
        state = env.physics.state
        cubes = task._stack(state, "_pos").cpu()  # [N, 3 cubes, 3]
        quats = task._stack(state, "_quat").cpu()
        qpos = state.qpos.cpu().double()
        rise = cubes[:, :, 2] - CUBE_HALF
        grasp = state.sensor("grasp_pos").float().cpu()
        for i in range(num_envs):
            if done[i]:
                if counted[i]:
                    rows.append({"success": bool(success[i]), "named_rise_m": round(float(rise_named[i]), 4),
                                 "other_rise_m": round(float(rise_other[i]), 4),
                                 "closest_to_named_m": round(float(closest[i]), 4), "named_start_xy": start[i],
                                 "first_close": first_close[i]})
                rise_named[i], rise_other[i], closest[i] = 0.0, 0.0, float("inf")
                start[i], first_close[i], prev_grip[i] = None, None, -math.inf
                continue
            n = int(named[i])
            if start[i] is None:
                start[i] = [round(float(v), 3) for v in cubes[i, n, :2]]
            rise_named[i] = max(float(rise_named[i]), float(rise[i, n]))
            others = [float(rise[i, c]) for c in range(rise.shape[1]) if c != n]
            rise_other[i] = max(float(rise_other[i]), *others)
            closest[i] = min(float(closest[i]), float(torch.linalg.norm(grasp[i] - cubes[i, n])))
            grip = float(qpos[i, grip_adr])
            if first_close[i] is None and prev_grip[i] > CLOSING_RAD >= grip:
                scratch.qpos[:] = qpos[i].numpy()
                mujoco.mj_kinematics(model, scratch)
                jaw = scratch.site_xmat[site].reshape(3, 3)[:, 2]  # the jaw opening axis (the site's +z)
                off = torch.as_tensor(scratch.site_xpos[site]) - cubes[i, n].double()
                err = face_yaw_error(math.atan2(jaw[1], jaw[0]), quat_yaw(quats[i, n]))
                first_close[i] = {"dxy_m": round(float(torch.linalg.norm(off[:2])), 4), "dz_m": round(float(off[2]), 4),
                                  "yaw_err_deg": round(math.degrees(err), 1)}
            prev_grip[i] = grip
        named[done] = task.target.cpu()[done]
    fails = [r for r in rows if not r["success"]]
    lifted = 0.02  # m: a cube this far above its rest was picked up (success needs 0.05 and both pads)
    kinds = {
        "other_cube_lifted": sum(r["other_rise_m"] > lifted for r in fails),
        "named_cube_lifted_not_enough_or_dropped": sum(r["other_rise_m"] <= lifted < r["named_rise_m"] for r in fails),
        "reached_named_within_2cm_never_lifted": sum(r["other_rise_m"] <= lifted and r["named_rise_m"] <= lifted
                                                     and r["closest_to_named_m"] < 0.02 for r in fails),
        "never_within_2cm_of_named": sum(r["other_rise_m"] <= lifted and r["named_rise_m"] <= lifted
                                         and r["closest_to_named_m"] >= 0.02 for r in fails),
    }
    def close_medians(rs: list[dict[str, Any]]) -> dict[str, Any]:
        closes = [r["first_close"] for r in rs if r["first_close"]]
        med = {k: round(statistics.median(abs(c[k]) for c in closes), 4) if closes else None
               for k in ("dxy_m", "dz_m", "yaw_err_deg")}
        return {"episodes": len(rs), "closed": len(closes), **{f"median_abs_{k}": v for k, v in med.items()}}

    lo, hi = task.cfg.cube_low, task.cfg.cube_high
    cells: dict[tuple[int, int], list[bool]] = {}
    for r in rows:  # the spawn box in 3 x 6 cells, the last cell of each axis closed
        (x, y) = r["named_start_xy"]
        a, b = _band(x, lo[0], hi[0], 3), _band(y, lo[1], hi[1], 6)
        cells.setdefault((a, b), []).append(r["success"])
    step = [(hi[k] - lo[k]) / n for k, n in ((0, 3), (1, 6))]
    grid = {f"x {lo[0] + a * step[0]:.2f}-{lo[0] + (a + 1) * step[0]:.2f}, y {lo[1] + b * step[1]:.2f}-"
            f"{lo[1] + (b + 1) * step[1]:.2f}": [len(v), round(sum(v) / len(v), 3)] for (a, b), v in sorted(cells.items())}
    return {"episodes": len(rows), "success": sum(r["success"] for r in rows) / len(rows), "failures": len(fails),
            "failure_kinds": kinds, "first_close": {"successes": close_medians([r for r in rows if r["success"]]),
                                                    "failures": close_medians(fails)},
            "success_by_named_start (episodes, success)": grid, "per_episode": rows}


def diagnose_push(policy: Any, episodes: int, num_envs: int, seed: int) -> dict[str, Any]:
    """so101_push's failures by kind, per episode: the closest the grasp site came to the cube, the farthest the cube
    moved from its start, and the cube-to-goal distance in the table plane at the start, at its closest and at the
    end (m)."""
    rows: list[dict[str, Any]] = []
    steps = _rollout(policy, "so101_push", episodes, num_envs, seed)
    env = next(steps)
    task = env.task
    goal = task.goal.cpu().clone()
    inf = float("inf")
    start = env.physics.state.sensor("cube_pos").float().cpu().clone()
    closest, moved = torch.full((num_envs,), inf), torch.zeros(num_envs)
    goal_closest, goal_last = torch.full((num_envs,), inf), torch.zeros(num_envs)
    for done, counted, success in steps:
        state = env.physics.state
        cube = state.sensor("cube_pos").float().cpu()
        grasp = state.sensor("grasp_pos").float().cpu()
        for i in range(num_envs):
            if done[i]:  # the state is the next episode's already
                if counted[i]:
                    rows.append({"success": bool(success[i]), "closest_to_cube_m": round(float(closest[i]), 4),
                                 "cube_moved_m": round(float(moved[i]), 4),
                                 "goal_start_m": round(float(torch.linalg.norm(start[i, :2] - goal[i])), 4),
                                 "goal_closest_m": round(float(goal_closest[i]), 4),
                                 "goal_last_m": round(float(goal_last[i]), 4)})
                closest[i], moved[i], goal_closest[i] = inf, 0.0, inf
                start[i] = cube[i]
            else:
                closest[i] = min(float(closest[i]), float(torch.linalg.norm(grasp[i] - cube[i])))
                moved[i] = max(float(moved[i]), float(torch.linalg.norm(cube[i, :2] - start[i, :2])))
                goal_last[i] = float(torch.linalg.norm(cube[i, :2] - goal[i]))
                goal_closest[i] = min(float(goal_closest[i]), float(goal_last[i]))
        goal[done] = task.goal.cpu()[done]
    fails = [r for r in rows if not r["success"]]
    near, still = 0.03, 0.01  # m: the jaws within this of the cube's centre; a cube moved less than this stayed
    pushed = [r for r in fails if r["closest_to_cube_m"] < near and r["cube_moved_m"] >= still]
    kinds = {
        "never_within_3cm_of_cube": sum(r["closest_to_cube_m"] >= near for r in fails),
        "reached_cube_never_moved_it": sum(r["closest_to_cube_m"] < near and r["cube_moved_m"] < still for r in fails),
        # the cube travelled at least as far as the goal was and never came within the success radius: the push
        # went beside or past the goal
        "pushed_beside_or_past_goal": sum(r["cube_moved_m"] >= r["goal_start_m"] for r in pushed),
        "pushed_short_of_goal": sum(r["cube_moved_m"] < r["goal_start_m"] for r in pushed),
    }
    return {"episodes": len(rows), "success": sum(r["success"] for r in rows) / len(rows), "failures": len(fails),
            "failure_kinds": kinds,
            "pushed_failures_goal_closest_m_median": (statistics.median(r["goal_closest_m"] for r in pushed)
                                                      if pushed else None),
            "pushed_failures_cube_moved_m_median": (statistics.median(r["cube_moved_m"] for r in pushed)
                                                    if pushed else None),
            "per_episode": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", type=Path, required=True, help="an exported flow-VLA policy folder")
    p.add_argument("--executed-steps", type=int, default=None, help="actions executed per chunk (default: the policy's)")
    p.add_argument("--mean-of-samples", type=int, default=None,
                   help="chunks sampled per observation (default: the policy's)")
    p.add_argument("--sample-reduction", choices=SAMPLE_REDUCTIONS, default=None,
                   help="how the sampled chunks become one (default: the policy's)")
    p.add_argument("--median-actions", default=None,
                   help="comma list of action features taken as the median of the sampled chunks (default: the "
                        "policy's own; '' for none)")
    p.add_argument("--task", choices=("so101_reach", "so101_pick", "so101_push"), default="so101_reach")
    p.add_argument("--episodes", type=int, default=100, help="a multiple of --num-envs")
    p.add_argument("--num-envs", type=int, default=10)
    p.add_argument("--seed", type=int, default=777_000, help="vla_bc.py's evaluation seed")
    p.add_argument("--traces", type=int, default=10, help="envs whose first episode's pan course is kept")
    p.add_argument("--out", type=Path, default=Path("/tmp/vla_reach_failures.json"))
    a = p.parse_args()
    from policies import load_policy
    from policies.execution import set_executed_steps, set_mean_of_samples, set_median_actions, set_sample_reduction

    os.environ.setdefault("MUJOCO_GL", "egl")
    torch.set_num_threads(2)
    policy = load_policy(a.policy).eval()
    if a.executed_steps:
        set_executed_steps(policy, a.executed_steps)
    if a.mean_of_samples:
        set_mean_of_samples(policy, a.mean_of_samples)
    if a.sample_reduction:
        set_sample_reduction(policy, a.sample_reduction)
    if a.median_actions is not None:
        set_median_actions(policy, [n for n in a.median_actions.split(",") if n])
    r = (diagnose(policy, a.episodes, a.num_envs, a.seed, a.traces) if a.task == "so101_reach"
         else diagnose_pick(policy, a.episodes, a.num_envs, a.seed) if a.task == "so101_pick"
         else diagnose_push(policy, a.episodes, a.num_envs, a.seed))
    a.out.write_text(json.dumps({"policy": str(a.policy), "executed_steps": a.executed_steps,
                                 "mean_of_samples": getattr(policy.cfg, "mean_of_samples", None),
                                 "sample_reduction": getattr(policy.cfg, "sample_reduction", None),
                                 "median_actions": getattr(policy.cfg, "median_actions", None), **r}, indent=2) + "\n")
    print(json.dumps({k: v for k, v in r.items() if k not in ("per_episode", "pan_deg_first_episodes")}))


if __name__ == "__main__":
    main()
