"""The flow-matching VLA: its math against hand-computed numbers (time sampling, Euler steps, loss, guidance, time
embedding), the vocabulary and <unk>, a real overfit of a tiny batch, save/load, and running through an
ActionQueue with task strings."""

from __future__ import annotations

import json
import math

import pytest
import torch

from policies import ActionQueue, FlowVLAConfig, FlowVLAPolicy, keys, load_policy
from policies.flow_vla import CONDITION_KEY
from policies.flow_vla.config import RELATIVE_STATS_KEY
from policies.flow_vla.encoders import (
    PAD_ID,
    UNK_ID,
    ImageEncoder,
    SpatialSoftmax,
    build_vocab,
    color_jitter,
    tokenize,
    word_index,
)
from policies.flow_vla.flow import (
    euler_integrate,
    euler_times,
    flow_matching_loss,
    guided_velocity,
    interpolate,
    reduce_samples,
    sample_time,
    target_velocity,
    time_embedding,
)
from policies.flow_vla.policy import relative_chunk_stats
from robot_rl.algos.bc import BC, BCConfig
from robot_rl.algos.precision import native_bf16

TASKS = ["pick up the red cube", "pick up the blue cube"]
CAMS = ["front", "wrist"]


def _tiny_cfg(**kw) -> FlowVLAConfig:
    base = {"cameras": CAMS, "image_size": [32, 32], "horizon": 4, "executed_steps": 2, "conv_channels": [8, 16],
            "conv_strides": [2, 2], "image_feature_dim": 32, "text_dim": 16, "hidden_dim": 64, "num_blocks": 2,
            "time_dim": 16, "random_shift": 2, "flow_samples": 1}
    return FlowVLAConfig(**(base | kw))


def _stats() -> dict:
    return {keys.OBS_STATE: {"mean": [0.0, 10, -20, 30, 0, 15], "std": [20.0, 30, 30, 25, 60, 10], "count": [500]},
            keys.ACTION_COL: {"mean": [1.0, 11, -19, 29, 0, 20], "std": [22.0, 31, 29, 24, 61, 12],
                              "min": [-40.0] * 6, "max": [40.0] * 6},
            RELATIVE_STATS_KEY: {"mean": [[0.5 * h, 1, -1, 0, 0, 2] for h in range(4)],
                                 "std": [[2.0 + h, 3, 3, 2, 6, 1] for h in range(4)]}}


def _policy(**kw) -> FlowVLAPolicy:
    torch.manual_seed(0)
    return FlowVLAPolicy.from_stats(_stats(), TASKS, _tiny_cfg(**kw))


def _let_the_condition_act(pol: FlowVLAPolicy) -> None:
    """FiLM starts at zero (the condition has no effect yet): give it some."""
    for block in pol.model.blocks:
        torch.nn.init.normal_(block.film.weight, std=0.3)


def _batch(b: int, horizon: int = 4, seed: int = 1, uint8: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    images = {keys.lerobot_image_key(c): torch.rand(b, 3, 32, 32, generator=g) for c in CAMS}
    if uint8:
        images = {k: (v * 255).round().to(torch.uint8) for k, v in images.items()}
    pad = torch.zeros(b, horizon, dtype=torch.bool)
    pad[0, -1] = True
    return {keys.OBS_STATE: torch.randn(b, 6, generator=g) * 20, **images, keys.TASK: [TASKS[i % 2] for i in range(b)],
            keys.ACTION_COL: torch.randn(b, horizon, 6, generator=g) * 20 + 5, keys.ACTION_IS_PAD: pad,
            CONDITION_KEY: torch.arange(b) % 3 == 0}


# ---------------------------------------------------------------------------------------------- math by hand
def test_time_sampling_is_the_affine_beta():
    t = sample_time(200_000, generator=torch.Generator().manual_seed(0))
    assert float(t.min()) >= 0.001 and float(t.max()) <= 1.0
    # mean 0.999 · 1.5/2.5 + 0.001 = 0.6004; std of the mean: 0.999 · sqrt(1.5/(2.5² · 3.5)) / sqrt(2e5) = 5.9e-4
    assert abs(float(t.mean()) - 0.6004) < 3e-3
    # P(t <= 0.5005) = P(Beta(1.5, 1) <= 0.5) = 0.5^1.5 = 0.35355 (binomial std 1.1e-3)
    assert abs(float((t <= 0.5005).float().mean()) - 0.35355) < 5e-3
    # the draw is U^(1/1.5) of the generator's uniforms, affinely mapped
    u = torch.rand(5, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(sample_time(5, generator=torch.Generator().manual_seed(3)),
                               0.999 * u.pow(2 / 3) + 0.001)
    # alpha = 1 is the uniform on [0.001, 1]; alpha <= 0 is no Beta distribution
    torch.testing.assert_close(sample_time(5, alpha=1.0, generator=torch.Generator().manual_seed(3)),
                               0.999 * u + 0.001)
    for bad in (0.0, -1.5):
        with pytest.raises(ValueError, match="alpha must be > 0"):
            sample_time(5, alpha=bad)


def test_euler_integration_by_hand():
    x1 = torch.tensor([[2.0, -4.0]])
    seen = []

    def const(x, t, k):
        seen.append((round(float(t[0]), 6), k))
        return torch.tensor([[1.0, 3.0]])

    torch.testing.assert_close(euler_integrate(const, x1, 3), torch.tensor([[1.0, -7.0]]))  # x1 − v
    assert seen == [(1.0, 0), (0.666667, 1), (0.333333, 2)]
    # v = x, 2 steps: x ← x·(1 − 0.5) twice = 0.25·x1
    torch.testing.assert_close(euler_integrate(lambda x, t, k: x, x1, 2), torch.tensor([[0.5, -1.0]]))
    # v = t, 4 steps at t = 1, .75, .5, .25: x1 − 0.25·2.5 = x1 − 0.625
    torch.testing.assert_close(euler_integrate(lambda x, t, k: t[:, None].expand_as(x), x1, 4),
                               torch.tensor([[1.375, -4.625]]))
    # v = t·x, 2 steps: x ← x − 0.5·x = 0.5 x; then x ← 0.5x − 0.5·0.5·0.5x = 0.375·x1
    torch.testing.assert_close(euler_integrate(lambda x, t, k: t[:, None] * x, x1, 2), torch.tensor([[0.75, -1.5]]))
    torch.testing.assert_close(euler_times(4), torch.tensor([1.0, 0.75, 0.5, 0.25]))
    # one step is a single evaluation at t = 1: x1 − v
    torch.testing.assert_close(euler_times(1), torch.tensor([1.0]))
    torch.testing.assert_close(euler_integrate(const, x1, 1), torch.tensor([[1.0, -7.0]]))
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        euler_times(0)


def test_flow_matching_path_and_loss_by_hand():
    a, eps = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]]), torch.tensor([[[0.0, -2.0], [1.0, 0.0]]])
    torch.testing.assert_close(interpolate(a, eps, torch.tensor([0.25])),
                               torch.tensor([[[0.75, 1.0], [2.5, 3.0]]]))  # 0.25·ε + 0.75·a
    torch.testing.assert_close(interpolate(a, eps, torch.tensor([1.0])), eps)
    u = target_velocity(a, eps)
    torch.testing.assert_close(u, torch.tensor([[[-1.0, -4.0], [-2.0, -4.0]]]))
    # a model returning the exact velocity has zero loss, padded steps or not
    assert float(flow_matching_loss(u, u)) == 0.0
    pad = torch.tensor([[False, True]])
    assert float(flow_matching_loss(u + torch.tensor([0.0, 7.0])[None, :, None], u, pad)) == 0.0
    # error 1 on both dims of step 0, none on step 1: per-step means [1, 0]
    err = u + torch.tensor([1.0, 0.0])[None, :, None]
    assert float(flow_matching_loss(err, u)) == 0.5
    assert float(flow_matching_loss(err, u, pad)) == 1.0
    assert float(flow_matching_loss(err, u, torch.tensor([[True, False]]))) == 0.0


