"""FlashSAC: unit-norm projection, noise repetition, time-out bootstrapping in the replay buffer, learning a trivial
task, non-finite guard, exact resume, policy export, and the CLI end to end on so101_reach."""

import itertools
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from policies import keys, load_policy
from policies.modules.flash import FlashNet, project_to_unit_norm
from policies.tanh_gaussian import TanhGaussianPolicy, TanhGaussianPolicyConfig
from robot_rl.algos.flashsac import FlashSAC, FlashSACConfig, RepeatedNoise, ReturnScale, truncated_zeta_probs
from robot_rl.algos.guard import NonFiniteError
from robot_rl.buffers.replay import ReplayBuffer, sample_mixed
from robot_rl.checkpoint import CheckpointManager, flatten_tree, load_checkpoint
from robot_rl.evaluation import evaluate
from robot_rl.logging import LoggerConfig, RunLogger
from robot_rl.models.q_critics import CategoricalQ, CategoricalQConfig
from robot_rl.runners.off_policy import OffPolicyRunner, OffPolicyRunnerConfig
from tests._toy_envs import PointMassEnv
from tests._toy_reach import PointReach2D

QUIET = LoggerConfig(progress=False, tensorboard=False)  # one torch thread: tests/conftest.py


def make_algo(env, hidden=32, **cfg) -> FlashSAC:
    actor = TanhGaussianPolicy(TanhGaussianPolicyConfig(obs_dim=env.obs_spec.shapes[keys.POLICY][0],
                                                        action_dim=env.action_dim, hidden_dim=hidden))
    critic = CategoricalQ(CategoricalQConfig(obs_dim=env.obs_spec.shapes[keys.CRITIC][0], action_dim=env.action_dim,
                                             hidden_dim=hidden))
    defaults = {"batch_size": 64, "learning_starts": 64, "updates_per_step": 1.0}
    return FlashSAC(actor, critic, FlashSACConfig(**{**defaults, **cfg}), num_envs=env.num_envs)


def make_runner(env, algo, tmp_path, total_steps, every=1000, steps_per_iteration=8, ckpt=True):
    cfg = OffPolicyRunnerConfig(steps_per_iteration=steps_per_iteration, total_steps=total_steps,
                                checkpoint_every=every, success_window=64)
    manager = CheckpointManager(tmp_path / "ckpt") if ckpt else None
    return OffPolicyRunner(env, algo, cfg, RunLogger(tmp_path, QUIET), manager, {})


def _filled(env, algo, steps=16) -> ReplayBuffer:
    buf = ReplayBuffer(1000, env.num_envs, env.obs_spec.shapes, env.action_dim, "cpu")
    obs, _ = env.reset(seed=0)
    for _ in range(steps):
        action = algo.act(obs)
        nxt, reward, term, trunc, info = env.step(action)
        buf.add(obs, action, reward, term, trunc, nxt, info[keys.FINAL_OBS])
        algo.observe(reward, term, trunc)
        obs = nxt
    return buf


# ------------------------------------------------------------------------------------------------ networks
def _assert_on_spheres(module: nn.Module) -> int:
    checked = 0
    for m in module.modules():
        if isinstance(m, nn.Linear):
            torch.testing.assert_close(m.weight.norm(dim=1), torch.ones(m.weight.shape[0]))
        elif isinstance(m, nn.BatchNorm1d):
            d = m.weight.numel()
            joint = torch.sqrt(m.weight.square().sum() + m.bias.square().sum())
            torch.testing.assert_close(joint, torch.tensor(float(d)).sqrt())
        elif isinstance(m, nn.RMSNorm):
            torch.testing.assert_close(m.weight.norm(), torch.tensor(float(m.weight.numel())).sqrt())
        else:
            continue
        checked += 1
    return checked


