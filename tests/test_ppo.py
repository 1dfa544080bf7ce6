"""PPO: learns a trivial task, guards against non-finite updates, resumes exactly, runs a few iterations on
so101_reach."""

import copy

import pytest
import torch
from torch import nn

from policies import GaussianPolicy, GaussianPolicyConfig, keys
from robot_rl.algos.guard import NonFiniteError
from robot_rl.algos.ppo import PPO, PPOConfig, gaussian_kl
from robot_rl.algos.precision import native_bf16
from robot_rl.buffers.rollout import RolloutBuffer
from robot_rl.checkpoint import CheckpointManager, flatten_tree, load_checkpoint
from robot_rl.evaluation import evaluate
from robot_rl.logging import LoggerConfig, RunLogger
from robot_rl.models.critics import CriticConfig, MLPCritic
from robot_rl.runners.on_policy import OnPolicyRunner, OnPolicyRunnerConfig
from tests._toy_envs import PointMassEnv

QUIET = LoggerConfig(progress=False, tensorboard=False)  # one torch thread: tests/conftest.py


def make_ppo(env, device="cpu", **cfg) -> PPO:
    policy = GaussianPolicy(GaussianPolicyConfig(obs_dim=env.obs_spec.shapes[keys.POLICY][0],
                                                 action_dim=env.action_dim, hidden_dims=[32, 32], init_std=0.5))
    critic = MLPCritic(CriticConfig(obs_dim=env.obs_spec.shapes[keys.CRITIC][0], hidden_dims=[32, 32]))
    return PPO(policy, critic, PPOConfig(**cfg), device=device)


def make_runner(env, algo, tmp_path, total_steps, num_steps=16, every=1000):
    cfg = OnPolicyRunnerConfig(num_steps=num_steps, total_steps=total_steps, checkpoint_every=every,
                               success_window=64)
    return OnPolicyRunner(env, algo, cfg, RunLogger(tmp_path, QUIET), CheckpointManager(tmp_path / "ckpt"), {})


def test_ppo_solves_point_mass(tmp_path):
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=64)
    algo = make_ppo(env)
    make_runner(env, algo, tmp_path, total_steps=64 * 16 * 25).learn()
    algo.eval_mode()
    result = evaluate(PointMassEnv(num_envs=32, seed=1), lambda o: algo.policy.act(o), 64, seed=123)
    assert result.success_rate >= 0.95, result
    assert result.mean_length < 15, result  # it drives straight there (≤ 1 m at 0.1 m per step)


def _filled_buffer(env, algo, num_steps=8) -> RolloutBuffer:
    buf = RolloutBuffer(num_steps, env.num_envs, env.obs_spec.shapes, env.action_dim, "cpu",
                        extras=algo.rollout_fields)
    obs, _ = env.reset(seed=0)
    for _ in range(num_steps):
        action, extras = algo.act(obs)
        obs2, reward, term, trunc, info = env.step(action)
        reward = algo.bootstrap_time_outs(reward, trunc, info[keys.FINAL_OBS])
        buf.add(obs, action, reward, term | trunc, extras)
        obs = obs2
    algo.finish_rollout(buf, obs)
    return buf


def _snapshot(algo):
    tensors, skeleton = flatten_tree({"opt": algo.optimizer.state_dict(), "policy": algo.policy.state_dict(),
                                      "critic": algo.critic.state_dict()})
    return tensors, skeleton


def _assert_bitwise_equal(a, b):
    assert a[1] == b[1]  # the JSON part: lr, step counts in param_groups
    assert a[0].keys() == b[0].keys()
    for k in a[0]:
        assert torch.equal(a[0][k], b[0][k]), k


