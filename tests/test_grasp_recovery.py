"""``grasp_recovery``: the scripted expert botches an episode's first grasp on purpose (beside the cube, askew), starts
over, and offers the correction as the label a recorder writes; the flaws of ``quality`` stay those of the seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies import keys
from robot_rl.cli.collect import CollectCommand, ExpertActor, record
from sim.config import SimConfig
from sim.experts import BOTCH_XY, BOTCH_YAW_DEG, BOTCH_Z, GRIPPER_OPEN, make_expert
from sim.lerobot_view import LeRobotView
from sim.registry import make_env, task_config


def _lift(n: int):
    return make_env("so101_lift", SimConfig(num_envs=n, num_threads=1), task_config("so101_lift", {}))


def test_the_botch_is_drawn_apart_from_the_quality_flaws():
    with _lift(8) as env:
        plain, botching = make_expert(env, quality=0.5, seed=3), make_expert(env, quality=0.5, seed=3,
                                                                            grasp_recovery=1.0)
        for _ in range(2):  # at the first episodes and again after a reset
            for name in ("noise_std", "pause", "detour", "miss", "drop"):
                assert np.array_equal(getattr(plain, name), getattr(botching, name)), name
            plain.reset(), botching.reset()
        assert not plain.botch.any() and plain.label_action is None
        xy = np.linalg.norm(botching.botch[:, :2], axis=1)
        assert ((xy >= BOTCH_XY[0]) & (xy <= BOTCH_XY[1])).all()
        assert ((botching.botch[:, 2] >= BOTCH_Z[0]) & (botching.botch[:, 2] <= BOTCH_Z[1])).all()
        yaw = np.rad2deg(np.abs(botching.botch[:, 3]))
        assert ((yaw >= BOTCH_YAW_DEG[0]) & (yaw <= BOTCH_YAW_DEG[1])).all()
        assert (make_expert(env, seed=3, grasp_recovery=0.5).botch.any(axis=1)).sum() in range(1, 8)
    with pytest.raises(ValueError, match="grasp_recovery"):
        make_expert(env, grasp_recovery=1.5)
    with (make_env("so101_push", SimConfig(num_envs=1, num_threads=1), task_config("so101_push", {})) as push,
          pytest.raises(ValueError, match="no grasp to botch")):
        make_expert(push, grasp_recovery=0.3)
    with pytest.raises(ValueError, match="cannot be combined"):
        CollectCommand(policy="runs/x", grasp_recovery=0.3)


def test_a_botched_grasp_is_labelled_with_the_correction_and_the_episode_still_succeeds():
    """so101_lift, every first grasp botched: while the expert goes down beside the cube and closes there, its label
    opens the jaws (the gripper's label above what is sent) and aims elsewhere; where the lift finds no cube the
    expert starts over, and from then on the label is what is sent (a botch that grasps after all lifts on). The
    episodes still succeed."""
    n = 4
    with _lift(n) as env:
        expert = make_expert(env, seed=0, grasp_recovery=1.0)
        obs, _ = env.reset(seed=0)
        relabelled_in = {i: set() for i in range(n)}
        gripper_label_above = np.zeros(n, dtype=bool)
        arm_differs = np.zeros(n, dtype=bool)
        restarted = np.zeros(n, dtype=bool)
        after_restart_relabels = 0
        ended, success = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        for _ in range(env.max_episode_length):
            phase_before = expert.phase.copy()
            action = expert.act(obs)
            label = expert.label_action
            for i in np.flatnonzero(~ended):
                if restarted[i]:
                    after_restart_relabels += int(expert._relabelled[i])
                elif expert._relabelled[i]:
                    relabelled_in[i].add(int(phase_before[i]))
                    gripper_label_above[i] |= bool(label[i, 5] > action[i, 5] + 0.5)
                    arm_differs[i] |= bool((label[i, :5] - action[i, :5]).abs().max() > 0.05)
                else:
                    assert torch.equal(label[i], action[i])
                restarted[i] |= not expert.botch[i].any()
            obs, _, terminated, truncated, info = env.step(action)
            success |= info[keys.SUCCESS].numpy() & ~ended
            ended |= (terminated | truncated).numpy()
            if ended.all():
                break
    assert all({2, 3} <= phases for phases in relabelled_in.values()), relabelled_in
    assert gripper_label_above.all() and arm_differs.all()
    assert restarted.any() and after_restart_relabels == 0
    assert success.sum() >= n - 1


def test_collect_records_the_correction_and_sends_the_botch():
    """Through ``ExpertActor`` and ``record``: the recorded action is the expert's label where it relabels (the
    gripper held open while the one sent closes), the command sent elsewhere."""

    class Log:
        def __init__(self) -> None:
            self.recorded: list[torch.Tensor] = []

        def add(self, frames, action, reward, success, done, **kwargs) -> list:
            self.recorded.append(action.clone())
            return []

    class Sent(ExpertActor):
        def __call__(self, frames):
            out = super().__call__(frames)
            self.sent.append(out[0].clone())
            return out

    with _lift(2) as env:
        view = LeRobotView(env, cameras=(), image_size=(32, 32))
        actor = Sent(view, make_expert(env, seed=0, grasp_recovery=1.0))
        actor.sent, log = [], Log()
        with pytest.raises(StopIteration):  # the log never reports a written episode: stop after 45 steps
            def stop_after(frames, action, reward, success, done, **kwargs):
                if len(log.recorded) == 45:
                    raise StopIteration
                return Log.add(log, frames, action, reward, success, done)

            log.add = stop_after
            record(view, actor, log, 1, seed=0)
    sent, recorded = torch.stack(actor.sent[:45]), torch.stack(log.recorded)
    differs = (sent - recorded).abs().amax(dim=2) > 1e-4  # [steps, N]
    assert differs.any(dim=0).all()  # each env's botch was relabelled ...
    assert (~differs).any(dim=0).all()  # ... and the approach recorded as sent
    held_open = recorded[..., 5] > sent[..., 5] + 5.0  # degrees: the label's jaw open, the one sent closing
    assert held_open.any(dim=0).all()
    assert GRIPPER_OPEN > 0
