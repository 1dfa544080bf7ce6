"""robot_rl.hil: take-over triggers and the arbiter, against sequences worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from policies import keys
from robot_rl.hil import Arbiter, Polled, ValueStall, ValueThreshold, window_slopes


def test_window_slopes_by_hand():
    # Theil-Sen: the median of the pairwise slopes (v_j - v_i) / (j - i) over the 6 pairs of a 4-step window
    v = torch.tensor([[0.0, 1.0, 2.0, 3.0],  # every pair 1
                      [2.0, 2.0, 2.0, 2.0],  # 0
                      [1.0, 0.0, 1.0, 0.0],  # -1, 0, -1/3, 1, 0, -1 -> sorted -1, -1, -1/3, 0, 0, 1: median -1/6
                      [0.0, 0.0, 0.0, -3.0]])  # 0, 0, -1, 0, -1.5, -3 -> median (-1 + 0) / 2 = -0.5
    torch.testing.assert_close(window_slopes(v), torch.tensor([1.0, 0.0, -1.0 / 6.0, -0.5]))
    # one bad frame anywhere in a rising window leaves the slope at the trend
    rising = torch.arange(6.0)[None].repeat(6, 1)
    rising[torch.arange(6), torch.arange(6)] -= 10.0
    torch.testing.assert_close(window_slopes(rising), torch.ones(6))
    with pytest.raises(ValueError, match="window of >= 2"):
        window_slopes(torch.zeros(1, 1))


def test_value_threshold_waits_for_after_and_patience_and_restarts_per_episode():
    trig = ValueThreshold(threshold=-0.5, patience=2, after=2, num_envs=2)
    # env 0 below from the start; env 1 dips once, then stays below from step 2
    seq = [[-0.9, -0.9], [-0.9, -0.1], [-0.9, -0.9], [-0.9, -0.9], [-0.1, -0.9]]
    fired = [trig(torch.tensor(v)).tolist() for v in seq]
    # env 0: below 1, 2, 3, 4 steps; may ask from step 2 on -> asks at steps 2, 3; step 4 is above
    # env 1: below counts 1, 0, 1, 2, 3 -> asks at steps 3, 4
    assert fired == [[False, False], [False, False], [True, False], [True, True], [False, True]]
    trig.reset(torch.tensor([1]))
    # env 0: count 1 again (step 4 was above); env 1 starts over: step 0 of its episode
    assert trig(torch.tensor([-0.9, -0.9])).tolist() == [False, False]
    assert trig(torch.tensor([-0.9, -0.9])).tolist() == [True, False]  # env 0: count 2; env 1: step 1 < after
    with pytest.raises(ValueError, match=r"reads V\(o_t\) \[2\]"):
        trig(torch.zeros(3))


def test_value_stall_answers_to_a_trend_not_to_a_dip():
    m = 100  # value scale: an on-course episode gains 1/m per step
    stall = ValueStall(window=5, min_slope=0.25 / m, after=0, num_envs=4)
    rising = -0.6 + torch.arange(12) / m
    dip = rising.clone()
    dip[6] -= 0.3  # one bad frame, worth 30 steps of progress
    flat = torch.full((12,), -0.6)
    falling = -0.6 - torch.arange(12) / m
    fired = torch.stack([stall(torch.stack([rising[t], dip[t], flat[t], falling[t]])) for t in range(12)])
    assert not fired[:4].any()  # fewer than 5 values: never
    assert not fired[:, 0].any() and not fired[:, 1].any()  # on course, with or without the dip
    assert fired[4:, 2].all() and fired[4:, 3].all()  # stagnation and decline, from the first full window on
    stall.reset(None)
    assert not stall(torch.full((4,), -0.6)).any()  # history forgotten: the window fills again


def test_value_stall_ceiling_and_after():
    stall = ValueStall(window=2, min_slope=0.0, after=3, num_envs=2, ceiling=-0.1)
    out = [stall(torch.tensor([-0.5, -0.05])).tolist() for _ in range(5)]
    # flat (slope 0 is not < 0): never; make min_slope positive to see after and the ceiling act
    assert not any(any(o) for o in out)
    stall = ValueStall(window=2, min_slope=0.01, after=3, num_envs=2, ceiling=-0.1)
    out = [stall(torch.tensor([-0.5, -0.05])).tolist() for _ in range(5)]
    assert out == [[False, False]] * 3 + [[True, False]] * 2  # from step 3; env 1 sits above the ceiling


def test_arbiter_latch_keeps_control_until_reset_and_counts():
    arb = Arbiter(3, latch=True)
    s, r = arb.update(torch.tensor([False, True, False]))
    assert s.tolist() == [False, True, False] and not r.any()
    s, r = arb.update(torch.tensor([False, False, True]))  # env 1 keeps it without asking again
    assert s.tolist() == [False, False, True] and not r.any()
    assert arb.actor.tolist() == [keys.ACTOR_POLICY, keys.ACTOR_HUMAN, keys.ACTOR_HUMAN]
    mixed = arb.mix(torch.zeros(3, 2), torch.ones(3, 2))
    assert mixed.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
    arb.reset(torch.tensor([1]))
    assert arb.actor.tolist() == [keys.ACTOR_POLICY, keys.ACTOR_POLICY, keys.ACTOR_HUMAN]
    report = arb.report(successes=4)
    # steps by actor: step 1 policy 2 / human 1, step 2 policy 1 / human 2
    assert report["steps/policy"] == 3 and report["steps/human"] == 3 and report["takeovers"] == 2
    assert report["intervention_rate"] == 0.5 and report["takeovers_per_success"] == 0.5
    assert math.isnan(arb.report(successes=0)["takeovers_per_success"])


def test_arbiter_without_latch_follows_the_request_and_hands_to_recovery():
    arb = Arbiter(1, latch=False, taker=keys.ACTOR_RECOVERY)
    got = [arb.update(torch.tensor([x])) for x in (True, True, False)]
    assert [(bool(s[0]), bool(r[0])) for s, r in got] == [(True, False), (False, False), (False, True)]
    assert int(arb.actor[0]) == keys.ACTOR_POLICY and arb.report()["steps/recovery"] == 2
    with pytest.raises(ValueError, match="taker"):
        Arbiter(1, latch=False, taker=keys.ACTOR_POLICY)


def test_a_persons_takeover_source_is_a_trigger():
    from real.teleop import ScheduledTakeover

    arb, request = Arbiter(1, latch=False), Polled(ScheduledTakeover([1, 3]))
    actors = []
    for _ in range(4):
        arb.update(request())
        actors.append(int(arb.actor[0]))
    assert actors == [keys.ACTOR_POLICY, keys.ACTOR_HUMAN, keys.ACTOR_HUMAN, keys.ACTOR_POLICY]


def test_the_replay_keeps_who_acted_through_sampling_and_checkpoints():
    from robot_rl.buffers.replay import ReplayBuffer

    rb = ReplayBuffer(8, 2, {keys.POLICY: (1,)}, 1, "cpu")
    actors = [torch.tensor([keys.ACTOR_POLICY, keys.ACTOR_HUMAN]), torch.tensor([keys.ACTOR_RECOVERY] * 2), None]
    for t, who in enumerate(actors):
        obs = {keys.POLICY: torch.tensor([[10.0 * t], [10.0 * t + 1]])}  # 10·step + env
        rb.add(obs, torch.zeros(2, 1), torch.zeros(2), torch.zeros(2, dtype=torch.bool),
               torch.zeros(2, dtype=torch.bool), obs, actor=who)
    expected = {0.0: 0, 1.0: 1, 10.0: 2, 11.0: 2, 20.0: 0, 21.0: 0}  # None: the policy
    batch = rb.sample(64)
    got = dict(zip(batch[keys.OBS][keys.POLICY][:, 0].tolist(), batch[keys.ACTOR].tolist(), strict=True))
    assert got == {k: expected[k] for k in got} and len(got) == 6
    again = ReplayBuffer(8, 2, {keys.POLICY: (1,)}, 1, "cpu")
    again.load_state_dict(rb.state_dict())
    assert torch.equal(again.actor, rb.actor)