@pytest.mark.parametrize("inject", ["nan_loss", "inf_grad", "nan_grad"])
def test_nonfinite_update_is_skipped_with_optimizer_untouched(inject):
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=16)
    algo = make_ppo(env, num_epochs=2, num_minibatches=2, max_consecutive_nonfinite=100)
    algo.update(_filled_buffer(env, algo))  # a good update first: Adam has moments and a step count
    assert algo.guard.skipped == 0
    buf = _filled_buffer(env, algo)  # (collection updates the normalizers: snapshot after it)
    before = _snapshot(algo)
    handle = None
    if inject == "nan_loss":
        buf.advantages[3, 2] = float("nan")  # one NaN sample poisons the advantage normalization -> loss
    else:
        bad = float("inf") if inject == "inf_grad" else float("nan")
        handle = algo.critic.net[0].weight.register_hook(lambda g: torch.full_like(g, bad))
    stats = algo.update(buf)
    if handle is not None:
        handle.remove()
    _assert_bitwise_equal(before, _snapshot(algo))
    assert algo.guard.skipped == 4 and stats["nonfinite_skips"] == 4.0
    # A good update afterwards resets the consecutive count and does change the parameters.
    algo.update(_filled_buffer(env, algo))
    assert algo.guard.consecutive == 0 and algo.guard.skipped == 4


def test_too_many_nonfinite_updates_stop_the_run_naming_the_last_checkpoint(tmp_path):
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=16)
    algo = make_ppo(env)
    runner = make_runner(env, algo, tmp_path, total_steps=16 * 8 * 2, num_steps=8, every=1)
    runner.learn()
    good = runner.checkpoints.latest()
    assert good is not None and good.name == "iter_00000002"
    algo.policy.mean_net[0].weight.register_hook(lambda g: torch.full_like(g, float("nan")))
    runner.cfg.total_steps = 16 * 8 * 10
    with pytest.raises(NonFiniteError, match="iter_00000002"):
        runner.learn()
    assert algo.guard.consecutive == 11


def test_gaussian_kl_matches_torch():
    g = torch.Generator().manual_seed(0)
    m1, m2 = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    s1, s2 = torch.rand(5, 3, generator=g) + 0.1, torch.rand(5, 3, generator=g) + 0.1
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(m1, s1), torch.distributions.Normal(m2, s2))
    torch.testing.assert_close(gaussian_kl(m1, s1, m2, s2), ref.sum(-1))


def test_adaptive_lr_moves_within_bounds():
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=16)
    algo = make_ppo(env, learning_rate=1e-3, desired_kl=1e-9, lr_min=2e-4)  # every step's KL is "too large"
    algo.update(_filled_buffer(env, algo))
    assert algo.learning_rate == pytest.approx(2e-4)


def test_minibatches_are_one_shuffled_pass_with_every_field_on_the_same_rows():
    """Each pass draws one permutation from torch's generator; minibatch i holds rows perm[i·B:(i+1)·B] of every
    field (the remainder past num_minibatches·B left out), so no sample repeats within a pass."""
    t, n, size = 3, 5, 3  # 15 samples, 4 minibatches of 3
    buf = RolloutBuffer(t, n, {"policy": (2,), "critic": (1,)}, 1, "cpu", extras={"value": ()})
    rows = torch.arange(t * n, dtype=torch.float32).view(t, n)
    for i in range(t):
        buf.add({"policy": rows[i, :, None].repeat(1, 2), "critic": -rows[i, :, None]}, 10 * rows[i, :, None],
                rows[i], torch.zeros(n, dtype=torch.bool), {"value": 100 * rows[i]})
    buf.advantages.copy_(rows + 0.5)
    buf.returns.copy_(rows + 0.25)
    torch.manual_seed(7)
    perm = torch.randperm(t * n)
    torch.manual_seed(7)
    batches = list(buf.minibatches(4))
    assert len(batches) == 4
    for i, b in enumerate(batches):
        want = perm[i * size:(i + 1) * size].float()
        assert torch.equal(b["obs"]["policy"], want[:, None].repeat(1, 2))
        assert torch.equal(b["obs"]["critic"], -want[:, None])
        assert torch.equal(b["action"], 10 * want[:, None])
        assert torch.equal(b["value"], 100 * want)
        assert torch.equal(b["advantages"], want + 0.5) and torch.equal(b["returns"], want + 0.25)
    seen = torch.cat([b["advantages"] for b in batches]) - 0.5
    assert len(set(seen.tolist())) == 12
    assert len(list(buf.minibatches(t * n))) == t * n  # one sample each: the most there can be
    for bad in (0, t * n + 1):
        with pytest.raises(ValueError, match=r"num_minibatches must be in \[1, 15\]"):
            next(buf.minibatches(bad))


