"""The shared pieces of the VecEnv contract (robot_rl/env.py): the action sanitiser, who acted, the episode
tracker, named observation parts, and checkpoints of envs that are not resumable."""

from pathlib import Path

import pytest
import torch

from policies import keys
from robot_rl.checkpoint import Checkpoint
from robot_rl.env import EpisodeTracker, ObsSpec, actor_ids, sanitize_action
from robot_rl.runners.common import restore_run_state, run_state
from tests._toy_envs import PointMassEnv


def test_sanitize_action_checks_clips_and_reports_bad_rows():
    a = torch.tensor([[0.5, 2.0], [-3.0, 0.0]], dtype=torch.float64)
    applied, bad = sanitize_action(a, 2, 2, torch.device("cpu"))
    assert applied.dtype == torch.float32 and applied.tolist() == [[0.5, 1.0], [-1.0, 0.0]] and bad is None
    a = torch.tensor([[0.5, float("nan")], [0.25, 0.0], [float("inf"), 0.0]])
    with pytest.raises(ValueError, match=r"non-finite action .*envs \[0, 2\]"):
        sanitize_action(a, 3, 2, torch.device("cpu"))
    applied, bad = sanitize_action(a, 3, 2, torch.device("cpu"), on_nonfinite="reset")
    assert bad.tolist() == [True, False, True] and applied.tolist() == [[0.0, 0.0], [0.25, 0.0], [0.0, 0.0]]
    a[1] = torch.tensor([2.0, -3.0])  # the finite rows beside bad ones are clipped too
    applied, bad = sanitize_action(a, 3, 2, torch.device("cpu"), on_nonfinite="reset")
    assert applied.tolist() == [[0.0, 0.0], [1.0, -1.0], [0.0, 0.0]]
    with pytest.raises(ValueError, match=r"expected \[num_envs, action_dim\] = \[3, 3\]"):
        sanitize_action(a, 3, 3, torch.device("cpu"))



def test_sanitize_action_passes_finite_rows_whose_sum_overflows():
    """The fast check is a sum; finite actions summing past float32's range are still finite, and are clipped."""
    a = torch.tensor([[3e38, 3e38], [-2.0, -0.5]])
    applied, bad = sanitize_action(a, 2, 2, torch.device("cpu"))
    assert bad is None and applied.tolist() == [[1.0, 1.0], [-1.0, -0.5]]


def test_a_non_finite_action_error_names_the_first_ten_envs():
    a = torch.zeros(11, 2)
    a[:, 1] = float("nan")
    with pytest.raises(ValueError, match=r"envs \[0, 1, 2, 3, 4, 5, 6, 7, 8, 9\]\.\.\.;"):
        sanitize_action(a, 11, 2, torch.device("cpu"))
    a[10:, 1] = 0.0  # exactly ten: no ellipsis
    with pytest.raises(ValueError, match=r"envs \[0, 1, 2, 3, 4, 5, 6, 7, 8, 9\];"):
        sanitize_action(a, 11, 2, torch.device("cpu"))


def test_actor_ids():
    assert actor_ids(None, 2, torch.device("cpu")).tolist() == [keys.ACTOR_POLICY] * 2
    assert actor_ids(keys.ACTOR_RECOVERY, 2, torch.device("cpu")).tolist() == [keys.ACTOR_RECOVERY] * 2
    assert actor_ids(torch.tensor([1, 0]), 2, torch.device("cpu")).tolist() == [1, 0]
    assert actor_ids(keys.ACTOR_POLICY, 2, torch.device("cpu")).tolist() == [0, 0]  # 0 as an int is the policy
    for bad in (3, -1, torch.tensor([0, 5]), torch.tensor([0, 3]), torch.tensor([-1, 0]), torch.tensor([0.0, 1.0]),
                torch.tensor([0])):
        with pytest.raises(ValueError, match="actor"):
            actor_ids(bad, 2, torch.device("cpu"))


def test_episode_tracker_by_hand():
    t = EpisodeTracker(3, torch.device("cpu"))
    t.add(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([False, True, False]))
    t.add(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([False, False, False]))
    ep = t.stats()
    assert ep[keys.EP_RETURN].tolist() == [1.5, 2.5, 3.5] and ep[keys.EP_LENGTH].tolist() == [2, 2, 2]
    assert ep[keys.EP_SUCCESS].tolist() == [False, True, False]
    t.reset(torch.tensor([False, True, False]))  # a mask
    t.reset(torch.tensor([2]))  # indices
    assert t.returns.tolist() == [1.5, 0.0, 0.0] and t.lengths.tolist() == [2, 0, 0] and not t.successes.any()
    assert ep[keys.EP_RETURN].tolist() == [1.5, 2.5, 3.5]  # stats are copies
    t.reset()
    assert t.lengths.tolist() == [0, 0, 0]


def test_obs_spec_parts():
    spec = ObsSpec.from_parts({keys.POLICY: [("joint_pos", 2), ("goal", 3)], keys.PROPRIO: [("joint_pos", 2)]})
    assert spec.shapes == {keys.POLICY: (5,), keys.PROPRIO: (2,)}
    assert spec.parts[keys.POLICY] == {"joint_pos": (0, 2), "goal": (2, 5)}
    obs = {keys.POLICY: torch.arange(5.0)[None], keys.PROPRIO: torch.tensor([[7.0, 8.0]])}
    assert spec.part(obs, "goal").tolist() == [[2.0, 3.0, 4.0]]
    assert spec.part(obs, "joint_pos", [keys.PROPRIO, keys.POLICY]).tolist() == [[7.0, 8.0]]  # first group wins
    assert spec.part({keys.POLICY: obs[keys.POLICY]}, "joint_pos", [keys.PROPRIO, keys.POLICY]).tolist() == [[0, 1]]
    with pytest.raises(ValueError, match="twice"):
        ObsSpec.from_parts({keys.POLICY: [("a", 1), ("a", 2)]})


class _Algo:
    def __init__(self):
        self.loaded = False

    def state_dict(self):
        return {"w": torch.zeros(1)}

    def load_state_dict(self, sd):
        self.loaded = True


class _FrozenPointMass(PointMassEnv):
    """A toy env whose state cannot be saved (like a real arm or Isaac Lab)."""

    resumable = False

    def state_dict(self):
        return {}


def test_checkpoints_of_non_resumable_envs_hold_no_env_state_and_refuse_to_resume():
    env, algo = _FrozenPointMass(num_envs=2), _Algo()
    obs, _ = env.reset(seed=0)
    state = run_state(algo, env, obs, {"iteration": 3})
    assert state["env"] is None
    with pytest.raises(ValueError, match="_FrozenPointMass is not resumable"):
        restore_run_state(Checkpoint(Path("ckpt"), state, {}), algo, env, torch.device("cpu"))
    assert not algo.loaded  # refused before anything was loaded
    resumable = PointMassEnv(num_envs=2)
    with pytest.raises(ValueError, match="holds no env state"):
        restore_run_state(Checkpoint(Path("ckpt"), state, {}), algo, resumable, torch.device("cpu"))
    state = run_state(algo, resumable, resumable.reset(seed=0)[0], {})
    restore_run_state(Checkpoint(Path("ckpt"), state, {}), algo, resumable, torch.device("cpu"))
    assert algo.loaded