def test_classifier_free_guidance_by_hand():
    v_u, v_c = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 1.0])
    torch.testing.assert_close(guided_velocity(v_u, v_c, 2.0), torch.tensor([5.0, 0.0]))  # 1 + 2·2, 2 + 2·(−1)
    torch.testing.assert_close(guided_velocity(v_u, v_c, 1.0), v_c)
    torch.testing.assert_close(guided_velocity(v_u, v_c, 0.0), v_u)


def test_sample_reductions_by_hand():
    # one row, K = 3 chunks of H = 1, A = 2: (0, 3), (4, 0), (5, 5)
    x = torch.tensor([[[[0.0, 3.0]], [[4.0, 0.0]], [[5.0, 5.0]]]])
    torch.testing.assert_close(reduce_samples(x, "mean"), torch.tensor([[[3.0, 8.0 / 3.0]]]))
    torch.testing.assert_close(reduce_samples(x, "median"), torch.tensor([[[4.0, 3.0]]]))  # not a sample
    # summed distances: 5 + √29 = 10.39, 5 + √26 = 10.10, √29 + √26 = 10.48: the second chunk
    torch.testing.assert_close(reduce_samples(x, "medoid"), torch.tensor([[[4.0, 0.0]]]))
    two = torch.cat([x, x.flip(1) + 1.0])  # rows reduce on their own: (6, 6), (5, 1), (1, 4) -> (5, 1)
    torch.testing.assert_close(reduce_samples(two, "medoid"), torch.tensor([[[4.0, 0.0]], [[5.0, 1.0]]]))
    even = torch.tensor([1.0, 4.0, 2.0, 3.0]).reshape(1, 4, 1, 1)
    assert reduce_samples(even, "median").item() == 2.0  # the lower middle
    # median_dims: those action dimensions by the median whatever the reduction: (3, 3) and (4, 3)
    torch.testing.assert_close(reduce_samples(x, "mean", median_dims=[1]), torch.tensor([[[3.0, 3.0]]]))
    torch.testing.assert_close(reduce_samples(x, "medoid", median_dims=[1]), torch.tensor([[[4.0, 3.0]]]))
    split = torch.tensor([-1.0, -1.0, 1.0, 1.0, 1.0]).reshape(1, 5, 1, 1)  # two modes, the larger at +1
    assert reduce_samples(split, "mean").item() == pytest.approx(0.2)  # between the modes
    assert reduce_samples(split, "mean", median_dims=[0]).item() == 1.0  # inside the larger one
    with pytest.raises(ValueError, match="unknown sample reduction"):
        reduce_samples(x, "mode")
    with pytest.raises(ValueError, match=r"\[N, K, H, A\]"):
        reduce_samples(x[0], "mean")


def test_time_embedding_by_hand():
    emb = time_embedding(torch.tensor([0.0, 1.0], dtype=torch.float64), 4)  # periods 4e-3 and 4
    torch.testing.assert_close(emb[0], torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=torch.float64))
    # t = 1: 2π/4e-3 = 500π (sin 0, cos 1); 2π/4 = π/2 (sin 1, cos 0)
    torch.testing.assert_close(emb[1], torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float64), atol=1e-9, rtol=0)