def _rollout_losses(algo, buf, adv, clipped_value):
    """PPO's statistics over the whole rollout at ``algo``'s weights, written out here (adv: normalised)."""
    obs = {k: v.flatten(0, 1) for k, v in buf.obs.items()}
    mean, std = algo.policy.mean_std(obs)
    dist = torch.distributions.Normal(mean, std)
    ratio = torch.exp(dist.log_prob(buf.action.flatten(0, 1)).sum(-1) - buf.extras["log_prob"].flatten())
    surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
    value, old, ret = algo.critic(obs), buf.extras["value"].flatten(), buf.returns.flatten()
    value_loss = (value - ret) ** 2
    if clipped_value:  # rsl_rl's: the worse of the moved value and the value moved by at most 0.2 from the old one
        value_loss = torch.max(value_loss, (old + (value - old).clamp(-0.2, 0.2) - ret) ** 2)
    value_loss = value_loss.mean()
    entropy = dist.entropy().sum(-1).mean()
    algo.optimizer.zero_grad()
    (surrogate + value_loss - 0.05 * entropy).backward()
    grads = [p.grad for p in [*algo.policy.parameters(), *algo.critic.parameters()]]
    return {"loss/surrogate": surrogate.item(), "loss/value": value_loss.item(), "loss/entropy": entropy.item(),
            "kl": gaussian_kl(buf.extras["mean"].flatten(0, 1), buf.extras["std"].flatten(0, 1), mean, std).mean().item(),
            "grad_norm": torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item(),
            "clip_fraction": ((ratio - 1).abs() > 0.2).float().mean().item()}


@pytest.mark.parametrize("clipped_value", [False, True])
def test_update_reports_the_mean_losses_of_its_minibatches(clipped_value):
    """Two epochs of one minibatch each: the statistics returned are the means over the two steps of the losses, KL,
    clip fraction and pre-clip gradient norm, each at the weights before its step (recomputed here from copies)."""
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=16)
    kw = {"num_minibatches": 1, "use_clipped_value_loss": clipped_value, "entropy_coef": 0.05, "schedule": "fixed",
          "learning_rate": 3e-2}
    algo = make_ppo(env, num_epochs=2, **kw)
    buf = _filled_buffer(env, algo)
    adv = buf.advantages.flatten()
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    first = _rollout_losses(copy.deepcopy(algo), buf, adv, clipped_value)
    one_step = copy.deepcopy(algo)
    one_step.cfg = PPOConfig(num_epochs=1, **kw)
    one_step.update(copy.deepcopy(buf))
    second = _rollout_losses(one_step, buf, adv, clipped_value)
    stats = algo.update(buf)
    for k in first:
        assert stats[k] == pytest.approx((first[k] + second[k]) / 2, rel=1e-4, abs=1e-6), k
    assert first["kl"] == 0.0 and second["kl"] > 1e-4 and second["clip_fraction"] > 0.0  # the first step moved it


def test_adaptive_lr_follows_the_kl_bands_at_their_edges():
    """rsl_rl's rule on each minibatch's KL before its step: lr ÷ 1.5 when KL > 2·target, × 1.5 when 0 < KL <
    target / 2, else unchanged; the edges themselves leave it. Two epochs of one minibatch: the first step's KL is
    0 (the collecting weights), the second's, k, is read from a probe run."""
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=16)
    algo = make_ppo(env, num_epochs=2, num_minibatches=1, schedule="fixed", learning_rate=1e-2)
    buf = _filled_buffer(env, algo)

    def final_lr(schedule, desired_kl):
        twin, kls = copy.deepcopy(algo), []
        twin.cfg = PPOConfig(num_epochs=2, num_minibatches=1, schedule=schedule, desired_kl=desired_kl,
                             learning_rate=1e-2, lr_max=1.0)
        step = twin._step

        def recording_step(batch):
            stats = step(batch)
            kls.append(stats["kl"])
            return stats

        twin._step = recording_step
        torch.manual_seed(3)
        twin.update(copy.deepcopy(buf))
        return twin.learning_rate, kls

    _, (k0, k) = final_lr("fixed", 1.0)
    assert k0 == 0.0 and k > 0.0
    cases = [(k / 2, 1e-2), (k / 2 * 0.99, 1e-2 / 1.5), (2 * k, 1e-2), (2 * k * 1.01, 1e-2 * 1.5)]
    for desired, want in cases:
        assert final_lr("adaptive", desired)[0] == pytest.approx(want, rel=1e-12), desired
    assert final_lr("fixed", k / 4)[0] == 1e-2


