"""The intervention agent's recovery (DESIGN.md §5): the memory of good states, the joint-space recovery policy, and
the agent sending an env to recovery before calling the person. Hand-worked numbers throughout."""

from __future__ import annotations

import pytest
import torch

from policies import keys
from robot_rl.hil import InterventionAgent, JointRecovery, StateMemory


# ---------------------------------------------------------------------------------------------------- memory
def test_memory_answers_the_best_valued_of_the_k_nearest():
    feats = torch.tensor([[0.0], [1.0], [2.0], [3.0], [10.0]])
    goals = torch.arange(10.0).reshape(5, 2)
    values = torch.tensor([0.1, 0.5, 0.3, 0.9, 1.0])
    # query 0.4: nearest rows 0 (0.4), 1 (0.6), 2 (1.6), 3 (2.6), 4 (9.6)
    g, v, rows = StateMemory(feats, goals, values, k=3).retrieve(torch.tensor([[0.4]]))
    assert rows.tolist() == [1] and v.tolist() == [0.5] and g.tolist() == [[2.0, 3.0]]
    _, _, rows = StateMemory(feats, goals, values, k=4).retrieve(torch.tensor([[0.4], [9.0]]))
    assert rows.tolist() == [3, 4]  # 9.0's four nearest: 4, 3, 2, 1 -> the 1.0 of row 4
    _, _, rows = StateMemory(feats, goals, torch.tensor([0.5, 0.5, 0.3, 0.9, 1.0]), k=2).retrieve(torch.tensor([[0.4]]))
    assert rows.tolist() == [0]  # a tie in value goes to the nearer
    _, _, rows = StateMemory(feats, goals, values, k=99).retrieve(torch.tensor([[0.4]]))
    assert rows.tolist() == [4]  # k past M: all of them


def test_memory_nearness_does_not_depend_on_a_features_units():
    """Each feature is scaled to unit spread over the memory: multiplying one by 1000 changes no answer (by plain
    Euclidean distance the query below is nearest to row 0, and to row 1 once the second feature is multiplied)."""
    feats = torch.tensor([[0.0, 0.0], [2.0, 0.3], [0.0, 1.0], [2.0, 1.0]])
    values = torch.zeros(4)
    query = torch.tensor([[0.8, 0.3]])
    one = StateMemory(feats, feats, values, k=1).retrieve(query)[2]
    big = torch.tensor([1.0, 1000.0])
    other = StateMemory(feats * big, feats, values, k=1).retrieve(query * big)[2]
    assert one.tolist() == other.tolist() == [0]


def test_memory_refuses_what_it_cannot_use():
    f, g, v = torch.zeros(3, 2), torch.zeros(3, 6), torch.zeros(3)
    with pytest.raises(ValueError, match="NaN"):
        StateMemory(f, g, torch.tensor([0.0, float("nan"), 0.0]))
    with pytest.raises(ValueError, match="one goal and value"):
        StateMemory(f, g[:2], v)
    with pytest.raises(ValueError, match="k must be"):
        StateMemory(f, g, v, k=0)
    with pytest.raises(ValueError, match=r"queries must be \[B, 2\]"):
        StateMemory(f, g, v).retrieve(torch.zeros(1, 3))


# -------------------------------------------------------------------------------------------------- recovery
def test_recovery_moves_along_the_straight_line_no_joint_faster_than_max_step():
    rec = JointRecovery(3, 2, max_step=3.0, tolerance=1.0, max_steps=5)
    rec.start(torch.tensor([True, True, False]), torch.tensor([[6.0, -3.0], [1.0, 0.5]]))
    q = torch.zeros(3, 2)
    # env 0: the move (6, -3) scaled by 3/6; env 1: (1, 0.5) within a step, taken whole; env 2 holds
    assert rec.act(q).tolist() == [[3.0, -1.5], [1.0, 0.5], [0.0, 0.0]]
    done = rec.done(torch.tensor([[3.0, -1.5], [0.5, 0.0], [0.0, 0.0]]))
    assert done.tolist() == [False, True, False]  # env 1 within 1.0 of its goal on every joint
    assert rec.active.tolist() == [True, False, False]
    for _ in range(4):
        rec.act(torch.tensor([[3.0, -1.5], [0.0, 0.0], [0.0, 0.0]]))
    assert rec.done(torch.tensor([[3.0, -1.5], [0.0, 0.0], [0.0, 0.0]])).tolist() == [True, False, False]  # 5 steps


