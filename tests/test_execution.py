"""ActionQueue: ACT-style temporal ensembling against hand-computed numbers, task strings passed through (and subset
with the tensors), and ``due`` naming exactly the envs the next call asks the policy for."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from policies import ActionQueue, Policy, keys
from policies.execution import (
    add_to_ensemble,
    ensemble_weights,
    set_executed_steps,
    set_mean_of_samples,
    set_median_actions,
    set_temporal_ensemble,
    subset_obs,
)


class _Counter(Policy):
    """Chunk c (the c-th call) predicts 10·c + j at its step j, for every env and action dim; records what it saw."""

    type_name, config_class = "test_counter", dict

    def __init__(self, horizon: int = 3, executed: int = 1, action_dim: int = 1) -> None:
        super().__init__()
        self._h, self._e, self.a = horizon, executed, action_dim
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.calls = 0
        self.seen: list[dict] = []

    @property
    def horizon(self) -> int:
        return self._h

    @property
    def executed_steps(self) -> int:
        return self._e

    def act(self, obs, deterministic=True):
        self.seen.append(obs)
        n = len(obs[keys.OBS_STATE])
        chunk = 10.0 * self.calls + torch.arange(self._h, dtype=torch.float32)
        self.calls += 1
        return chunk[None, :, None].expand(n, self._h, self.a).clone()


def _frame(n: int) -> dict:
    return {keys.OBS_STATE: torch.arange(n, dtype=torch.float32)[:, None].expand(n, 6).clone(),
            keys.TASK: [f"task {i}" for i in range(n)]}


def test_ensemble_weights_by_hand():
    # m = 0.5, three predictions: [1, e^-0.5, e^-1] / (1 + e^-0.5 + e^-1)
    torch.testing.assert_close(ensemble_weights(3, 0.5), torch.tensor([0.5064804, 0.3071959, 0.1863237]))
    torch.testing.assert_close(ensemble_weights(4, 0.0), torch.full((4,), 0.25))
    assert ensemble_weights(2, -1.0)[1] > ensemble_weights(2, -1.0)[0]  # m < 0 favours the newest


def test_add_to_ensemble_by_hand():
    # K = 2 steps, A = 1. Row 0 ensembles (m = 1): step 0 holds 2 predictions summing to 3 (weight 1.5), step 1 none;
    # row 1 queues (m NaN): whatever it held is dropped.
    total = torch.tensor([[[3.0], [0.0]], [[7.0], [7.0]]])
    weight = torch.tensor([[1.5, 0.0], [1.0, 1.0]])
    count = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    chunk = torch.tensor([[[10.0], [20.0]], [[5.0], [6.0]]])
    t, w, n = add_to_ensemble(total, weight, count, chunk, torch.tensor([1.0, float("nan")]))
    e2 = 0.1353352832  # exp(-2): the third prediction for row 0's step 0
    torch.testing.assert_close(t, torch.tensor([[[3.0 + 10 * e2], [20.0]], [[5.0], [6.0]]]))
    torch.testing.assert_close(w, torch.tensor([[1.5 + e2, 1.0], [1.0, 1.0]]))
    torch.testing.assert_close(n, torch.tensor([[3.0, 1.0], [1.0, 1.0]]))


def test_temporal_ensembling_by_hand():
    # H = 3, asked every step, m = 0.5. Chunk c predicts 10c + j at its step j, i.e. 9c + s for absolute step s.
    pol = _Counter(horizon=3, executed=1)
    q = ActionQueue(pol, num_envs=2, action_dim=1, temporal_ensemble=0.5, query_every=1)
    got = [q(_frame(2))[:, 0] for _ in range(4)]
    e5, e1 = 0.6065306597, 0.3678794412
    want = [0.0,  # chunk 0 alone
            (1 + 10 * e5) / (1 + e5),  # 4.397866: chunk 0's step 1 (oldest, weight 1), chunk 1's step 0
            (2 + 11 * e5 + 20 * e1) / (1 + e5 + e1),  # 8.118590
            (12 + 21 * e5 + 30 * e1) / (1 + e5 + e1)]  # 18.118590: chunk 0 no longer reaches step 3
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, torch.full((2,), w), rtol=1e-6, atol=1e-5)
    assert pol.calls == 4


def test_temporal_ensembling_every_other_step_and_reset():
    pol = _Counter(horizon=3, executed=1)
    q = ActionQueue(pol, num_envs=2, action_dim=1, temporal_ensemble=1.0, query_every=2)
    e = 0.3678794412
    a0, a1, a2 = (q(_frame(2))[:, 0] for _ in range(3))
    assert pol.calls == 2  # asked at steps 0 and 2
    torch.testing.assert_close(a0, torch.zeros(2))
    torch.testing.assert_close(a1, torch.ones(2))  # chunk 0's step 1 alone
    torch.testing.assert_close(a2, torch.full((2,), (2 + 10 * e) / (1 + e)))  # chunk 0's step 2, chunk 1's step 0
    q.reset(torch.tensor([1]))  # env 1's blend is forgotten: its next action is the new chunk's first step
    assert q.due().tolist() == [1]
    a3 = q(_frame(2))[:, 0]
    assert pol.calls == 3 and len(pol.seen[-1][keys.OBS_STATE]) == 1
    torch.testing.assert_close(a3, torch.tensor([11.0, 20.0]))  # env 0: chunk 1's step 1 alone; env 1: chunk 2


def test_queue_passes_task_strings_and_subsets_them():
    pol = _Counter(horizon=4, executed=3)
    q = ActionQueue(pol, num_envs=3, action_dim=1)
    frame = _frame(3)
    q(frame)
    assert pol.seen[-1][keys.TASK] == ["task 0", "task 1", "task 2"]
    q(frame)
    q.reset(torch.tensor([2, 0]))
    q(frame)
    assert pol.calls == 2 and pol.seen[-1][keys.TASK] == ["task 0", "task 2"]  # rows in env order, like the tensors
    assert pol.seen[-1][keys.OBS_STATE][:, 0].tolist() == [0.0, 2.0]
    sub = subset_obs({"x": torch.arange(4), "t": ("a", "b", "c", "d"), "s": "same"}, torch.tensor([3, 1]))
    assert sub["x"].tolist() == [3, 1] and sub["t"] == ["d", "b"] and sub["s"] == "same"


def test_due_names_the_envs_asked_next():
    pol = _Counter(horizon=5, executed=3)
    q = ActionQueue(pol, num_envs=4, action_dim=1)
    assert q.due().tolist() == [0, 1, 2, 3]
    for step in range(7):
        due = q.due().tolist()
        before = pol.calls
        q(_frame(4))
        asked = len(pol.seen[-1][keys.OBS_STATE]) if pol.calls > before else 0
        assert asked == len(due), (step, due)
        assert due == ([0, 1, 2, 3] if step % 3 == 0 else [])
        if step == 4:
            q.reset(torch.tensor([1, 3]))
            assert q.due().tolist() == [1, 3]
            q(_frame(4))
            assert pol.seen[-1][keys.TASK] == ["task 1", "task 3"]
            break
    # A step policy is asked every step: every env is always due.
    step_pol = _Counter(horizon=1, executed=1)
    assert ActionQueue(step_pol, num_envs=2, action_dim=1).due().tolist() == [0, 1]


def test_ensembling_options_are_checked():
    with pytest.raises(ValueError, match="needs a chunking policy"):
        ActionQueue(_Counter(horizon=1), num_envs=1, action_dim=1, temporal_ensemble=0.01)
    for bad in (0, 4):
        with pytest.raises(ValueError, match=rf"query_every must be in \[1, horizon 3\], got {bad}"):
            ActionQueue(_Counter(horizon=3), num_envs=1, action_dim=1, temporal_ensemble=0.01, query_every=bad)
    for good in (1, 3):  # the bounds themselves
        assert ActionQueue(_Counter(horizon=3), num_envs=1, action_dim=1, query_every=good).period.tolist() == [good]
    with pytest.raises(ValueError, match="returned shape"):
        ActionQueue(_Counter(horizon=3, action_dim=2), num_envs=1, action_dim=1, temporal_ensemble=0.0)(_frame(1))


class _PerTask(_Counter):
    """_Counter that executes 1 step of its chunks for "task 0" and 3 for any other instruction."""

    def executed_steps_for(self, task):
        return 1 if task == "task 0" else 3


def test_queue_executes_each_envs_own_steps_per_instruction():
    # H = 4. Env 0 ("task 0") executes 1 step per chunk: asked at every step; env 1, 3 steps: asked at steps 0, 3.
    pol = _PerTask(horizon=4, executed=4)
    q = ActionQueue(pol, num_envs=2, action_dim=1)
    asked, acts = [], []
    for _ in range(6):
        asked.append(q.due().tolist())
        acts.append(q(_frame(2))[:, 0].tolist())
    assert asked == [[0, 1], [0], [0], [0, 1], [0], [0]]
    # calls: 0 (both), 1 (env 0), 2 (env 0), 3 (both), 4, 5: each env's action is its latest chunk's step pos
    assert acts == [[0.0, 0.0], [10.0, 1.0], [20.0, 2.0], [30.0, 30.0], [40.0, 31.0], [50.0, 32.0]]
    q.reset(torch.tensor([1]))
    assert q.due().tolist() == [0, 1]  # a reset env asks at once, whatever its period was


def test_queue_refuses_a_per_task_step_count_outside_the_chunk():
    class _Bad(_Counter):
        def executed_steps_for(self, task):
            return 5  # > horizon 4

    q = ActionQueue(_Bad(horizon=4, executed=2), num_envs=2, action_dim=1)
    with pytest.raises(ValueError, match=r"executed_steps_for gave \[5\], outside \[1, horizon 4\]"):
        q(_frame(2))


def test_queue_without_instructions_uses_executed_steps():
    pol = _PerTask(horizon=4, executed=2)
    q = ActionQueue(pol, num_envs=2, action_dim=1)
    frame = {keys.OBS_STATE: torch.zeros(2, 6)}  # no task: executed_steps (2) for both envs
    for _ in range(4):
        q(frame)
    assert pol.calls == 2


class _Blending(_PerTask):
    """_PerTask exported with ACT's temporal ensembling (what ``FlowVLAConfig.temporal_ensemble`` carries)."""

    temporal_ensemble = 1.0


