"""Faulted transitions stay out of learning (RELIABILITY D1): a step where the env faulted (non-finite or diverged
state; ``info[keys.FAULTED]``, terminated with reward 0 and a zeroed observation) adds nothing to PPO's advantages
or loss, and is never drawn from the replay buffer; the steps before it bootstrap from the last sound observation."""

from __future__ import annotations

import copy

import torch

from policies import keys
from robot_rl.buffers.replay import ReplayBuffer
from robot_rl.buffers.rollout import RolloutBuffer
from tests._toy_envs import PointMassEnv
from tests.test_ppo import _assert_bitwise_equal, _snapshot, make_ppo, make_runner

T, N, STEP, ENV = 8, 4, 5, 2  # the fault: step 5 of env 2


def _rollout(algo, env, fault: bool, garbage: bool = False) -> RolloutBuffer:
    """A filled buffer from the toy env; ``fault``: env ENV faults at step STEP (as sim/env.py reports it: terminated,
    reward 0). ``garbage``: that step's stored action, reward, return and old log-probability are huge values."""
    torch.manual_seed(0)
    buf = RolloutBuffer(T, N, env.obs_spec.shapes, env.action_dim, "cpu", extras=algo.rollout_fields)
    obs, _ = env.reset(seed=0)
    for t in range(T):
        action, extras = algo.act(obs)
        obs2, reward, term, trunc, _info = env.step(action)
        faulted = torch.zeros(N, dtype=torch.bool)
        if fault and t == STEP:
            faulted[ENV] = True
            term = term | faulted
            reward = reward.masked_fill(faulted, 0.0)
            if garbage:
                action = action.clone()
                action[ENV] = 1e6
                reward[ENV] = -1e6
        buf.add(obs, action, reward, term | trunc, extras, faulted)
        obs = obs2
    algo.finish_rollout(buf, obs)
    if garbage:  # what the loss reads of it
        buf.returns[STEP, ENV] = 1e6
        buf.extras["log_prob"][STEP, ENV] = -1e6
    return buf


def test_a_faulted_step_adds_nothing_to_the_advantages_and_the_steps_before_bootstrap_from_it():
    env = PointMassEnv(num_envs=N)
    algo = make_ppo(env, normalize_advantages=False)
    clean = _rollout(copy.deepcopy(algo), env, fault=False)  # copies: act() updates the normalisers
    buf = _rollout(algo, env, fault=True)
    assert buf.has_invalid() and not clean.has_invalid()
    assert buf.valid.logical_not().nonzero().tolist() == [[STEP, ENV]]
    value = buf.extras["value"]
    # the faulted step: r = V(o_t), so its TD error and advantage are 0 and its return is V(o_t)
    assert buf.reward[STEP, ENV] == value[STEP, ENV] and buf.advantages[STEP, ENV] == 0.0
    # the step before it, by hand: δ = r + γ V(o_t) - V(o_{t-1}), A = δ + γλ · 0
    g = algo.cfg.gamma
    delta = buf.reward[STEP - 1, ENV] + g * value[STEP, ENV] - value[STEP - 1, ENV]
    torch.testing.assert_close(buf.advantages[STEP - 1, ENV], delta)
    # the other envs are the clean rollout's
    others = [i for i in range(N) if i != ENV]
    assert torch.equal(buf.advantages[:, others], clean.advantages[:, others])


def test_the_update_gives_a_faulted_sample_no_weight():
    """Two rollouts that differ only in the faulted sample's action and reward (huge values) update the networks
    identically: nothing of that sample reaches the loss, the advantage normalisation included."""
    env = PointMassEnv(num_envs=N)
    algo = make_ppo(env)
    a, b = copy.deepcopy(algo), copy.deepcopy(algo)
    buf_a = _rollout(a, env, fault=True)
    buf_b = _rollout(b, env, fault=True, garbage=True)
    assert not torch.equal(buf_a.action, buf_b.action)
    for learner, buf in ((a, buf_a), (b, buf_b)):
        torch.manual_seed(1)
        stats = learner.update(buf)
        assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    _assert_bitwise_equal(_snapshot(a), _snapshot(b))
    # advantages normalised over the valid samples only; the faulted one 0
    adv, ok = buf_a.advantages, buf_a.valid
    assert adv[STEP, ENV] == 0.0
    torch.testing.assert_close(adv[ok].mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv[ok].std(), torch.tensor(1.0), atol=1e-5, rtol=0)
    # and without the mask the garbage would have moved them: the same update with the sample marked valid
    c = copy.deepcopy(algo)
    buf_c = _rollout(c, env, fault=True, garbage=True)
    buf_c.valid.fill_(True)
    torch.manual_seed(1)
    c.update(buf_c)
    assert any(not torch.equal(x, y) for x, y in zip(c.policy.parameters(), a.policy.parameters(), strict=True))


