"""The end of the env step (faults, terminations, the reward's sanitising, episode sums, time-outs): the compiled CPU
pass against hand-computed values and against its torch reference, alone and inside a stepping env."""

import pytest
import torch

from policies import keys
from robot_rl.env import EpisodeTracker
from sim.config import SimConfig
from sim.experts import make_expert
from sim.registry import make_env, task_config
from sim.step_bookkeeping import end_of_step_cpu, end_of_step_torch

T, F = True, False
NAN, INF = float("nan"), float("inf")


def _case():
    """Eight envs, one situation each (episode length 5; lengths before the step in ``lengths``):
    0 plain step, 1 success, 2 the task terminates it, 3 time-out, 4 non-finite state (and a joint speed past the
    limit) with success, 5 a joint speed past the limit, 6 a non-finite action, 7 the task's reward is +inf (not a fault)."""
    reward = torch.tensor([0.5, 2.0, -1.0, 0.25, 3.0, 1.0, 4.0, INF])
    success = torch.tensor([F, T, F, F, T, F, F, F])
    terminated = torch.tensor([F, F, T, F, F, F, F, F])
    nonfinite = torch.tensor([F, F, F, F, T, F, F, F])
    too_fast = torch.tensor([F, F, F, F, T, T, F, F])  # env 4: counted once, as non-finite
    diverged = torch.zeros(8, dtype=torch.bool)
    bad = torch.tensor([F, F, F, F, F, F, T, F])
    episodes = EpisodeTracker(8, torch.device("cpu"))
    episodes.returns[:] = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    episodes.lengths[:] = torch.tensor([0, 1, 2, 4, 4, 1, 1, 0])
    episodes.successes[:] = torch.tensor([F, F, F, T, F, F, F, F])
    return reward, success, terminated, nonfinite, too_fast, diverged, bad, episodes


@pytest.mark.parametrize("end_of_step", [end_of_step_cpu, end_of_step_torch], ids=["cpu", "torch"])
@pytest.mark.parametrize("terminate_on_success", [True, False])
def test_the_end_of_a_step_by_hand(end_of_step, terminate_on_success):
    reward, success, terminated, nonfinite, too_fast, diverged, bad, episodes = _case()
    inputs = [t.clone() for t in (success, terminated, nonfinite, too_fast, diverged, bad)]
    end = end_of_step(reward, success, terminated, nonfinite, too_fast, diverged, bad, terminate_on_success,
                      episodes, 5)
    assert end.faulted.tolist() == [F, F, F, F, T, T, T, F]
    assert end.success.tolist() == [F, T, F, F, F, F, F, F]  # env 4's success does not count: it faulted
    # faults terminate; success terminates only where it ends an episode; env 3 (length 5) times out
    assert end.terminated.tolist() == [F, terminate_on_success, T, F, T, T, T, F]
    assert end.truncated.tolist() == [F, F, F, T, F, F, F, F]
    assert end.done.tolist() == [F, terminate_on_success, T, T, T, T, T, F]
    assert (end.n_done, end.n_faulted, end.n_nan, end.n_diverged) == (5 + terminate_on_success, 3, 1, 1)
    assert reward.tolist() == [0.5, 2.0, -1.0, 0.25, 0.0, 0.0, 0.0, 0.0]  # in place: faults and inf become 0
    assert episodes.returns.tolist() == [1.5, 3.0, 0.0, 1.25, 1.0, 1.0, 1.0, 1.0]
    assert episodes.lengths.tolist() == [1, 2, 3, 5, 5, 2, 2, 1]
    assert episodes.successes.tolist() == [F, T, F, T, F, F, F, F]
    for before, after in zip(inputs, (success, terminated, nonfinite, too_fast, diverged, bad), strict=True):
        assert torch.equal(before, after)  # a task may hand out cached tensors: never written