def test_projection_by_hand():
    lin = nn.Linear(2, 2, bias=False)
    bn = nn.BatchNorm1d(2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[3.0, 4.0], [0.0, -2.0]]))
        bn.weight.copy_(torch.tensor([3.0, 0.0]))
        bn.bias.copy_(torch.tensor([0.0, 4.0]))
    project_to_unit_norm(nn.Sequential(lin, bn))
    torch.testing.assert_close(lin.weight, torch.tensor([[0.6, 0.8], [0.0, -1.0]]))
    # ‖(γ, β)‖ = 5 -> √2: scale √2 / 5
    torch.testing.assert_close(bn.weight, torch.tensor([3.0, 0.0]) * 2**0.5 / 5)
    torch.testing.assert_close(bn.bias, torch.tensor([0.0, 4.0]) * 2**0.5 / 5)


def test_flash_net_shape_and_block_structure():
    net = FlashNet(5, 3, hidden_dim=8, num_blocks=2)
    assert net(torch.randn(4, 5)).shape == (4, 3)
    assert net.blocks[0].w1.weight.shape == (32, 8)  # ×4 expansion
    assert _assert_on_spheres(net) == 1 + 1 + 2 * 4 + 1 + 1  # in BN, embed, (w1, bn1, w2, bn2) × 2, RMSNorm, head


def test_unit_norm_holds_after_updates():
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=16)
    algo = make_algo(env, learning_rate=1e-2)  # big steps: they would leave the spheres without the projection
    buf = _filled(env, algo)
    algo.train_mode()
    for _ in range(6):
        stats = algo.update(buf)
    assert "loss/critic" in stats
    assert _assert_on_spheres(algo.actor) > 0 and _assert_on_spheres(algo.critic) > 0
    lin = algo.critic.nets[0].blocks[0].w1
    assert not torch.equal(lin.weight, algo.target.nets[0].blocks[0].w1.weight)  # the target lags (Polyak)


def test_fused_adam_steps_like_the_per_tensor_loop():
    """Actor and critic step torch's fused Adam on the CPU (robot_rl/algos/optim.py): the per-tensor loop's
    arithmetic up to float rounding. One update from the same weights: later updates compute their gradients from
    weights that already differ by rounding, and a discrete choice can then flip (on an AMD EPYC the third update
    moved 919 of 32,602 weights by up to 8.8e-6, the first two by at most 4.5e-8); tests/test_adamw.py compares the
    optimizer itself over many steps of the same gradients."""
    def trained(fused: bool) -> tuple[FlashSAC, torch.Tensor]:
        torch.manual_seed(0)
        env = PointMassEnv(num_envs=16)
        algo = make_algo(env)
        if not fused:
            algo.actor_opt = torch.optim.Adam(algo.actor.parameters(), lr=algo.cfg.learning_rate, foreach=False)
            algo.critic_opt = torch.optim.Adam(algo.critic.parameters(), lr=algo.cfg.learning_rate, foreach=False)
        buf = _filled(env, algo)
        algo.train_mode()
        torch.manual_seed(1)
        algo.update(buf)
        return algo, torch.cat([p.detach().flatten() for p in [*algo.actor.parameters(), *algo.critic.parameters()]])

    (fast, a), (_, b) = trained(True), trained(False)
    assert fast.actor_opt.param_groups[0]["fused"] and fast.critic_opt.param_groups[0]["fused"]
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_tanh_gaussian_log_prob_matches_torch():
    torch.manual_seed(0)
    pol = TanhGaussianPolicy(TanhGaussianPolicyConfig(obs_dim=3, action_dim=2, hidden_dim=8)).eval()
    obs = torch.randn(5, 3)
    torch.manual_seed(1)
    action, log_prob = pol.sample(obs)
    mean, log_std = pol(obs)
    assert bool(((log_std >= -5) & (log_std <= 0)).all())
    base = torch.distributions.Normal(mean, log_std.exp())
    dist = torch.distributions.TransformedDistribution(base, [torch.distributions.TanhTransform()])
    torch.testing.assert_close(log_prob, dist.log_prob(action.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1),
                               rtol=1e-3, atol=1e-3)