def _update_copy(algo, buf, bf16):
    """A deep copy of ``algo`` (weights, optimizer) set to ``bf16``, after one update on a copy of ``buf`` (the same
    minibatches each time: they are drawn from torch's generator)."""
    twin = copy.deepcopy(algo)
    twin.bf16 = bf16
    torch.manual_seed(1)
    twin.update(copy.deepcopy(buf))
    return twin


@pytest.mark.skipif(not native_bf16(torch.device("cpu")), reason="this CPU computes bf16 only by emulation")
def test_bf16_update_computes_hidden_layers_in_bf16_outputs_in_float32_and_follows_the_float32_update():
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=16)
    algo = make_ppo(env, num_epochs=2, num_minibatches=2, bf16=True)
    assert algo.bf16
    buf = _filled_buffer(env, algo)
    seen = {}
    for name, net in (("actor", algo.policy.mean_net), ("critic", algo.critic.net)):
        net[0].register_forward_hook(lambda m, i, o, n=name: seen.__setitem__(f"{n} hidden", o.dtype))
        net[-1].register_forward_hook(lambda m, i, o, n=name: seen.__setitem__(f"{n} output", o.dtype))
    start = [p.detach().clone() for p in algo.params]
    half, full = _update_copy(algo, buf, True), _update_copy(algo, buf, False)
    assert seen == {"actor hidden": torch.float32, "actor output": torch.float32, "critic hidden": torch.float32,
                    "critic output": torch.float32}  # the float32 copy ran last
    _update_copy(algo, buf, True)
    assert seen == {"actor hidden": torch.bfloat16, "actor output": torch.float32, "critic hidden": torch.bfloat16,
                    "critic output": torch.float32}
    assert all(p.dtype == torch.float32 for p in half.params)
    # Four Adam steps of lr 1e-3 on the same minibatches: every tensor moves by ~4e-3 and in the same direction
    # (cosine 0.99996-1 here; an element whose gradient is near 0 may go its own way, as Adam scales it up).
    for p0, ph, pf in zip(start, half.params, full.params, strict=True):
        step_h, step_f = (ph - p0).detach().flatten(), (pf - p0).detach().flatten()
        assert float(step_f.abs().max()) > 1e-3
        assert float(nn.functional.cosine_similarity(step_h, step_f, dim=0)) > 0.999
    assert any(not torch.equal(ph, pf) for ph, pf in zip(half.params, full.params, strict=True))


def test_bf16_auto_follows_the_hardware_and_a_bad_setting_is_refused(monkeypatch):
    from robot_rl.algos import precision

    env = PointMassEnv(num_envs=4)
    for native in (True, False):
        monkeypatch.setattr(precision, "native_bf16", lambda device, native=native: native)
        assert make_ppo(env, bf16="auto").bf16 is native
        assert make_ppo(env, bf16=False).bf16 is False
    with pytest.raises(ValueError, match="no native bf16"):  # still emulated: true is refused, auto falls back
        make_ppo(env, bf16=True)
    with pytest.raises(ValueError, match="algo.bf16 must be true, false or auto, got 'yes'"):
        PPOConfig(bf16="yes")
    with pytest.raises(ValueError, match="algo.bf16 must be true, false or auto, got 1"):
        PPOConfig(bf16=1)