# ---------------------------------------------------------------------------------------------- language
def test_vocabulary_and_unknown_words():
    vocab = build_vocab(["Pick up the red cube.", "pick up the BLUE cube"])
    assert vocab == ["blue", "cube", "pick", "red", "the", "up"]
    ids = word_index(vocab)
    tok = tokenize(["pick up the purple cube", "pick up the red cube"], ids, 6)
    assert tok[0].tolist() == [ids["pick"], ids["up"], ids["the"], UNK_ID, ids["cube"], PAD_ID]
    assert tok[1, 3] == ids["red"] and ids["red"] not in (UNK_ID, PAD_ID)
    with pytest.raises(ValueError, match="task 1 '' has 0 words"):
        tokenize(["red", ""], ids, 6)
    with pytest.raises(ValueError, match="has 7 words; the policy reads 1 to 6"):
        tokenize(["a b c d e f g"], ids, 6)
    # the text encoder keeps word identity and order (a mean of word vectors would not see order)
    pol = _policy()
    emb = pol.model.text(tokenize(["red cube", "cube red", "blue cube"], pol._word_ids, pol.cfg.max_words))
    assert (emb[0] - emb[1]).abs().max() > 1e-3 and (emb[0] - emb[2]).abs().max() > 1e-3
    # a policy given an instruction with an unknown word still acts (the word reads as <unk>)
    pol.eval()
    frame = {k: v for k, v in _batch(2).items() if k not in (keys.ACTION_COL, keys.ACTION_IS_PAD)}
    frame[keys.TASK] = ["pick up the purple cube", "pick up the red cube"]
    assert torch.isfinite(pol.act(frame)).all()


# ---------------------------------------------------------------------------------------------- the policy
def test_loss_is_zero_for_the_exact_velocity_and_uses_the_action_statistics():
    pol = _policy(relative_actions=False)
    pol.eval()
    batch = _batch(3)
    eps, t = torch.randn(3, 4, 6), torch.tensor([0.2, 0.5, 0.9])
    a_norm = (batch[keys.ACTION_COL] - torch.tensor(_stats()[keys.ACTION_COL]["mean"])) / torch.tensor(
        _stats()[keys.ACTION_COL]["std"])
    pol.model.velocity = lambda ctx, x, tt, cond: eps - a_norm  # an oracle: u = ε − a in normalised units
    loss, metrics = pol.loss(batch, noise=eps, time=t)
    assert float(loss) == 0.0 and metrics["pad_fraction"] == pytest.approx(1 / 12)
    pol.model.velocity = lambda ctx, x, tt, cond: eps - a_norm + 1.0
    assert float(pol.loss(batch, noise=eps, time=t)[0]) == pytest.approx(1.0)


def test_several_flow_samples_per_observation_equal_the_repeated_batch():
    # K = 3 draws per observation == K = 1 on the batch with each sample repeated 3 times (row i·K + k is sample i's
    # k-th draw, the pad mask follows it), with the same weights, noise and times
    k, b = 3, 4
    one, many = _policy(relative_actions=False), _policy(relative_actions=False, flow_samples=k)
    many.load_state_dict(one.state_dict())
    one.eval(), many.eval()
    batch = _batch(b)
    repeated = {key: (v.repeat_interleave(k, dim=0) if isinstance(v, torch.Tensor) else
                      [x for x in v for _ in range(k)]) for key, v in batch.items()}
    eps, t = torch.randn(b * k, 4, 6), torch.rand(b * k)
    want, _ = one.loss(repeated, noise=eps, time=t)
    got, metrics = many.loss(batch, noise=eps, time=t)
    torch.testing.assert_close(got, want)
    assert metrics["pad_fraction"] == pytest.approx(1 / 16)
    # and the draws differ: a loss on the first draw only is not the same number
    assert float(one.loss(batch, noise=eps[::k], time=t[::k])[0].detach()) != pytest.approx(float(got.detach()))
    with pytest.raises(ValueError, match="flow_samples"):
        _tiny_cfg(flow_samples=0)


def test_relative_actions_normalise_the_chunk_minus_the_state_per_step():
    pol = _policy(relative_actions=True)
    pol.eval()
    batch = _batch(3)
    rel = _stats()[RELATIVE_STATS_KEY]
    a_norm = (batch[keys.ACTION_COL] - batch[keys.OBS_STATE][:, None, :] - torch.tensor(rel["mean"])) / torch.tensor(
        rel["std"])
    eps, t = torch.randn(3, 4, 6), torch.tensor([0.2, 0.5, 0.9])
    pol.model.velocity = lambda ctx, x, tt, cond: eps - a_norm
    assert float(pol.loss(batch, noise=eps, time=t)[0]) == 0.0
    # act() maps the expert's output back to absolute targets around the frame's joints
    x = torch.randn(3, 4, 6)
    back = pol.denormalize_actions(x, batch[keys.OBS_STATE])
    torch.testing.assert_close(back, x * torch.tensor(rel["std"]) + torch.tensor(rel["mean"])
                               + batch[keys.OBS_STATE][:, None, :])
    torch.testing.assert_close(pol.normalize_actions(back, batch[keys.OBS_STATE]), x)
    with pytest.raises(KeyError, match=RELATIVE_STATS_KEY):
        FlowVLAPolicy.from_stats({k: v for k, v in _stats().items() if k != RELATIVE_STATS_KEY}, TASKS,
                                 _tiny_cfg(relative_actions=True))
    with pytest.raises(ValueError, match="same joints in the same order"):
        FlowVLAPolicy.from_stats(_stats(), TASKS, _tiny_cfg(relative_actions=True), state_names=list("abcdef"),
                                 action_names=list("abcdfe"))


def test_relative_chunk_stats_by_hand():
    # one joint; episode 0 = frames 0, 1 (q 0, 10; a 1, 12), episode 1 = frame 2 (q 5; a 4); H = 2, chunks padded
    # with the episode's last action: deltas h=0: 1, 2, -1; h=1: 12, 2, -1
    state, action = torch.tensor([[0.0], [10.0], [5.0]]), torch.tensor([[1.0], [12.0], [4.0]])
    out = relative_chunk_stats(state, action, torch.tensor([1, 1, 2]), horizon=2)
    torch.testing.assert_close(out["mean"], torch.tensor([[2 / 3], [13 / 3]]))
    torch.testing.assert_close(out["std"], torch.tensor([[math.sqrt(14 / 9)], [math.sqrt(278 / 9)]]))