E1 = 0.3678794412  # exp(-1)
# H = 4, m = 1, env 0 ("task 0") asked every step and env 1 every 3 steps; chunk c (the c-th call) predicts 10c + j
# at its step j, so env 0 holds chunks 0-3 and env 1 chunks 0 and 3 (asked at steps 0 and 3).
ENSEMBLED_ENV0 = [0.0, (1 + 10 * E1) / (1 + E1), (2 + 11 * E1 + 20 * E1**2) / (1 + E1 + E1**2),
                  (3 + 12 * E1 + 21 * E1**2 + 30 * E1**3) / (1 + E1 + E1**2 + E1**3)]


def _four_steps(q: ActionQueue) -> tuple[list[torch.Tensor], list[list[int]]]:
    got, due = [], []
    for _ in range(4):
        due.append(q.due().tolist())
        got.append(q(_frame(2))[:, 0])
    return got, due


def test_the_policys_own_ensembling_is_the_default_and_asks_every_executed_steps_per_task():
    pol = _Blending(horizon=4, executed=4)
    got, due = _four_steps(ActionQueue(pol, num_envs=2, action_dim=1))
    assert due == [[0, 1], [0], [0], [0, 1]] and pol.calls == 4
    ensembled_env1 = [0.0, 1.0, 2.0, (3 + 30 * E1) / (1 + E1)]  # alone until its second chunk (the call at step 3)
    for g, w0, w1 in zip(got, ENSEMBLED_ENV0, ensembled_env1, strict=True):
        torch.testing.assert_close(g, torch.tensor([w0, w1]), rtol=1e-6, atol=1e-5)
    # An explicit choice overrides what the policy carries: None runs every env as a queue.
    queued, _ = _four_steps(ActionQueue(_Blending(horizon=4, executed=4), num_envs=2, action_dim=1,
                                        temporal_ensemble=None))
    assert [g.tolist() for g in queued] == [[0.0, 0.0], [10.0, 1.0], [20.0, 2.0], [30.0, 30.0]]