def test_ppo_config_takes_each_bound_and_refuses_past_it():
    PPOConfig(num_epochs=1, num_minibatches=1, gamma=1.0, lam=0.0, lr_min=1e-3, lr_max=1e-3)
    PPOConfig(gamma=1e-6, lam=1.0)
    for bad, words in [({"num_epochs": 0}, "algo.num_epochs must be >= 1, got 0"),
                       ({"num_minibatches": 0}, "algo.num_minibatches must be >= 1, got 0"),
                       ({"gamma": 0.0}, "in \\(0, 1\\] and algo.lam in \\[0, 1\\], got 0.0, 0.95"),
                       ({"gamma": 1.01}, "got 1.01, 0.95"), ({"lam": -0.01}, "got 0.99, -0.01"),
                       ({"lam": 1.01}, "got 0.99, 1.01"), ({"clip": 0.0}, "algo.clip"),
                       ({"learning_rate": 0.0}, "algo.learning_rate"), ({"max_grad_norm": 0.0}, "algo.max_grad_norm"),
                       ({"lr_min": 0.0}, "need 0 < algo.lr_min <= algo.lr_max, got 0.0, 0.01"),
                       ({"lr_min": 2e-2}, "got 0.02, 0.01"), ({"schedule": "cosine"}, "algo.schedule must be one of")]:
        with pytest.raises(ValueError, match=words):
            PPOConfig(**bad)


def test_ppo_smoke_so101_reach(tmp_path):
    from sim.config import SimConfig
    from sim.registry import make_env, task_config

    torch.manual_seed(0)
    env = make_env("so101_reach", SimConfig(num_envs=8, num_threads=1), task_config("so101_reach"))
    algo = make_ppo(env)
    runner = make_runner(env, algo, tmp_path, total_steps=8 * 8 * 3, num_steps=8, every=3)
    stats = runner.learn()
    env.close()
    assert runner.iteration == 3
    for k in ("loss/surrogate", "loss/value", "kl", "learning_rate", "perf/fps", "reward/distance"):
        assert k in stats and torch.isfinite(torch.tensor(stats[k])), k
    assert runner.checkpoints.latest().name == "iter_00000003"


def test_the_update_runs_on_update_threads_and_collection_on_the_callers(tmp_path):
    """The runner gives torch ``update_threads`` for the learner's update only: collection keeps the caller's count
    (one, next to the simulator's threads) before, during and after."""
    torch.set_num_threads(1)
    env = PointMassEnv(num_envs=8)
    algo = make_ppo(env)
    cfg = OnPolicyRunnerConfig(num_steps=4, total_steps=8 * 4 * 2, checkpoint_every=1000, success_window=8,
                               update_threads=2)
    runner = OnPolicyRunner(env, algo, cfg, RunLogger(tmp_path, QUIET), CheckpointManager(tmp_path / "ckpt"), {})
    seen = {"act": set(), "update": set()}
    act, update = algo.act, algo.update
    algo.act = lambda obs: seen["act"].add(torch.get_num_threads()) or act(obs)
    algo.update = lambda buf: seen["update"].add(torch.get_num_threads()) or update(buf)
    runner.learn()
    assert runner.iteration == 2
    assert seen == {"act": {1}, "update": {2}}
    assert torch.get_num_threads() == 1
    with pytest.raises(ValueError, match="update_threads must be >= 1"):
        OnPolicyRunnerConfig(update_threads=0)


def test_robot_rl_train_updates_on_every_core_by_default(tmp_path):
    from robot_rl.cli.build import build_training, compose
    from robot_rl.runners.common import available_cores

    def runner_threads(overrides, tmp):
        run = build_training(compose("train", ["task=so101_reach", "sim.num_envs=2", "eval.enabled=false",
                                               "logger.progress=false", "logger.tensorboard=false",
                                               f"run_dir={tmp}", *overrides]))
        try:
            return run.runner.cfg.update_threads, torch.get_num_threads()
        finally:
            run.close()

    assert runner_threads([], tmp_path / "a") == (available_cores(), 1)  # torch_threads=1 outside the update
    assert runner_threads(["update_threads=3"], tmp_path / "b") == (3, 1)


