"""so101_reach draws only targets the arm can reach: the box less a cylinder round the base that the tool frame cannot
fold into (``ReachConfig.unreachable_radius`` / ``unreachable_z``)."""

import math

import pytest
import torch

from sim.config import SimConfig
from sim.experts import make_expert
from sim.registry import make_env, make_task
from sim.tasks.so101_reach import ReachConfig
from tests.sim.test_experts import first_episode_successes

# where a trained PPO policy (the main job's, seed 0) and the scripted expert both stalled 2.9-3.2 cm away, the
# shoulder_lift joint at its -1.745 rad stop (2026-12-06)
STALLED = [0.1046, -0.0291, 0.1629]


def _targets(cfg: ReachConfig, n: int) -> torch.Tensor:
    task = make_task("so101_reach", cfg)
    task.bind(task.build_spec().compile(), n, torch.device("cpu"))
    return task._draw_targets(n, torch.Generator().manual_seed(0))


def test_targets_avoid_the_cylinder_and_fill_the_rest_of_the_box() -> None:
    cfg = ReachConfig()
    t = _targets(cfg, 40_000)
    low, high = torch.tensor(cfg.target_low), torch.tensor(cfg.target_high)
    assert bool(((t >= low) & (t <= high)).all())
    r = torch.linalg.norm(t[:, :2], dim=1)
    inside = (r < 0.13) & (t[:, 2] > 0.04) & (t[:, 2] < 0.21)
    assert not bool(inside.any())
    # uniform over what is left: the share drawn at r < 0.16 in the cylinder's height band matches its area there.
    # The part of the disc r < 0.16 with x >= 0.10, less the disc r < 0.13, over the box's cross-section 0.22 x 0.44:
    def area_of_disc_beyond_x(radius: float, x: float) -> float:  # segment of a disc cut by the chord at x
        return radius ** 2 * math.acos(x / radius) - x * math.sqrt(radius ** 2 - x ** 2)
    ring = area_of_disc_beyond_x(0.16, 0.10) - area_of_disc_beyond_x(0.13, 0.10)
    kept = 0.22 * 0.44 - area_of_disc_beyond_x(0.13, 0.10)
    band = (t[:, 2] > 0.04) & (t[:, 2] < 0.21)
    share = float(((r < 0.16) & band).sum() / band.sum())
    assert share == pytest.approx(ring / kept, rel=0.05)


def test_the_box_is_drawn_whole_with_the_cylinder_off() -> None:
    t = _targets(ReachConfig(unreachable_radius=0.0), 40_000)
    r = torch.linalg.norm(t[:, :2], dim=1)
    assert bool(((r < 0.13) & (t[:, 2] > 0.04) & (t[:, 2] < 0.21)).any())


def test_a_box_inside_the_cylinder_is_an_error_naming_the_settings() -> None:
    cfg = ReachConfig(target_low=[0.10, -0.02, 0.10], target_high=[0.11, 0.02, 0.12])
    with pytest.raises(ValueError, match="unreachable_radius"):
        _targets(cfg, 4)


def test_the_expert_stalls_short_of_a_target_inside_the_cylinder() -> None:
    """Why the cylinder is excluded: the IK expert cannot bring the tool frame within 2 cm of this target."""
    task = make_task("so101_reach")
    assert bool(task.unreachable(torch.tensor([STALLED])).all())
    env = make_env("so101_reach", SimConfig(num_envs=1, num_threads=1))
    expert = make_expert(env)
    obs, _ = env.reset(seed=0)
    expert.reset()
    env.task.target[:] = torch.tensor([STALLED])
    env.physics.state.mocap_pos[:, env.task.target_mocap] = torch.tensor([STALLED], dtype=torch.float64)
    closest = math.inf
    for _ in range(60):
        obs, _, terminated, truncated, _ = env.step(expert.act(obs))
        closest = min(closest, float(env.task._distance(env.physics.state)[0]))
        assert not bool(terminated.any() or truncated.any())
    assert closest > 0.025


def test_the_expert_reaches_every_target_just_outside_the_cylinder() -> None:
    """The cylinder is wide enough where the unreachable targets lay (in front of the base, |y| small): every target
    in a slab just beyond it, over its whole height, is reached."""
    cfg = ReachConfig(target_low=[0.13, -0.03, 0.04], target_high=[0.14, 0.03, 0.21])
    wins = int(first_episode_successes("so101_reach", num_envs=60, task_cfg=cfg).sum())
    assert wins == 60


def test_a_malformed_cylinder_height_is_an_error_naming_the_key() -> None:
    with pytest.raises(ValueError, match="unreachable_z"):
        ReachConfig(unreachable_z=[0.2])
    with pytest.raises(ValueError, match="unreachable_z"):
        ReachConfig(unreachable_z=[0.2, 0.1])


def test_the_workspace_surveys_ik_finds_the_stalled_target_out_of_reach() -> None:
    """benchmarks/reach_workspace.py's survey, behind the cylinder's size: the target the main job failed is out of
    the task's 2 cm whatever the IK start; one in the middle of the box is reached."""
    import numpy as np

    from benchmarks.reach_workspace import survey

    closest = survey(np.array([STALLED, [0.22, 0.0, 0.15]]), starts=4, seed=0)
    assert closest[0] > 0.02 and closest[1] < 0.005