class _BlendingOne(_PerTask):
    """_PerTask that ensembles (m = 1) the episodes of "task 0" only: the others run as a queue."""

    def temporal_ensemble_for(self, task):
        return 1.0 if task == "task 0" else None


def test_envs_of_one_queue_ensemble_or_queue_by_their_instruction():
    pol = _BlendingOne(horizon=4, executed=4)
    q = ActionQueue(pol, num_envs=2, action_dim=1)
    got, due = _four_steps(q)
    assert due == [[0, 1], [0], [0], [0, 1]]
    assert q.coeff[0] == 1.0 and q.coeff[1].isnan()
    queued_env1 = [0.0, 1.0, 2.0, 30.0]  # chunk 0's first 3 steps, then chunk 3 replaces it
    for g, w0, w1 in zip(got, ENSEMBLED_ENV0, queued_env1, strict=True):
        torch.testing.assert_close(g, torch.tensor([w0, w1]), rtol=1e-6, atol=1e-5)


@dataclasses.dataclass
class _ChunkCfg:
    executed_steps: int = 2
    executed_steps_by_task: dict = dataclasses.field(default_factory=lambda: {"task 0": 1})
    temporal_ensemble: float | None = None
    temporal_ensemble_by_task: dict = dataclasses.field(default_factory=lambda: {"task 0": 0.5})
    mean_of_samples: int = 1
    median_actions: list = dataclasses.field(default_factory=list)