@pytest.mark.parametrize("end_of_step", [end_of_step_cpu, end_of_step_torch], ids=["cpu", "torch"])
def test_a_backend_divergence_and_no_bad_actions(end_of_step):
    reward = torch.tensor([1.0, NAN, -INF])
    false = torch.zeros(3, dtype=torch.bool)
    diverged = torch.tensor([F, T, F])
    episodes = EpisodeTracker(3, torch.device("cpu"))
    end = end_of_step(reward, false, false, false, false, diverged, None, True, episodes, 100)
    assert end.faulted.tolist() == [F, T, F] and end.terminated.tolist() == [F, T, F]
    assert (end.n_done, end.n_faulted, end.n_nan, end.n_diverged) == (1, 1, 0, 1)
    assert reward.tolist() == [1.0, 0.0, 0.0]  # NaN and -inf rewards never reach a return
    assert end.truncated.tolist() == [F, F, F]


def _pair(task: str, n: int, episode_length: int, **sim):
    envs = [make_env(task, SimConfig(num_envs=n, num_threads=2, seed=4, **sim),
                     task_config(task, {"episode_length": episode_length})) for _ in range(2)]
    envs[1].fused_bookkeeping = False  # the torch reference, on the CPU
    assert envs[0].fused_bookkeeping
    return envs


@pytest.mark.parametrize("task,episode_length,steps", [("so101_reach", 9, 40), ("humanoid_walk", 30, 80)])
def test_the_compiled_pass_steps_the_env_as_the_torch_reference_does(task, episode_length, steps):
    """Both paths, step by step with the same actions, through successes (reach's expert) or falls (the humanoid's),
    time-outs, non-finite actions, non-finite state and joint speeds past the limit: every
    output bit-equal."""
    fused, ref = _pair(task, 6, episode_length, on_nonfinite_action="reset")
    g = torch.Generator().manual_seed(0)
    obs, _ = fused.reset(seed=4)
    ref.reset(seed=4)
    expert = make_expert(fused) if task == "so101_reach" else None  # reach's successes: the expert drives envs 0-2
    seen = {"faulted": 0, "truncated": 0, "terminated": 0}
    for step in range(steps):
        a = torch.rand(6, fused.action_dim, generator=g) * 2 - 1
        if expert is not None:
            a[:3] = expert.act(obs)[:3]
        if step % 7 == 3:
            a[step % 6, 0] = NAN
        if step % 11 == 5:
            for env in (fused, ref):
                env.physics.state.qvel[(step + 2) % 6, 0] = NAN
        if step % 13 == 8:
            for env in (fused, ref):
                env.physics.state.qvel[(step + 4) % 6, 1] = 1e4  # finite, past the limit: diverging
        out_f, out_r = fused.step(a.clone()), ref.step(a.clone())
        (obs_f, r_f, te_f, tr_f, info_f), (obs_r, r_r, te_r, tr_r, info_r) = out_f, out_r
        obs = obs_f
        if expert is not None:
            expert.reset((te_f | tr_f).nonzero().flatten())
        assert torch.equal(r_f, r_r) and torch.equal(te_f, te_r) and torch.equal(tr_f, tr_r)
        for k in obs_r:
            assert torch.equal(obs_f[k], obs_r[k]), k
            assert torch.equal(info_f[keys.FINAL_OBS][k], info_r[keys.FINAL_OBS][k]), k
        for k in (keys.SUCCESS, "faulted"):
            assert torch.equal(info_f[k], info_r[k]), k
        assert (keys.EPISODE in info_f) == (keys.EPISODE in info_r)
        if keys.EPISODE in info_r:
            for k, v in info_r[keys.EPISODE].items():
                assert torch.equal(info_f[keys.EPISODE][k], v), k
        assert info_f[keys.LOG] == pytest.approx(info_r[keys.LOG], nan_ok=True)
        assert fused.counters == ref.counters
        seen["faulted"] += int(info_r["faulted"].sum())
        seen["truncated"] += int(tr_r.sum())
        seen["terminated"] += int((te_r & ~info_r["faulted"]).sum())
    assert all(seen.values()), seen  # every kind of ending happened
    assert fused.counters["sim_diverged_resets"] > 0 and fused.counters["sim_nan_resets"] > 0
    for env in (fused, ref):
        env.close()
