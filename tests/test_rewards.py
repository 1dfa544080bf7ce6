"""robot_rl.rewards: potential-based shaping, by hand and on real envs (its terms telescope over every episode)."""

from __future__ import annotations

import pytest
import torch

from policies import keys
from robot_rl.rewards import ShapedEnv, shaping_term
from tests._toy_envs import PointMassEnv


def test_shaping_term_by_hand():
    phi, nxt = torch.tensor([0.5, 0.2, -1.0]), torch.tensor([1.0, 0.4, 3.0])
    term = torch.tensor([False, False, True])
    # 0.9·1.0 − 0.5 = 0.4; 0.9·0.4 − 0.2 = 0.16; terminated: 0 − (−1.0) = 1.0
    torch.testing.assert_close(shaping_term(phi, nxt, term, 0.9), torch.tensor([0.4, 0.16, 1.0]))


def _telescopes(env, shaped, potential, steps: int, action) -> tuple[int, int]:
    """Step both envs (the same seed) with ``action(t)``; over every episode that ends, the shaped rewards minus the
    task's sum to Φ(o_T)·[not terminated] − Φ(o_0) (γ = 1). Returns the terminated and timed-out episodes checked."""
    obs, _ = env.reset(seed=3)
    sobs, _ = shaped.reset(seed=3)
    for k in obs:
        assert torch.equal(obs[k], sobs[k])
    start = potential(sobs).clone()
    extra = torch.zeros(env.num_envs, dtype=torch.float64)
    checked = [0, 0]
    for t in range(steps):
        a = action(t)
        _, r, term, trunc, info = env.step(a)
        sobs, sr, sterm, strunc, sinfo = shaped.step(a)
        assert torch.equal(term, sterm) and torch.equal(trunc, strunc)
        if keys.EPISODE in info:  # the task's own returns
            assert torch.equal(info[keys.EPISODE][keys.EP_RETURN], sinfo[keys.EPISODE][keys.EP_RETURN])
        extra += (sr - r).double()
        done = term | trunc
        for i in done.nonzero().flatten().tolist():
            end = 0.0 if bool(term[i]) else float(potential(sinfo[keys.FINAL_OBS])[i])
            assert float(extra[i]) == pytest.approx(end - float(start[i]), abs=1e-4), (t, i)
            checked[int(bool(trunc[i]))] += 1
        extra[done] = 0.0
        start = torch.where(done, potential(sobs), start)
    return checked[0], checked[1]


def test_shaping_telescopes_over_terminations_and_time_outs_on_the_point_mass():
    def potential(obs):
        return -obs[keys.POLICY][:, 0].abs()

    env, shaped = PointMassEnv(8, seed=1), ShapedEnv(PointMassEnv(8, seed=1), potential, gamma=1.0)
    # half the envs start left of 0 and reach it (terminate), half drift off (time out)
    terminated, timed_out = _telescopes(env, shaped, potential, 90, lambda t: torch.ones(8, 1))
    assert terminated >= 4 and timed_out >= 4
    assert "reward/shaping" in shaped.step(torch.ones(8, 1))[4][keys.LOG]


def test_shaping_on_so101_reach_with_a_distance_potential():
    from sim.config import SimConfig
    from sim.registry import make_env, task_config

    def make():
        return make_env("so101_reach", SimConfig(num_envs=3, num_threads=1),
                        task_config("so101_reach", {"episode_length": 12}))

    with make() as env, make() as inner:
        def potential(obs):
            return -env.obs_spec.part(obs, "target_rel", [keys.POLICY]).norm(dim=-1)

        shaped = ShapedEnv(inner, potential, gamma=1.0, scale=1.0)
        gen = torch.Generator().manual_seed(0)
        actions = [torch.rand(3, 6, generator=gen) * 2 - 1 for _ in range(30)]
        assert sum(_telescopes(env, shaped, potential, 30, lambda t: actions[t])) >= 6


def test_the_shaped_env_resumes_with_its_potential_and_rejects_a_bad_one():
    shaped = ShapedEnv(PointMassEnv(4, seed=0), lambda o: -o[keys.POLICY][:, 0].abs(), gamma=0.99, scale=2.0)
    shaped.reset(seed=0)
    for _ in range(5):
        shaped.step(torch.full((4, 1), 0.5))
    saved = shaped.state_dict()
    again = ShapedEnv(PointMassEnv(4, seed=0), lambda o: -o[keys.POLICY][:, 0].abs(), gamma=0.99, scale=2.0)
    again.load_state_dict(saved)
    a, b = shaped.step(torch.full((4, 1), -0.3)), again.step(torch.full((4, 1), -0.3))
    assert torch.equal(a[1], b[1]) and shaped.resumable
    bad = ShapedEnv(PointMassEnv(4, seed=0), lambda o: torch.zeros(3), gamma=0.99)
    with pytest.raises(ValueError, match=r"one value per env \[4\]"):
        bad.reset(seed=0)
    with pytest.raises(ValueError, match="gamma"):
        ShapedEnv(PointMassEnv(4), lambda o: torch.zeros(4), gamma=0.0)