def test_recovery_refuses_bad_goals_and_settings():
    rec = JointRecovery(2, 2)
    with pytest.raises(ValueError, match=r"goals must be \[1, 2\]"):
        rec.start(torch.tensor([True, False]), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="NaN"):
        rec.start(torch.tensor([True, False]), torch.tensor([[float("nan"), 0.0]]))
    with pytest.raises(ValueError, match="max_step"):
        JointRecovery(2, 2, max_step=0.0)


# ----------------------------------------------------------------------------------------------------- agent
class _Script:
    """A trigger asking as scripted, one row per step; records its resets."""

    def __init__(self, rows: list[list[bool]]) -> None:
        self.rows, self.resets = [torch.tensor(r) for r in rows], []

    def __call__(self, value):
        return self.rows.pop(0)

    def reset(self, env_ids):
        self.resets.append(None if env_ids is None else env_ids.tolist())


class _Person:
    def __init__(self) -> None:
        self.resets = []

    def act(self, obs):
        return torch.full((2, 2), 7.0)

    def reset(self, env_ids):
        self.resets.append(None if env_ids is None else env_ids.tolist())


def test_the_agent_recovers_first_then_calls_the_person():
    memory = StateMemory(torch.tensor([[0.0], [1.0]]), torch.tensor([[10.0, 10.0], [20.0, 20.0]]),
                         torch.tensor([0.2, 0.9]), k=2)
    trigger, person = _Script([[True, False], [True, False], [True, False], [False, False]]), _Person()
    agent = InterventionAgent(person, trigger, 2, watch=False, latch=True,
                              recovery=JointRecovery(2, 2, max_step=5.0, tolerance=1.0, max_steps=10), memory=memory)
    policy = torch.zeros(2, 2)
    feats = torch.zeros(2, 1)

    def step(joints):
        return agent({keys.OBS_STATE: torch.tensor(joints)}, policy, signal=torch.zeros(2), features=feats)

    applied, actor = step([[0.0, 0.0], [0.0, 0.0]])  # env 0 asks: recovery, toward row 1's joints (20, 20)
    assert actor.tolist() == [keys.ACTOR_RECOVERY, keys.ACTOR_POLICY]
    assert applied.tolist() == [[5.0, 5.0], [0.0, 0.0]] and person.resets == []
    applied, actor = step([[19.5, 19.5], [0.0, 0.0]])  # arrived: back to the policy, the trigger's window cleared
    assert actor.tolist() == [keys.ACTOR_POLICY, keys.ACTOR_POLICY] and applied.tolist() == [[0.0, 0.0]] * 2
    assert agent.handed_back.tolist() == [True, False] and trigger.resets == [[0]]
    applied, actor = step([[19.5, 19.5], [0.0, 0.0]])  # asks again, no recovery left this episode: the person
    assert actor.tolist() == [keys.ACTOR_HUMAN, keys.ACTOR_POLICY] and applied.tolist() == [[7.0, 7.0], [0.0, 0.0]]
    assert person.resets == [[0]] and not agent.handed_back.any()
    _, actor = step([[19.5, 19.5], [0.0, 0.0]])  # latched
    assert actor.tolist() == [keys.ACTOR_HUMAN, keys.ACTOR_POLICY]
    agent.end(torch.tensor([True, False]), torch.tensor([True, False]))
    report = agent.report()
    assert report["hil/takeovers"] == 2.0 and report["hil/recoveries"] == 1.0
    assert report["hil/person_takeovers"] == 1.0 and report["hil/person_takeovers_per_success"] == 1.0
    assert report["hil/steps/recovery"] == 1.0 and report["hil/steps/human"] == 2.0
    assert agent.recovered.tolist() == [0, 0]  # a new episode has its recovery again
    state = agent.state_dict()
    agent.recovery_count = 0
    agent.load_state_dict(state)
    assert agent.report()["hil/recoveries"] == 1.0


def test_the_agent_needs_features_for_a_recovery_and_a_memory_for_a_recovery_policy():
    memory = StateMemory(torch.zeros(1, 1), torch.zeros(1, 2), torch.zeros(1))
    with pytest.raises(ValueError, match="needs a memory"):
        InterventionAgent(_Person(), _Script([]), 2, watch=False, recovery=JointRecovery(2, 2))
    agent = InterventionAgent(_Person(), _Script([[True, False]]), 2, watch=False, recovery=JointRecovery(2, 2),
                              memory=memory)
    with pytest.raises(ValueError, match="features"):
        agent({keys.OBS_STATE: torch.zeros(2, 2)}, torch.zeros(2, 2), signal=torch.zeros(2))