class _Configured(_Counter):
    """_Counter with a dataclass config, as the flow VLA keeps its execution settings."""

    def __init__(self, horizon: int = 4, cfg: object = None) -> None:
        super().__init__(horizon=horizon)
        self.cfg = _ChunkCfg() if cfg is None else cfg

    def median_dims(self) -> list[int]:
        unknown = [n for n in self.cfg.median_actions if n != "gripper.pos"]
        if unknown:
            raise ValueError(f"no action named {unknown}")
        return [5] if self.cfg.median_actions else []


def test_execution_setters_check_the_value_and_the_policy():
    """robot-rl eval's executed_steps / temporal_ensemble / mean_of_samples / median_actions: each value at its
    bounds, and refused for a policy that does not keep the setting (a step policy, a config that is no dataclass or
    lacks the field)."""
    pol = _Configured(horizon=4)
    for k in (1, 4):
        set_executed_steps(pol, k)
        assert pol.cfg.executed_steps == k and pol.cfg.executed_steps_by_task == {}
    for k in (0, 5):
        with pytest.raises(ValueError, match=rf"executed_steps={k} must be in \[1, horizon 4\]"):
            set_executed_steps(pol, k)
    set_temporal_ensemble(pol, 0.25)
    assert pol.cfg.temporal_ensemble == 0.25 and pol.cfg.temporal_ensemble_by_task == {}
    set_temporal_ensemble(pol, None)
    assert pol.cfg.temporal_ensemble is None
    two = _Configured(horizon=2)  # the shortest chunk
    set_executed_steps(two, 2)
    set_temporal_ensemble(two, 0.1)
    assert (two.cfg.executed_steps, two.cfg.temporal_ensemble) == (2, 0.1)
    for cfg_less in (_Configured(horizon=1), _Configured(cfg={"executed_steps": 2, "temporal_ensemble": None}),
                     _Configured(cfg=dataclasses.make_dataclass("Plain", [("horizon", int, 4)])())):
        with pytest.raises(ValueError, match="executed_steps=2 is for chunking policies"):
            set_executed_steps(cfg_less, 2)
        with pytest.raises(ValueError, match="is for chunking policies that keep one"):
            set_temporal_ensemble(cfg_less, 0.1)
    set_mean_of_samples(pol, 1)
    set_mean_of_samples(pol, 16)
    assert pol.cfg.mean_of_samples == 16
    for k in (0, True, 2.0):
        with pytest.raises(ValueError, match="must be an int >= 1"):
            set_mean_of_samples(pol, k)
    set_median_actions(pol, ["gripper.pos"])
    assert pol.cfg.median_actions == ["gripper.pos"]
    with pytest.raises(ValueError, match="no action named"):
        set_median_actions(pol, ["elbow.pos"])
    assert pol.cfg.median_actions == ["gripper.pos"]  # a refused name leaves the config as it was
    for no_field in (_Configured(cfg={"mean_of_samples": 1, "median_actions": []}),
                     _Configured(cfg=dataclasses.make_dataclass("Plain", [("horizon", int, 4)])())):
        with pytest.raises(ValueError, match="is for policies that sample their actions"):
            set_mean_of_samples(no_field, 2)
        with pytest.raises(ValueError, match="is for policies that sample their actions"):
            set_median_actions(no_field, [])


def test_a_two_step_chunk_is_asked_every_other_step():
    q = ActionQueue(_Counter(horizon=2, executed=2), num_envs=2, action_dim=1)
    due, acts = [], []
    for _ in range(4):
        due.append(q.due().tolist())
        acts.append(q(_frame(2))[:, 0].tolist())
    assert due == [[0, 1], [], [0, 1], []]
    assert acts == [[0.0, 0.0], [1.0, 1.0], [10.0, 10.0], [11.0, 11.0]]