def test_exported_policy_loads_without_algorithm_code(tmp_path):
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=16)
    algo = make_algo(env)
    algo.train_mode()
    algo.update(_filled(env, algo))  # BatchNorm running statistics move: they travel with the weights
    algo.policy.save(tmp_path / "policy")
    x = torch.randn(6, 1)
    expected = algo.policy.eval().act(x)
    loaded = load_policy(tmp_path / "policy")
    assert isinstance(loaded, TanhGaussianPolicy) and not loaded.training
    assert torch.equal(loaded.act(x), expected)
    code = textwrap.dedent(f"""
        import sys, torch
        import policies
        p = policies.load_policy({str(tmp_path / 'policy')!r})
        assert p.act(torch.zeros(2, 1)).shape == (2, 1)
        bad = sorted(m for m in sys.modules if m.startswith('robot_rl.algos') or m.startswith('robot_rl.runners')
                     or m.split('.')[0] in ('sim', 'real', 'mujoco', 'lerobot'))
        assert not bad, bad
        print('ok')
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ---------------------------------------------------------------------------------------------- exploration
def test_noise_repeat_lengths_follow_truncated_zeta():
    torch.manual_seed(0)
    probs = truncated_zeta_probs(2.0, 16)
    assert probs[0].item() == pytest.approx(1.0 / sum(1.0 / k**2 for k in range(1, 17)))
    noise = RepeatedNoise(num_envs=8, action_dim=2, s=2.0, k_max=16, device=torch.device("cpu"))
    draws = noise.sample_repeats(200_000)
    assert int(draws.min()) == 1 and int(draws.max()) == 16
    freq = torch.bincount(draws, minlength=17)[1:].double() / len(draws)
    torch.testing.assert_close(freq, probs, atol=4e-3, rtol=0)
    # Each env holds its sample for exactly k steps: run lengths of unchanged noise follow the same law.
    seq = torch.stack([noise().clone() for _ in range(6000)])  # [T, N, A]
    changed = (seq[1:] != seq[:-1]).any(-1)  # [T-1, N]
    lengths = []
    for e in range(8):
        cuts = [0, *(changed[:, e].nonzero().flatten() + 1).tolist()]
        lengths += [b - a for a, b in itertools.pairwise(cuts)]  # complete runs only
    runs = torch.bincount(torch.tensor(lengths), minlength=17)[1:].double() / len(lengths)
    torch.testing.assert_close(runs, probs, atol=0.03, rtol=0)
    assert len(lengths) > 8 * 6000 / 4
    # An episode end draws fresh noise for that env at its next step.
    noise.left.fill_(5)
    before = noise.noise.clone()
    noise.reset(torch.tensor([True] + [False] * 7))
    after = noise().clone()
    assert not torch.equal(after[0], before[0]) and torch.equal(after[1:], before[1:])


def test_return_scale_by_hand():
    # One env, γ = 0.5, rewards 2, 2 then an end, then 4: G = 2, 3 (end, reset), 4.
    rs = ReturnScale(1, gamma=0.5, g_max=5.0, device=torch.device("cpu"))
    for r, end in ((2.0, False), (2.0, True), (4.0, False)):
        rs.update(torch.tensor([r]), torch.tensor([end]), torch.tensor([False]))
    gs = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64)
    assert float(rs.scale()) == pytest.approx(max(gs.std(unbiased=False).item(), 4.0 / 5.0))  # = 0.8
    assert float(rs.abs_max) == 4.0
    # a non-finite return is left out of the statistics and restarts that env's sum
    rs.update(torch.tensor([float("nan")]), torch.tensor([False]), torch.tensor([False]))
    assert float(rs.count) == 3 and float(rs.abs_max) == 4.0 and float(rs.g[0]) == 0.0


# ------------------------------------------------------------------------------------------- replay buffer
def test_time_outs_bootstrap_from_the_final_obs_and_terminations_do_not():
    shapes = {keys.POLICY: (1,)}
    buf = ReplayBuffer(6, 3, shapes, 1, "cpu")  # 2 rows x 3 envs
    obs = {keys.POLICY: torch.tensor([[0.0], [0.0], [0.0]])}
    after_reset = {keys.POLICY: torch.tensor([[1.0], [-1.0], [-1.0]])}  # what step() returns: new episodes
    final = {keys.POLICY: torch.tensor([[1.0], [7.0], [9.0]])}  # the true last observations
    term, trunc = torch.tensor([False, True, False]), torch.tensor([False, False, True])
    buf.add(obs, torch.zeros(3, 1), torch.tensor([1.0, 2.0, 3.0]), term, trunc, after_reset, final)
    torch.manual_seed(0)
    b = buf.sample(256, n_step=1, gamma=0.9)
    r = b[keys.REWARD]
    nxt = b[keys.NEXT_OBS][keys.POLICY][:, 0]
    # env 0 continues, env 1 terminated (no bootstrap), env 2 timed out (bootstraps from its final obs 9, not −1)
    for reward, next_value, discount in ((1.0, 1.0, 0.9), (2.0, 7.0, 0.0), (3.0, 9.0, 0.9)):
        rows = r == reward
        assert rows.any()
        assert bool((nxt[rows] == next_value).all()) and bool((b["discount"][rows] == discount).all())


def test_nstep_sampling_respects_episode_ends_and_the_ring():
    buf = ReplayBuffer(5, 1, {keys.POLICY: (1,)}, 1, "cpu")  # 5 rows, one env
    f, t = torch.tensor([False]), torch.tensor([True])
    for i in range(7):  # rows wrap: steps 2..6 remain; step 3 terminates
        o = {keys.POLICY: torch.tensor([[float(i)]])}
        nxt = {keys.POLICY: torch.tensor([[float(i) + 0.5]])}
        buf.add(o, torch.zeros(1, 1), torch.tensor([1.0]), t if i == 3 else f, f, nxt)
    torch.manual_seed(0)
    b = buf.sample(200, n_step=3, gamma=0.5)
    start = b[keys.OBS][keys.POLICY][:, 0]
    assert set(start.tolist()) == {2.0, 3.0, 4.0, 5.0, 6.0}
    want = {2.0: (1.5, 0.0, 3.5), 3.0: (1.0, 0.0, 3.5), 4.0: (1.75, 0.125, 6.5), 5.0: (1.5, 0.25, 6.5),
            6.0: (1.0, 0.5, 6.5)}  # (G, discount, o') : cut at the termination, and at the newest row
    for s, (g, d, o2) in want.items():
        rows = start == s
        assert torch.allclose(b[keys.REWARD][rows], torch.tensor(g))
        assert torch.allclose(b["discount"][rows], torch.tensor(d))
        assert bool((b[keys.NEXT_OBS][keys.POLICY][rows, 0] == o2).all())


def test_demo_mixing_share():
    shapes = {keys.POLICY: (1,)}
    online, demo = ReplayBuffer(10, 1, shapes, 1, "cpu"), ReplayBuffer(10, 1, shapes, 1, "cpu")
    f = torch.tensor([False])
    for buf, value in ((online, 1.0), (demo, -1.0)):
        o = {keys.POLICY: torch.tensor([[value]])}
        buf.add(o, torch.zeros(1, 1), torch.tensor([value]), f, f, o)
    b = sample_mixed(online, demo, 64, 0.25)
    assert int((b[keys.REWARD] < 0).sum()) == 16 and b[keys.OBS][keys.POLICY].shape == (64, 1)
    assert int((sample_mixed(online, None, 64, 0.25)[keys.REWARD] < 0).sum()) == 0


# -------------------------------------------------------------------------------------------- learning
def test_flashsac_solves_point_reach(tmp_path):
    """A 2-D reach in ~1,500 updates (~30 s on a loaded 2-core machine). The 1-D PointMassEnv is a poor fit for
    FlashSAC's network (a unit-norm embedding of a 1-D input is ±1, and early random-walk returns set a reward
    scale that squeezes its values into two bins), so this test uses a task shaped like so101_reach."""
    torch.manual_seed(0)
    env = PointReach2D(num_envs=8)
    algo = make_algo(env, hidden=32, batch_size=64, learning_starts=256, updates_per_step=2.0, n_step=3, gamma=0.9,
                     learning_rate=3e-3, learning_rate_end=3e-3)
    make_runner(env, algo, tmp_path, total_steps=8 * 8 * 100, ckpt=False).learn()
    algo.eval_mode()
    result = evaluate(PointReach2D(num_envs=32, seed=1), lambda o: algo.policy.act(o), 64, seed=123)
    assert result.success_rate >= 0.9, result
    assert result.mean_length < 12, result  # straight there: ≤ 2.8 at 0.2 per step


# -------------------------------------------------------------------------------------- guard and resume
def _snapshot(algo):
    return flatten_tree({"actor_opt": algo.actor_opt.state_dict(), "critic_opt": algo.critic_opt.state_dict(),
                         "actor": algo.actor.state_dict(), "critic": algo.critic.state_dict(),
                         "target": algo.target.state_dict(), "alpha": algo.log_alpha.detach()})


def _assert_bitwise_equal(a, b):
    assert a[1] == b[1]
    assert a[0].keys() == b[0].keys()
    for k in a[0]:
        assert torch.equal(a[0][k], b[0][k]), k


@pytest.mark.parametrize("inject", ["nan_grad", "inf_grad", "nan_reward"])
def test_nonfinite_update_is_skipped_with_state_untouched(inject):
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=16)
    algo = make_algo(env, max_consecutive_nonfinite=100, actor_update_period=1)
    buf = _filled(env, algo)
    algo.train_mode()
    algo.update(buf)  # a good update first: Adam has moments and a step count
    before = _snapshot(algo)
    handles = []
    if inject == "nan_reward":
        buf.reward[:, :] = float("nan")
    else:
        bad = float("nan") if inject == "nan_grad" else float("inf")
        for net in (algo.critic.nets[0], algo.actor.net):
            handles.append(net.embed.weight.register_hook(lambda g: torch.full_like(g, bad)))
    stats = algo.update(buf)
    for h in handles:
        h.remove()
    _assert_bitwise_equal(before, _snapshot(algo))
    assert algo.nonfinite_skips >= 1 and stats["nonfinite_skips"] >= 1


def test_too_many_nonfinite_updates_stop_the_run_naming_the_last_checkpoint(tmp_path):
    torch.manual_seed(0)
    env = PointMassEnv(num_envs=8)
    algo = make_algo(env, hidden=16, batch_size=32, learning_starts=32)
    runner = make_runner(env, algo, tmp_path, total_steps=8 * 8 * 2, every=1)
    runner.learn()
    assert runner.checkpoints.latest().name == "iter_00000002"
    algo.critic.nets[0].embed.weight.register_hook(lambda g: torch.full_like(g, float("nan")))
    runner.cfg.total_steps = 8 * 8 * 10
    with pytest.raises(NonFiniteError, match="last good checkpoint is .*iter_0000000") as err:
        runner.learn()
    assert str(runner.checkpoints.latest()) in str(err.value)
    assert algo.guard.consecutive == 11


def test_kill_and_resume_is_bitwise_equal(tmp_path):
    """6 iterations straight vs 3 iterations, a fresh process state restored from the checkpoint, 3 more."""
    torch.use_deterministic_algorithms(True)
    try:
        def build(folder, total):
            torch.manual_seed(0)
            env = PointMassEnv(num_envs=8)
            algo = make_algo(env, hidden=16, batch_size=32, learning_starts=48, updates_per_step=0.5, n_step=3,
                             actor_update_period=2)
            return make_runner(env, algo, folder, total_steps=total, every=1, steps_per_iteration=4)

        total = 8 * 4 * 6
        straight = build(tmp_path / "a", total)
        straight.learn()

        first = build(tmp_path / "b", 8 * 4 * 3)
        first.learn()
        resumed = build(tmp_path / "b", total)
        torch.manual_seed(123)  # the resumed process is in other RNG states: the checkpoint must restore them
        resumed.restore(load_checkpoint(tmp_path / "b" / "ckpt"))
        assert resumed.iteration == 3 and resumed.replay.num_transitions == 8 * 4 * 3
        resumed.learn()

        assert straight.algo.num_updates == resumed.algo.num_updates > 0
        a = flatten_tree({"algo": straight.algo.state_dict(), "replay": straight.replay.state_dict(),
                          "obs": straight.obs, "env": straight.env.state_dict()})
        b = flatten_tree({"algo": resumed.algo.state_dict(), "replay": resumed.replay.state_dict(),
                          "obs": resumed.obs, "env": resumed.env.state_dict()})
        _assert_bitwise_equal(a, b)
    finally:
        torch.use_deterministic_algorithms(False)


def test_cli_trains_resumes_and_evaluates_flashsac_on_so101_reach(tmp_path):
    """``robot-rl train task=so101_reach algo=flashsac`` end to end at a tiny size: checkpoints carry the replay
    buffer and the exported tanh-Gaussian policy; resume continues; ``robot-rl eval`` loads the policy alone."""
    from robot_rl.cli.main import main

    run = tmp_path / "run"
    tiny = ["task=so101_reach", "algo=flashsac", "sim.num_envs=8", "algo.steps_per_iteration=8",
            "algo.batch_size=32", "algo.learning_starts=64", "algo.actor.hidden_dim=16", "algo.critic.hidden_dim=16",
            "checkpoint_every=3", "eval.enabled=false", "logger.progress=false", "logger.tensorboard=false",
            f"run_dir={run}"]
    assert main(["train", *tiny, "total_steps=192"]) == 0
    ckpt = load_checkpoint(run)
    assert ckpt.path.name == "iter_00000003" and ckpt.meta["algo"] == "flashsac"
    assert ckpt.state["runner"]["replay"]["size"] == 3 * 8 and ckpt.state["algo"]["num_updates"] > 0
    assert isinstance(load_policy(ckpt.policy_dir), TanhGaussianPolicy)
    assert main(["train", *tiny, "total_steps=256", f"resume={run}"]) == 0
    assert load_checkpoint(run).path.name == "iter_00000004"
    assert main(["eval", f"checkpoint={run}", "num_episodes=4", "num_envs=4", "video=false",
                 f"out_dir={tmp_path / 'eval'}"]) == 0


def test_update_statistics_are_averaged_with_device_tensors_kept_until_logging():
    from robot_rl.runners.off_policy import mean_stats

    out = mean_stats({"lr": [1.0, 3.0], "loss": [torch.tensor(1.0), torch.tensor(2.0)], "q": [torch.tensor(-4.0)]})
    assert out == {"lr": 2.0, "loss": 1.5, "q": -4.0}
    assert all(isinstance(v, float) for v in out.values())


def test_the_replay_holds_the_action_the_env_applied(tmp_path):
    """What led to o' is the env's applied action (clipped to [-1, 1]; a person's once one acts), not what the
    learner proposed: actions of 2.0 are stored as 1.0."""
    from tests._toy_envs import PointMassEnv

    env = PointMassEnv(num_envs=4)
    algo = make_algo(env, learning_starts=10_000)  # warm-up only: random actions, no updates
    algo.random_action = lambda n: torch.full((n, env.action_dim), 2.0)
    runner = make_runner(env, algo, tmp_path, total_steps=4 * 8, ckpt=False)
    runner.learn()
    stored = runner.replay.action[:runner.replay.size]
    assert runner.replay.size == 8 and torch.equal(stored, torch.ones_like(stored))