def test_restore_continues_from_the_checkpoint_bitwise(tmp_path):
    """6 iterations straight vs 3 iterations, a fresh runner restored from the checkpoint, 3 more: the restored
    runner starts at iteration 3, runs only the 3 left, and ends in the same bits (learner, env, observations)."""
    torch.use_deterministic_algorithms(True)
    try:
        def build(folder, iterations):
            torch.manual_seed(0)
            env = PointMassEnv(num_envs=16)
            return make_runner(env, make_ppo(env), folder, total_steps=16 * 8 * iterations, num_steps=8, every=1)

        straight = build(tmp_path / "a", 6)
        straight.learn()

        build(tmp_path / "b", 3).learn()
        resumed = build(tmp_path / "b", 6)
        torch.manual_seed(123)  # the resumed process is in other RNG states: the checkpoint must restore them
        resumed.restore(load_checkpoint(tmp_path / "b" / "ckpt"))
        assert (resumed.iteration, resumed.env_steps) == (3, 16 * 8 * 3)
        ran = []
        run_iteration = resumed.run_iteration
        resumed.run_iteration = lambda: ran.append(resumed.iteration) or run_iteration()
        resumed.learn()
        assert ran == [3, 4, 5]  # the iterations left, not a fresh start and none redone

        assert resumed.iteration == straight.iteration == 6
        assert resumed.algo.learning_rate == straight.algo.learning_rate
        a = flatten_tree({"algo": straight.algo.state_dict(), "obs": straight.obs, "env": straight.env.state_dict(),
                          "stats": straight.stats.state_dict()})
        b = flatten_tree({"algo": resumed.algo.state_dict(), "obs": resumed.obs, "env": resumed.env.state_dict(),
                          "stats": resumed.stats.state_dict()})
        _assert_bitwise_equal(a, b)
        assert any(k.startswith("/algo/optimizer/state") for k in a[0])  # Adam's moments are among them
    finally:
        torch.use_deterministic_algorithms(False)


def test_runner_resets_envs_that_do_not_reset_themselves(tmp_path):
    """With sim.autoreset off (a real arm's semantics) the runner resets ended envs itself after env.step, and
    training is bitwise the run with auto-reset: the same draws in the same order."""
    from sim.config import SimConfig
    from sim.registry import make_env, task_config

    finals = []
    for autoreset in (True, False):
        torch.manual_seed(0)
        env = make_env("so101_reach", SimConfig(num_envs=8, num_threads=1, seed=0, autoreset=autoreset),
                       task_config("so101_reach", {"episode_length": 10, "terminate_on_success": False}))
        algo = PPO(GaussianPolicy(GaussianPolicyConfig(obs_dim=env.obs_spec.shapes[keys.POLICY][0], action_dim=6,
                                                       hidden_dims=[16])),
                   MLPCritic(CriticConfig(obs_dim=env.obs_spec.shapes[keys.CRITIC][0], hidden_dims=[16])),
                   PPOConfig())
        runner = make_runner(env, algo, tmp_path / str(autoreset), total_steps=8 * 16 * 3)
        runner.learn()  # 48 steps of 10-step episodes: every env ends 4 times
        assert runner.stats.count == 8 * 4
        finals.append(torch.cat([p.detach().flatten() for p in algo.policy.parameters()]))
    assert torch.equal(finals[0], finals[1])


def test_fused_adam_updates_like_the_per_tensor_loop():
    """PPO's Adam runs fused on the CPU (one kernel over every parameter per minibatch): the per-tensor loop's
    arithmetic up to float rounding, so the switch changed the learning curves only as rounding does."""
    env = PointMassEnv(num_envs=16)
    torch.manual_seed(0)
    fast = make_ppo(env)
    torch.manual_seed(0)
    slow = make_ppo(env)
    slow.optimizer = torch.optim.Adam(slow.params, lr=slow.cfg.learning_rate, foreach=False)
    assert fast.optimizer.param_groups[0]["fused"] is True
    for algo in (fast, slow):
        torch.manual_seed(1)
        for _ in range(3):  # the adaptive learning rate changes between updates too
            algo.update(_filled_buffer(env, algo))
    assert fast.learning_rate == slow.learning_rate != PPOConfig().learning_rate
    (a, _), (b, _) = _snapshot(fast), _snapshot(slow)  # their param_groups differ only in the fused / foreach flags
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5, msg=k)
