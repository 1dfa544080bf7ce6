"""LeRobotView: SO-101 task envs in LeRobot's frame convention (degrees, uint8 images, task strings), rendering only
what is asked for, the scripted expert's trajectory reproduced bit for bit, visual randomization in the images."""

import math

import pytest
import torch

from policies import keys
from sim import so101
from sim.config import SimConfig
from sim.experts import make_expert
from sim.lerobot_view import LeRobotView
from sim.randomization import RandomizationConfig
from sim.registry import make_env, task_config

FRONT, WRIST = keys.lerobot_image_key("front"), keys.lerobot_image_key("wrist")


def _view(task="so101_lift", n=2, seed=0, cameras=("front",), sim=None, **overrides):
    sim = sim or SimConfig(num_envs=n, num_threads=1, seed=seed)
    env = make_env(task, sim, task_config(task, overrides))
    return LeRobotView(env, cameras=cameras, image_size=(32, 32))


@pytest.mark.parametrize("task", ["so101_reach", "so101_lift", "so101_push", "so101_pick"])
def test_frames_follow_lerobots_convention(task):
    view = _view(task, cameras=("front", "wrist"))
    assert view.action_dim == 6 and view.num_envs == 2 and view.max_episode_length == view.env.max_episode_length
    frame, _ = view.reset(seed=1)
    for _ in range(2):
        assert set(frame) == {keys.OBS_STATE, FRONT, WRIST, keys.TASK}
        state = frame[keys.OBS_STATE]
        assert state.dtype == torch.float32 and state.shape == (2, 6)
        # degrees of the six joints the inner env reports (rad)
        torch.testing.assert_close(state, view.env_obs[keys.PROPRIO] * (180 / math.pi))
        for k in (FRONT, WRIST):
            assert frame[k].dtype == torch.uint8 and frame[k].shape == (2, 3, 32, 32)
            assert frame[k].float().std() > 5  # a scene, not a blank
        assert frame[keys.TASK] == view.instructions == view.env.instructions
        frame, reward, _, _, info = view.step(state + 1.0)
        assert reward.shape == (2,) and keys.SUCCESS in info and keys.APPLIED_ACTION in info


def test_degrees_convert_to_the_inner_action_by_hand():
    """Targets 1 degree above the measured joints: the relative action is (pi/180) / max_delta = 0.2182 on the arm
    joints (max_delta 0.08 rad) and 0.1164 on the gripper (0.15 rad); 30 degrees away is clipped to one full step."""
    view = _view(n=1)
    view.reset(seed=0)
    q_deg = view.env.task.arm.qpos(view.env.physics.state.qpos) * (180 / math.pi)
    _, _, _, _, info = view.step(q_deg + 1.0)
    expected = torch.tensor([[0.2182, 0.2182, 0.2182, 0.2182, 0.2182, 0.1164]])
    torch.testing.assert_close(info[keys.APPLIED_ACTION], expected, atol=2e-4, rtol=0)
    torch.testing.assert_close(info[keys.ACTION_COL], q_deg + 1.0, atol=1e-3, rtol=0)
    q_deg = view.env.task.arm.qpos(view.env.physics.state.qpos) * (180 / math.pi)
    far = q_deg + torch.tensor([[30.0, -30.0, 0.0, 0.0, 0.0, 0.0]])
    _, _, _, _, info = view.step(far)
    assert info[keys.APPLIED_ACTION][0, :2].tolist() == [1.0, -1.0]
    cap = 0.08 * 180 / math.pi  # 4.5837 degrees per control step
    torch.testing.assert_close(info[keys.ACTION_COL][0, :2], q_deg[0, :2] + torch.tensor([cap, -cap]), atol=1e-3,
                               rtol=0)