def _fixed_eval_loss(pol: FlowVLAPolicy, batch: dict):
    """A function giving the policy's eval-mode loss on ``batch`` (8 samples) at one fixed draw of noise and time."""
    g = torch.Generator().manual_seed(5)
    noise, time = torch.randn(8, 4, 6, generator=g), sample_time(8, generator=g)

    def eval_loss() -> float:
        pol.eval()
        with torch.no_grad():
            return float(pol.loss(batch, noise=noise, time=time)[0])

    return eval_loss


@pytest.mark.parametrize("relative", [False, True])
def test_overfits_a_tiny_fixed_batch(relative):
    batch = _batch(8)
    stats = _stats()
    if relative:  # statistics that fit the batch, as relative_chunk_stats gives them for a dataset
        delta = batch[keys.ACTION_COL] - batch[keys.OBS_STATE][:, None, :]
        stats[RELATIVE_STATS_KEY] = {"mean": delta.mean(0), "std": delta.std(0)}
    torch.manual_seed(0)
    pol = FlowVLAPolicy.from_stats(stats, TASKS, _tiny_cfg(random_shift=0, relative_actions=relative))
    eval_loss = _fixed_eval_loss(pol, batch)
    before = eval_loss()
    opt = torch.optim.Adam(pol.parameters(), lr=2e-3)
    pol.train()
    for _ in range(200):
        loss, _ = pol.loss(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = eval_loss()
    assert before > 1.0 and after < 0.2 * before, (before, after)
    # and the sampled chunks move to the demonstrated ones (normalised error well under the data's spread of 1)
    pol.eval()
    frame = {k: v for k, v in batch.items() if k not in (keys.ACTION_COL, keys.ACTION_IS_PAD)}
    err = (pol.act(frame) - batch[keys.ACTION_COL]) / (pol.delta_std if relative else pol.action_std)
    assert float(err[~batch[keys.ACTION_IS_PAD]].pow(2).mean()) < 0.25


def test_images_as_uint8_or_float_give_the_same_actions_and_shapes_are_checked():
    pol = _policy().eval()
    as_float = {k: v for k, v in _batch(2, uint8=True).items() if k != keys.ACTION_COL}
    as_uint8 = dict(as_float)
    for c in CAMS:
        as_float[keys.lerobot_image_key(c)] = as_uint8[keys.lerobot_image_key(c)].float() / 255
    out = pol.act(as_uint8)
    assert out.shape == (2, 4, 6) and pol.horizon == 4 and pol.executed_steps == 2
    torch.testing.assert_close(pol.act(as_float), out)
    bad = dict(as_uint8) | {keys.lerobot_image_key("wrist"): torch.zeros(2, 3, 64, 64, dtype=torch.uint8)}
    with pytest.raises(ValueError, match=r"'observation.images.wrist' has shape \[3, 64, 64\] per env, the policy "
                                         r"was trained on \[3, 32, 32\]"):
        pol.act(bad)
    with pytest.raises(ValueError, match="the frame has no 'task'"):
        pol.act({k: v for k, v in as_uint8.items() if k != keys.TASK})
    with pytest.raises(KeyError, match="no 'action'"):
        FlowVLAPolicy.from_stats({keys.OBS_STATE: _stats()[keys.OBS_STATE]}, TASKS, _tiny_cfg())
    with pytest.raises(ValueError, match=r"action.std must be 6 finite numbers"):
        FlowVLAPolicy.from_stats(_stats() | {keys.ACTION_COL: {"mean": [0.0] * 6, "std": [1.0] * 5}}, TASKS,
                                 _tiny_cfg())
    with pytest.raises(ValueError, match=r"batch 'action' has shape \[2, 5, 6\]"):
        pol.loss(_batch(2, horizon=5))


def test_deterministic_sampling_starts_from_one_fixed_noise():
    pol = _policy(mean_of_samples=1).eval()
    frame = {k: v for k, v in _batch(3).items() if k != keys.ACTION_COL}
    det = pol.act(frame)
    eps = torch.randn(4, 6, generator=torch.Generator().manual_seed(pol.cfg.noise_seed))
    torch.testing.assert_close(pol.act(frame, noise=eps.expand(3, 4, 6)), det, rtol=0, atol=0)
    torch.testing.assert_close(pol.act({**{k: v[1:2] for k, v in frame.items() if isinstance(v, torch.Tensor)},
                                        keys.TASK: frame[keys.TASK][1:2]}), det[1:2])  # batch-independent
    torch.manual_seed(1)
    assert not torch.allclose(pol.act(frame, deterministic=False), det)
    assert not torch.allclose(pol.act(frame, noise=torch.zeros(3, 4, 6)), det)


@pytest.mark.parametrize("conditioning", [False, True])
def test_the_action_is_the_mean_of_chunks_from_successive_fixed_draws(conditioning):
    k = 3
    pol = _policy(mean_of_samples=k, conditioning=conditioning, guidance_beta=1.5).eval()
    with torch.no_grad():  # off the zero-initialised FiLM, so that the indicator changes the chunk
        for i, p in enumerate(pol.model.parameters()):
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
    frame = {key: v for key, v in _batch(3).items() if key != keys.ACTION_COL}  # indicators 1, 0, 0
    if conditioning:
        flipped = {**frame, CONDITION_KEY: ~frame[CONDITION_KEY]}
        assert (pol.act(flipped) - pol.act(frame)).abs().max() > 0.1
    g = torch.Generator().manual_seed(pol.cfg.noise_seed)
    draws = [torch.randn(4, 6, generator=g) for _ in range(k)]  # eps*_1, eps*_2, eps*_3 by hand
    by_draw = torch.stack([pol.act(frame, noise=e.expand(3, 4, 6)) for e in draws])
    torch.testing.assert_close(pol.act(frame), by_draw.mean(dim=0), rtol=1e-5, atol=1e-4)
    assert (by_draw[0] - by_draw[1]).abs().max() > 0.1  # the draws differ, so the mean is not one of them
    torch.testing.assert_close(pol.fixed_noise(2)[1, 0], draws[0], rtol=0, atol=0)  # K = 1's eps* comes first
    torch.manual_seed(3)
    fresh = pol.act(frame, deterministic=False)
    torch.manual_seed(3)
    eps = torch.randn(3 * k, 4, 6).unflatten(0, (3, k))  # env-major, as act draws them
    expected = torch.stack([pol.act(frame, noise=eps[:, j]) for j in range(k)]).mean(dim=0)
    torch.testing.assert_close(fresh, expected, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="mean_of_samples"):
        _tiny_cfg(mean_of_samples=0)
    from policies.execution import set_mean_of_samples, set_sample_reduction
    from policies.gaussian import GaussianPolicy, GaussianPolicyConfig

    set_mean_of_samples(pol, 1)  # one sample: the chunk of eps*_1
    torch.testing.assert_close(pol.act(frame), by_draw[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="policies that sample"):
        set_mean_of_samples(GaussianPolicy(GaussianPolicyConfig(obs_dim=3, action_dim=2)), 4)
    # the medoid of the k chunks, taken in the expert's normalised space: one of the sampled chunks itself
    set_mean_of_samples(pol, k)
    set_sample_reduction(pol, "medoid")
    state = frame[keys.OBS_STATE]
    normed = torch.stack([pol.normalize_actions(c, state) for c in by_draw], dim=1)
    medoid = pol.act(frame)
    torch.testing.assert_close(medoid, pol.denormalize_actions(reduce_samples(normed, "medoid"), state),
                               rtol=1e-5, atol=1e-4)
    assert all(min((medoid[i] - c[i]).abs().max() for c in by_draw) < 1e-3 for i in range(3))
    with pytest.raises(ValueError, match="sample_reduction"):
        _tiny_cfg(sample_reduction="mode")
    with pytest.raises(ValueError, match="bad config: sample_reduction must be one of"):
        set_sample_reduction(pol, "mode")
    with pytest.raises(ValueError, match="policies that sample"):
        set_sample_reduction(GaussianPolicy(GaussianPolicyConfig(obs_dim=3, action_dim=2)), "median")


def test_median_actions_take_the_median_of_the_named_action_features():
    from policies.execution import set_median_actions

    names = [f"joint{i}.pos" for i in range(6)]
    pol = FlowVLAPolicy.from_stats(_stats(), TASKS, _tiny_cfg(mean_of_samples=5, median_actions=["joint4.pos"]),
                                   action_names=names)
    pol.eval()
    assert pol.median_dims() == [4]
    frame = {key: v for key, v in _batch(3).items() if key != keys.ACTION_COL}
    g = torch.Generator().manual_seed(pol.cfg.noise_seed)
    draws = [torch.randn(4, 6, generator=g) for _ in range(5)]
    state = frame[keys.OBS_STATE]
    normed = torch.stack([pol.normalize_actions(pol.act(frame, noise=e.expand(3, 4, 6)), state) for e in draws], 1)
    expected = normed.mean(dim=1)
    expected[..., 4] = normed[..., 4].median(dim=1).values
    got = pol.act(frame)
    torch.testing.assert_close(got, pol.denormalize_actions(expected, state), rtol=1e-5, atol=1e-4)
    set_median_actions(pol, [])  # the plain mean differs in that dimension only
    plain = pol.act(frame)
    assert (plain[..., 4] - got[..., 4]).abs().max() > 1e-3
    torch.testing.assert_close(plain[..., :4], got[..., :4], rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match=r"bad config: median_actions names \['gripper.pos'\]"):
        set_median_actions(pol, ["gripper.pos"])
    assert pol.cfg.median_actions == []  # a refused setting leaves the policy as it was
    with pytest.raises(ValueError, match="have no names"):  # a misnamed feature fails before any training
        FlowVLAPolicy.from_stats(_stats(), TASKS, _tiny_cfg(median_actions=["joint4.pos"]))


def test_conditioning_dropout_and_guidance():
    pol = _policy(conditioning=True, cond_dropout=0.3)
    batch = _batch(64)
    torch.manual_seed(0)
    _, m = pol.loss(batch)
    assert 0.1 < m["cond_dropped"] < 0.5  # ~0.3 of the indicators replaced by "no condition" in training
    pol.eval()
    assert pol.loss(batch)[1]["cond_dropped"] == 0.0
    with pytest.raises(KeyError, match="no 'advantage_indicator'"):
        pol.loss({k: v for k, v in batch.items() if k != CONDITION_KEY})
    # sampling: β = 0 is the unconditional flow, β = 1 the positive-conditioned one, β = 2 extrapolates past it
    frame = {k: v[:2] for k, v in batch.items() if k not in (keys.ACTION_COL, CONDITION_KEY)}
    _let_the_condition_act(pol)
    noise = torch.randn(2, 4, 6)
    with torch.no_grad():
        ctx = pol._encode(frame)
        uncond = euler_integrate(lambda x, t, k: pol.model.velocity(ctx, x, t, None), noise, 10)
        positive = euler_integrate(lambda x, t, k: pol.model.velocity(ctx, x, t, torch.full((2,), 2)), noise, 10)
    outs = {}
    for beta in (0.0, 1.0, 2.0):
        pol.cfg.guidance_beta = beta
        outs[beta] = pol.act(frame, noise=noise)
    state = frame[keys.OBS_STATE]
    torch.testing.assert_close(outs[0.0], pol.denormalize_actions(uncond, state), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(outs[1.0], pol.denormalize_actions(positive, state), rtol=1e-5, atol=1e-4)
    assert not torch.allclose(outs[2.0], outs[1.0])
    neg = pol.act(frame | {CONDITION_KEY: torch.tensor([False, False])}, noise=noise)
    assert not torch.allclose(neg, outs[2.0])


def test_fine_keypoints_are_the_spatial_softmax_of_the_chosen_convs_map():
    torch.manual_seed(0)
    enc = ImageEncoder([4, 6, 8], [2, 2, 2], 16, 5, fine_from=1)
    assert enc.proj[0].in_features == 2 * (8 + 6)  # (x, y) per channel of the last map and of conv 1's
    x, task = torch.rand(2, 3, 32, 32), torch.randn(2, 5)
    maps = {}
    enc.convs[1].register_forward_hook(lambda m, i, out: maps.setdefault("conv1", out))
    captured = {}
    enc.proj.register_forward_hook(lambda m, i, out: captured.setdefault("in", i[0]))
    enc(x, task)
    # FiLM starts at identity, so conv 1's activation is ReLU(conv(h)); its keypoints are the last 12 inputs
    fine = SpatialSoftmax()(enc.fine_maps(torch.relu(maps["conv1"])) / enc.log_temperature.exp())
    torch.testing.assert_close(captured["in"][:, 16:], fine)
    with pytest.raises(ValueError, match="fine_from"):
        ImageEncoder([4, 6], [2, 2], 16, 5, fine_from=2)


@pytest.mark.parametrize("fine", [False, True])
def test_save_load_round_trip_gives_identical_actions(tmp_path, fine):
    pol = _policy(conditioning=True, guidance_beta=1.5, fine_keypoints=fine, conv_channels=[8, 8, 16],
                  conv_strides=[2, 2, 2])
    assert (pol.model.images[CAMS[0]].fine_from is not None) == fine
    opt = torch.optim.Adam(pol.parameters(), lr=1e-3)
    for _ in range(2):
        loss, _ = pol.loss(_batch(4))
        opt.zero_grad()
        loss.backward()
        opt.step()
    pol.eval()
    pol.save(tmp_path / "vla")
    back = load_policy(tmp_path / "vla")
    assert isinstance(back, FlowVLAPolicy) and back.cfg == pol.cfg and back.cfg.vocab == build_vocab(TASKS)
    assert torch.equal(back.action_std, pol.action_std) and torch.equal(back.action_mean, pol.action_mean)
    assert back._state_normalizer().count.item() == 500
    torch.testing.assert_close(back._state_normalizer().var, torch.tensor(_stats()[keys.OBS_STATE]["std"]) ** 2)
    frame = {k: v for k, v in _batch(3, uint8=True).items() if k != keys.ACTION_COL}
    noise = torch.randn(3, 4, 6)
    assert torch.equal(back.act(frame, noise=noise), pol.act(frame, noise=noise))
    # (loadable without training code: policies/ imports nothing of robot_rl, tests/test_import_direction.py)


def test_a_config_saved_before_fine_keypoints_and_sample_means_loads_without_them(tmp_path):
    pol = _policy(fine_keypoints=False, mean_of_samples=1, conv_channels=[8, 8, 16], conv_strides=[2, 2, 2]).eval()
    pol.save(tmp_path / "vla")
    cfg_file = tmp_path / "vla" / "config.json"
    raw = json.loads(cfg_file.read_text())
    del raw["fine_keypoints"], raw["mean_of_samples"]  # as written before the options existed
    cfg_file.write_text(json.dumps(raw))
    back = load_policy(tmp_path / "vla")
    assert back.cfg.fine_keypoints is False and FlowVLAConfig().fine_keypoints is True
    assert back.cfg.mean_of_samples == 1 and FlowVLAConfig().mean_of_samples > 1
    frame = {k: v for k, v in _batch(2, uint8=True).items() if k != keys.ACTION_COL}
    noise = torch.randn(2, 4, 6)
    assert torch.equal(back.act(frame, noise=noise), pol.act(frame, noise=noise))
    assert torch.equal(back.act(frame), pol.act(frame))  # one chunk from eps*, as such a policy was evaluated


def test_runs_through_an_action_queue_with_task_strings():
    pol = _policy().eval()
    frame = {k: v for k, v in _batch(3, uint8=True).items() if k not in (keys.ACTION_COL, keys.ACTION_IS_PAD,
                                                                          CONDITION_KEY)}
    for ensemble in (None, 0.01):
        q = ActionQueue(pol, num_envs=3, action_dim=6, temporal_ensemble=ensemble,
                        query_every=None if ensemble is None else 1)
        first = q(frame)
        assert first.shape == (3, 6) and torch.isfinite(first).all()
        torch.testing.assert_close(first, pol.act(frame)[:, 0])
        q.reset(torch.tensor([1]))
        assert q.due().tolist() == ([1] if ensemble is None else [0, 1, 2])
        assert torch.isfinite(q(frame)).all()
    assert math.isclose(float(pol.action_std[0]), 22.0)


def test_temporal_ensembling_per_task_is_saved_with_the_policy_checked_and_set(tmp_path):
    from policies.execution import set_temporal_ensemble
    from policies.gaussian import GaussianPolicy, GaussianPolicyConfig

    pol = _policy(temporal_ensemble=0.01, temporal_ensemble_by_task={"Pick up the red cube.": None,
                                                                     "pick up the green cube": 0.5})
    pol.eval().save(tmp_path / "vla")
    back = load_policy(tmp_path / "vla")
    assert back.temporal_ensemble == 0.01
    assert back.temporal_ensemble_for("pick up the  RED cube") is None  # matched as executed_steps_by_task
    assert back.temporal_ensemble_for("pick up the green cube") == 0.5
    assert back.temporal_ensemble_for("pick up the blue cube") == 0.01 and back.temporal_ensemble_for(None) == 0.01
    assert _policy().temporal_ensemble_for("pick up the red cube") is None  # the default: the queue
    set_temporal_ensemble(back, None)  # one value for every task: the map gives way
    assert back.temporal_ensemble_for("pick up the green cube") is None and back.cfg.temporal_ensemble_by_task == {}
    set_temporal_ensemble(back, 0.5)
    assert back.temporal_ensemble_for("pick up the red cube") == 0.5
    for bad in ({"temporal_ensemble": float("nan")}, {"temporal_ensemble": True}, {"temporal_ensemble": "0.01"},
                {"temporal_ensemble_by_task": {"pick up the red cube": math.inf}}):
        with pytest.raises(ValueError, match="must be a finite number or None"):
            FlowVLAConfig(**bad)
    with pytest.raises(ValueError, match="for chunking policies"):
        set_temporal_ensemble(GaussianPolicy(GaussianPolicyConfig(obs_dim=3, action_dim=2)), 0.01)


def test_executed_steps_per_task_are_matched_by_normalised_instruction_and_saved(tmp_path):
    pol = _policy(executed_steps=2, executed_steps_by_task={"Pick up the red cube.": 4})
    assert pol.executed_steps_for("pick up the  RED cube") == 4  # case, spacing and the full stop do not matter
    assert pol.executed_steps_for("pick up the blue cube") == 2  # not in the map: executed_steps
    assert pol.executed_steps_for(None) == 2
    pol.eval().save(tmp_path / "vla")
    back = load_policy(tmp_path / "vla")
    assert back.cfg.executed_steps_by_task == {"Pick up the red cube.": 4}
    assert back.executed_steps_for("pick up the red cube") == 4
    frame = {k: v for k, v in _batch(2, uint8=True).items() if k not in (keys.ACTION_COL, keys.ACTION_IS_PAD,
                                                                          CONDITION_KEY)}
    q = ActionQueue(back, num_envs=2, action_dim=6)  # env 0 red (4 steps per chunk), env 1 blue (2)
    asked = []
    for _ in range(4):
        asked.append(q.due().tolist())
        q(frame)
    assert asked == [[0, 1], [], [1], []]
    with pytest.raises(ValueError, match=r"executed_steps_by_task: instruction -> an int in \[1, horizon 4\]"):
        _tiny_cfg(executed_steps_by_task={"pick up the red cube": 5})


# ---------------------------------------------------------------------------------------------- bf16 training
@pytest.mark.skipif(not native_bf16(torch.device("cpu")), reason="this CPU computes bf16 only by emulation")
def test_bf16_updates_run_the_convs_in_bf16_keep_keypoints_and_weights_float32_and_learn():
    batch = _batch(8)
    pol = _policy(random_shift=0)
    algo = BC(pol, BCConfig(learning_rate=2e-3, bf16=True))
    seen = {}
    enc = pol.model.images[CAMS[0]]
    enc.convs[0].register_forward_hook(lambda m, i, o: seen.__setitem__("conv", o.dtype))
    enc.keypoints.register_forward_hook(lambda m, i, o: seen.__setitem__("keypoints", o.dtype))
    eval_loss = _fixed_eval_loss(pol, batch)
    before = eval_loss()
    assert seen == {"conv": torch.float32, "keypoints": torch.float32}  # evaluation stays float32
    pol.train()
    for _ in range(200):
        out = algo.update(batch)
    assert seen == {"conv": torch.bfloat16, "keypoints": torch.float32}
    assert all(p.dtype == torch.float32 for p in pol.parameters()) and math.isfinite(out["loss"])
    after = eval_loss()
    assert before > 1.0 and after < 0.2 * before, (before, after)


def test_bf16_is_refused_where_the_hardware_would_emulate_it(monkeypatch):
    from robot_rl.algos import precision

    monkeypatch.setattr(precision, "native_bf16", lambda device: False)  # a CPU without AVX512-BF16 / AMX (this one has it)
    with pytest.raises(ValueError, match="no native bf16"):
        BC(_policy(), BCConfig(bf16=True))
    BC(_policy(), BCConfig(bf16=False))


def test_state_noise_perturbs_the_normalised_state_in_training_only(monkeypatch):
    pol = _policy(random_shift=0, state_noise=0.5)
    seen: list[torch.Tensor] = []
    encode = pol.model.encode
    monkeypatch.setattr(pol.model, "encode", lambda images, tokens, state: seen.append(state) or
                        encode(images, tokens, state))
    batch = _batch(4096)
    batch = {**batch, keys.ACTION_COL: batch[keys.ACTION_COL][:, :4]}
    exact = (batch[keys.OBS_STATE] - torch.tensor(_stats()[keys.OBS_STATE]["mean"])) / torch.tensor(
        _stats()[keys.OBS_STATE]["std"])
    pol.train()
    pol.loss(batch)
    noise = seen[-1] - exact
    assert noise.std().item() == pytest.approx(0.5, rel=0.03)  # 24,576 draws: the std is within ~1 %
    assert noise.mean().abs().item() < 0.02
    pol.eval()
    pol.loss(batch)
    torch.testing.assert_close(seen[-1], exact, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="state_noise"):
        _tiny_cfg(state_noise=-0.1)


def test_color_jitter_by_hand_and_only_in_training():
    img = torch.tensor([[[0.2, 0.6]], [[0.4, 0.4]], [[0.0, 1.0]]]).unsqueeze(0) * 2 - 1  # [1, 3, 1, 2], from [0, 1]
    assert torch.equal(color_jitter(img, 0.0), img)
    out = color_jitter(img, 0.2, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    b, s, c = (1 + 0.2 * (2 * torch.rand(1, generator=g).item() - 1) for _ in range(3))
    gains = 1 + 0.1 * (2 * torch.rand(3, generator=g) - 1)
    x = [[0.2 * b, 0.6 * b], [0.4 * b, 0.4 * b], [0.0, 1.0 * b]]  # channel, pixel after brightness
    lum = [0.299 * x[0][j] + 0.587 * x[1][j] + 0.114 * x[2][j] for j in range(2)]
    m = sum(lum) / 2
    want = torch.tensor([[[min(1.0, max(0.0, gains[ch].item() * (m + c * (lum[j] + s * (x[ch][j] - lum[j]) - m))))
                           for j in range(2)]] for ch in range(3)]).unsqueeze(0) * 2 - 1
    torch.testing.assert_close(out, want)
    grey = torch.full((64, 3, 4, 4), 0.0)  # mid-grey: saturation and contrast leave it, brightness and gains move it
    moved = (color_jitter(grey, 0.3) + 1) / 2
    assert moved.min() >= 0.5 * 0.7 * 0.85 - 1e-6 and moved.max() <= 0.5 * 1.3 * 1.15 + 1e-6
    assert moved.std(dim=0).mean() > 0.02  # drawn per image
    assert torch.allclose(moved, moved[:, :, :1, :1].expand_as(moved))  # one gain per channel: geometry untouched

    pol = _policy(random_shift=0, color_jitter=0.3)
    batch = _batch(8)
    pol.eval()
    torch.testing.assert_close(pol._encode(batch), pol._encode(batch))
    pol.train()
    assert not torch.allclose(pol._encode(batch, augment=True), pol._encode(batch, augment=True))
    with pytest.raises(ValueError, match="color_jitter"):
        _tiny_cfg(color_jitter=1.0)


def test_indicator_values_processor_and_task_strings_are_read_as_documented():
    """A float indicator is positive above 0.5 only (0.5 itself is negative); one instruction string serves the whole
    batch; a processor that does not fit the config (other inputs or action size) is refused; a training task of
    exactly max_words is accepted, one word more refused; no pad mask means no padded steps."""
    pol = _policy(conditioning=True, cond_dropout=0.0).eval()
    _let_the_condition_act(pol)
    batch = _batch(4)
    noise, time = torch.randn(4, 4, 6), torch.full((4,), 0.5)

    def loss(indicator, **kw) -> float:
        return pol.loss({**batch, CONDITION_KEY: indicator, **kw}, noise=noise, time=time)[1]["loss"]

    negative, positive = loss(torch.zeros(4, dtype=torch.bool)), loss(torch.ones(4, dtype=torch.bool))
    assert negative != positive
    assert loss(torch.full((4,), 0.5)) == negative and loss(torch.full((4,), 0.3)) == negative
    assert loss(torch.full((4,), 0.7)) == positive
    same = {**batch, keys.TASK: [TASKS[0]] * 4}
    assert loss(torch.zeros(4, dtype=torch.bool), **{keys.TASK: TASKS[0]}) == \
        pol.loss({**same, CONDITION_KEY: torch.zeros(4, dtype=torch.bool)}, noise=noise, time=time)[1]["loss"]
    assert pol.loss({k: v for k, v in batch.items() if k != keys.ACTION_IS_PAD})[1]["pad_fraction"] == 0.0
    other_action = FlowVLAPolicy(_tiny_cfg(action_dim=5)).processor
    other_inputs = FlowVLAPolicy(_tiny_cfg(cameras=["front"])).processor
    for processor in (other_action, other_inputs):
        with pytest.raises(ValueError, match="do not fit the config"):
            FlowVLAPolicy(_tiny_cfg(), processor)
    FlowVLAPolicy.from_stats(_stats(), TASKS, _tiny_cfg(max_words=5))  # "pick up the red cube": 5 words
    with pytest.raises(ValueError, match="a training task has 5 words, more than max_words=4"):
        FlowVLAPolicy.from_stats(_stats(), TASKS, _tiny_cfg(max_words=4))


def test_a_joint_that_never_moved_has_std_zero_and_trains_a_negative_std_is_refused():
    """Demos where a joint stays put (so101_reach's scripted gripper: std 0.004 deg) are accepted: the action std is
    floored at cfg.action_std_min and the state std at cfg.state_std_min (1 deg), so a real arm's one-tick jitter on
    that joint (0.088 deg) is 0.088 std of input, not 22 std clipped at 10; a negative std is a broken file."""
    stats = _stats()
    stats[keys.ACTION_COL] = {**stats[keys.ACTION_COL], "std": [22.0, 31, 29, 24, 61, 0.0]}
    stats[keys.OBS_STATE] = {**stats[keys.OBS_STATE], "std": [20.0, 30, 30, 25, 60, 0.004]}
    pol = FlowVLAPolicy.from_stats(stats, TASKS, _tiny_cfg())
    assert float(pol.action_std[5]) == pytest.approx(pol.cfg.action_std_min) and pol.cfg.action_std_min > 0
    mean = torch.tensor(stats[keys.OBS_STATE]["mean"])
    jitter = mean + torch.tensor([0.0, 0, 0, 0, 0, 0.088])  # one STS3215 tick on the gripper
    obs = {**{k: v for k, v in _batch(1).items() if k.startswith("observation.images")}, keys.OBS_STATE: jitter[None]}
    normalised = pol.processor(obs)[keys.OBS_STATE][0]
    torch.testing.assert_close(normalised, torch.tensor([0.0, 0, 0, 0, 0, 0.088]), atol=1e-5, rtol=0)
    unfloored = FlowVLAPolicy.from_stats(stats, TASKS, _tiny_cfg(state_std_min=1e-6))
    assert float(unfloored.processor(obs)[keys.OBS_STATE][0, 5]) == 10.0  # 22 std, clipped at 10
    with pytest.raises(ValueError, match="state_std_min and action_std_min must be > 0"):
        _tiny_cfg(state_std_min=0.0)
    for feature in (keys.OBS_STATE, keys.ACTION_COL):
        bad = {**stats, feature: {**stats[feature], "std": [1.0] * 5 + [-1.0]}}
        with pytest.raises(ValueError, match=f"dataset statistic {feature}.std is negative"):
            FlowVLAPolicy.from_stats(bad, TASKS, _tiny_cfg())