def test_the_runner_marks_exactly_the_faulted_env_steps_on_so101_lift(tmp_path):
    """On the real simulator: a NaN put into env 2's velocities before rollout step 3 faults that env there and
    nowhere else; the buffer holds exactly that step invalid, with r = V(o_t)."""
    from sim.config import SimConfig
    from sim.registry import make_env, task_config

    torch.manual_seed(0)
    env = make_env("so101_lift", SimConfig(num_envs=4, num_threads=1), task_config("so101_lift"))
    algo = make_ppo(env)
    runner = make_runner(env, algo, tmp_path, total_steps=4 * 6, num_steps=6)
    step_env, calls, seen = runner.step_env, [0], []

    def injecting(action):
        if calls[0] == 3:
            env.physics.state.qvel[2, 0] = float("nan")
        calls[0] += 1
        out = step_env(action)
        seen.append(out[4][keys.FAULTED].clone())
        return out

    runner.step_env = injecting
    runner.learn()
    env.close()
    assert torch.stack(seen).nonzero().tolist() == [[3, 2]]
    assert runner.buffer.valid.logical_not().nonzero().tolist() == [[3, 2]]
    assert runner.buffer.reward[3, 2] == runner.buffer.extras["value"][3, 2]
    assert env.counters["sim_nan_resets"] == 1


def _replay_with_a_fault() -> ReplayBuffer:
    """6 vector steps of 3 envs, reward = 10·row + env; env 1 faults at row 3 (terminated, reward 0)."""
    rb = ReplayBuffer(64, 3, {keys.POLICY: (2,)}, 1, "cpu")
    for r in range(6):
        obs = {keys.POLICY: torch.full((3, 2), float(r))}
        nxt = {keys.POLICY: torch.full((3, 2), float(r + 1))}
        reward = 10.0 * r + torch.arange(3, dtype=torch.float32)
        term = torch.zeros(3, dtype=torch.bool)
        faulted = torch.zeros(3, dtype=torch.bool)
        if r == 3:
            faulted[1] = term[1] = True
            reward[1] = 0.0
        rb.add(obs, torch.zeros(3, 1), reward, term, torch.zeros(3, dtype=torch.bool), nxt, None, faulted)
    return rb


def test_replay_never_draws_a_faulted_transition_and_cuts_windows_before_it():
    rb = _replay_with_a_fault()
    assert rb.truncated[2].tolist() == [False, True, False]  # env 1's step before the fault now ends as a time-out
    torch.manual_seed(0)
    batch = rb.sample(4096, n_step=3, gamma=0.5)
    # a transition of env 1 at row 3 has reward 0 and obs 3: never drawn (row 3's other envs are)
    start_row = batch[keys.OBS][keys.POLICY][:, 0]
    env1_row3 = (start_row == 3) & (batch[keys.REWARD] == 0.0)
    assert not env1_row3.any()
    assert ((start_row == 3) & (batch[keys.REWARD] != 0.0)).any()
    # env 1 from row 1: 11 + 0.5·21, cut at row 2 (truncated), bootstrapping from row 2's o' = 3 with γ²
    from_row1_env1 = (start_row == 1) & torch.isclose(batch[keys.REWARD], torch.tensor(11.0 + 0.5 * 21.0))
    assert from_row1_env1.any()
    i = int(from_row1_env1.nonzero()[0])
    assert batch["discount"][i] == 0.25 and batch[keys.NEXT_OBS][keys.POLICY][i, 0] == 3.0


def test_replay_state_keeps_its_faulted_transitions():
    rb = _replay_with_a_fault()
    again = ReplayBuffer(64, 3, {keys.POLICY: (2,)}, 1, "cpu")
    again.load_state_dict(rb.state_dict())
    assert torch.equal(again.faulted, rb.faulted) and again._fault_rows == {3}
    torch.manual_seed(0)
    a = rb.sample(256, n_step=2)
    torch.manual_seed(0)
    b = again.sample(256, n_step=2)
    assert torch.equal(a[keys.REWARD], b[keys.REWARD])


def test_nstep_targets_unchanged_where_nothing_faulted():
    """The usual path: a buffer that never saw a fault draws the same stream as before (no redraw)."""
    rb = ReplayBuffer(64, 3, {keys.POLICY: (2,)}, 1, "cpu")
    for r in range(6):
        rb.add({keys.POLICY: torch.full((3, 2), float(r))}, torch.zeros(3, 1), torch.full((3,), float(r)),
               torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool),
               {keys.POLICY: torch.full((3, 2), float(r + 1))}, None, torch.zeros(3, dtype=torch.bool))
    torch.manual_seed(0)
    flat = torch.randint(6 * 3, (32,))
    torch.manual_seed(0)
    batch = rb.sample(32)
    assert torch.equal(batch[keys.OBS][keys.POLICY][:, 0], (flat // 3).float())