@pytest.mark.parametrize("task", ["so101_lift", "so101_pick"])
def test_expert_recorded_through_the_view_is_the_experts_own_trajectory(task):
    """Inner env stepped with the expert's action vs. the view stepped with ``to_target`` of it: same qpos, bit
    for bit, across episode ends (flawed episodes included: quality 0.5)."""
    n = 3
    plain = make_env(task, SimConfig(num_envs=n, num_threads=1, seed=0), task_config(task, {"episode_length": 30}))
    view = _view(task, n=n, episode_length=30)
    expert_a, expert_b = make_expert(plain, quality=0.5, seed=1), make_expert(view.env, quality=0.5, seed=1)
    obs, _ = plain.reset(seed=0)
    view.reset(seed=0)
    ended = 0
    for _ in range(45):
        view.render_ids = False
        obs, _, terminated, truncated, _ = plain.step(expert_a.act(obs))
        _, _, term_v, trunc_v, _ = view.step(view.to_target(expert_b.act(view.env_obs)))
        assert torch.equal(plain.physics.state.qpos, view.env.physics.state.qpos)
        assert torch.equal(terminated, term_v) and torch.equal(truncated, trunc_v)
        done = (terminated | truncated).nonzero().flatten()
        expert_a.reset(done)
        expert_b.reset(done)
        ended += len(done)
    assert ended >= n  # every env crossed at least one episode end


def test_to_target_is_the_target_the_inner_env_commands():
    view = _view(n=3)
    view.reset(seed=2)
    a = torch.tensor([[0.5, -0.5, 1.0, -1.0, 0.0, 0.25]] * 3)
    deg = view.to_target(a)
    q = view.env.task.arm.qpos(view.env.physics.state.qpos)
    by_hand = (q + a * torch.tensor([0.08] * 5 + [0.15])) * (180 / math.pi)
    torch.testing.assert_close(deg, by_hand, atol=1e-4, rtol=0)
    _, _, _, _, info = view.step(deg)
    torch.testing.assert_close(info[keys.APPLIED_ACTION], a, atol=1e-5, rtol=0)


def test_final_frames_hold_state_and_the_ended_episodes_task_and_are_not_rendered():
    view = _view("so101_pick", n=4, episode_length=3)
    frame, _ = view.reset(seed=0)
    renders, inner_final = [], []
    inner_render, inner_step = view.env.render_many, view.env.step

    def render(*args, **kwargs):
        renders.append(args)
        return inner_render(*args, **kwargs)

    def step(*args, **kwargs):
        out = inner_step(*args, **kwargs)
        inner_final.append(out[4][keys.FINAL_OBS][keys.PROPRIO].clone())
        return out

    view.env.render_many, view.env.step = render, step
    for _ in range(3):
        before = list(view.instructions)
        frame, _, _, truncated, info = view.step(frame[keys.OBS_STATE])
    assert truncated.all() and len(renders) == 3  # one batch of the front camera per step, none for final frames
    final = info[keys.FINAL_OBS]
    assert set(final) == {keys.OBS_STATE, keys.TASK}
    assert final[keys.TASK] == before  # the ended episodes' instructions
    assert frame[keys.TASK] == view.env.instructions  # the new episodes'
    assert final[keys.TASK] != frame[keys.TASK]  # seed 0 redraws at least one colour
    # the last state of the ended episode in degrees, not the new episode's first
    torch.testing.assert_close(final[keys.OBS_STATE], inner_final[-1] * (180 / math.pi))
    assert not torch.allclose(final[keys.OBS_STATE], frame[keys.OBS_STATE])


def test_render_ids_choose_the_rows_for_one_call_only():
    view = _view(n=3)
    full, _ = view.reset(seed=0)
    assert all(full[FRONT][i].any() for i in range(3))
    view.render_ids = False
    frame, _ = view.reset(seed=0)
    assert not frame[FRONT].any() and frame[FRONT].shape == (3, 3, 32, 32)
    assert torch.equal(frame[keys.OBS_STATE], full[keys.OBS_STATE])
    view.render_ids = torch.tensor([1])
    frame, _ = view.reset(seed=0)
    assert torch.equal(frame[FRONT][1], full[FRONT][1]) and not frame[FRONT][[0, 2]].any()
    view.render_ids = torch.tensor([True, False, True])
    frame, *_ = view.step(frame[keys.OBS_STATE])
    assert frame[FRONT][[0, 2]].any(dim=(1, 2, 3)).all() and not frame[FRONT][1].any()
    frame, *_ = view.step(frame[keys.OBS_STATE])  # back to the default: every env
    assert frame[FRONT].any(dim=(1, 2, 3)).all()
    ended = _view(n=3, episode_length=1)  # an env that auto-resets in a step is rendered anyway: its episode starts
    frame, _ = ended.reset(seed=0)
    ended.render_ids = False
    frame, _, terminated, truncated, _ = ended.step(frame[keys.OBS_STATE])
    assert (terminated | truncated).all() and frame[FRONT].any(dim=(1, 2, 3)).all()
    for bad, match in ((torch.tensor([3]), r"render_ids must lie in \[0, 3\)"), (torch.tensor([0.5]), "1-D tensor"),
                       (torch.tensor([True, False]), "must have 3 entries")):
        view.render_ids = bad
        with pytest.raises(ValueError, match=match):
            view.step(frame[keys.OBS_STATE])


def test_nonfinite_targets_follow_the_inner_envs_policy():
    view = _view(n=3)
    frame, _ = view.reset(seed=0)
    bad = frame[keys.OBS_STATE].clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite action .*envs \[1\]"):
        view.step(bad)
    view = _view(n=3, sim=SimConfig(num_envs=3, num_threads=1, on_nonfinite_action="reset"))
    frame, _ = view.reset(seed=0)
    bad = frame[keys.OBS_STATE].clone()
    bad[2, 0] = float("inf")  # would clip to a full step if it were converted: it is refused like NaN
    _, _, terminated, _, info = view.step(bad)
    assert terminated.tolist() == [False, False, True]
    assert torch.isfinite(info[keys.ACTION_COL]).all()


def test_wrong_inputs_are_clear_errors():
    env = make_env("so101_lift", SimConfig(num_envs=1), task_config("so101_lift", {"cameras": ["front"]}))
    with pytest.raises(ValueError, match="build the inner env with cameras=\\[\\]"):
        LeRobotView(env)
    env = make_env("so101_lift", SimConfig(num_envs=1))
    with pytest.raises(ValueError, match="unknown camera"):
        LeRobotView(env, cameras=("top",))
    view = LeRobotView(env, cameras=(), image_size=(8, 8))
    view.reset(seed=0)
    with pytest.raises(ValueError, match=r"expected \[num_envs, action_dim\] = \[1, 6\]"):
        view.step(torch.zeros(1, 5))


@pytest.mark.parametrize("field, value", [("color_scale", [0.3, 1.0]), ("light_scale", [0.2, 1.0]),
                                          ("camera_pos_jitter", 0.03)])
def test_visual_randomization_reaches_the_images(field, value):
    """Two seeds, the very same physical state: with the randomization on the view's frames differ, off they are
    equal."""
    for on in (True, False):
        dr = RandomizationConfig(**{field: value}) if on else RandomizationConfig()
        a, b = (_view("so101_pick", sim=SimConfig(num_envs=1, num_threads=1, seed=s, randomization=dr))
                for s in (0, 1))
        frame_a, _ = a.reset(seed=0)
        b.reset(seed=1)
        sa, sb = a.env.physics.state, b.env.physics.state
        for k in ("qpos", "qvel", "ctrl"):  # b takes a's state and keeps its own (randomized) model
            getattr(sb, k).copy_(getattr(sa, k))
        b.env.physics.forward(torch.arange(1))
        hold = frame_a[keys.OBS_STATE]
        frame_a, *_ = a.step(hold)
        frame_b, *_ = b.step(hold)
        assert torch.equal(a.env.physics.state.qpos, b.env.physics.state.qpos)  # the same scene...
        img_a, img_b = frame_a[FRONT].float(), frame_b[FRONT].float()
        if on:  # ...seen differently
            assert (img_a - img_b).abs().mean() > 1.0, field
        else:
            assert torch.equal(img_a, img_b)


def test_state_is_in_lerobots_joint_order_and_degrees():
    view = _view("so101_reach", n=1)
    frame, _ = view.reset(seed=0)
    q = view.env.physics.state.qpos[0, view.env.task.arm.qpos_idx].float()
    torch.testing.assert_close(frame[keys.OBS_STATE][0], so101.rad_to_deg(q))
    assert so101.LEROBOT_STATE_NAMES[0] == "shoulder_pan.pos" and len(so101.LEROBOT_STATE_NAMES) == 6
