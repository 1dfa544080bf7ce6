"""The distributional value model: its target distributions and mean against hand-computed numbers, and a tiny model
that fits targets and saves/loads exactly."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from policies import keys
from robot_rl.algos.precision import native_bf16
from robot_rl.algos.value_learning import ValueLearner, ValueTrainConfig, load_value_model, save_value_model
from robot_rl.models.value import ValueConfig, ValueModel, bin_centers, expected_value, hl_gauss, two_hot


def test_201_bins_on_minus_one_to_zero():
    c = bin_centers(201, -1.0, 0.0)
    assert len(c) == 201 and float(c[0]) == -1.0 and float(c[-1]) == 0.0
    assert math.isclose(float(c[1] - c[0]), 0.005, rel_tol=1e-5)


def test_two_hot_by_hand():
    c = torch.tensor([-1.0, -0.5, 0.0])
    out = two_hot(torch.tensor([-0.5, -0.875, 0.0, -2.0]), c)
    # -0.5 is a centre; -0.875 lies 1/4 of the way from -1 to -0.5; 0 the last centre; -2 clips to -1
    torch.testing.assert_close(out, torch.tensor([[0.0, 1.0, 0.0], [0.75, 0.25, 0.0], [0.0, 0.0, 1.0],
                                                  [1.0, 0.0, 0.0]]))


def test_hl_gauss_by_hand():
    c = torch.tensor([-1.0, -0.5, 0.0])  # width 0.5, edges -1.25, -0.75, -0.25, 0.25
    out = hl_gauss(torch.tensor([-0.5]), c, sigma=0.25)
    # Φ(-1) - Φ(-3) = 0.157305, Φ(1) - Φ(-1) = 0.682689, Φ(3) - Φ(1) = 0.157305; over Φ(3) - Φ(-3) = 0.997300
    torch.testing.assert_close(out, torch.tensor([[0.157731, 0.684538, 0.157731]]), atol=1e-5, rtol=0)
    wide = hl_gauss(torch.tensor([-0.3, -0.999]), bin_centers(201, -1.0, 0.0), sigma=0.00375)
    torch.testing.assert_close(wide.sum(-1), torch.ones(2))
    assert int(wide[0].argmax()) == 140  # -0.3 is centre 140


def test_expected_value_is_the_mean_of_the_distribution():
    c = torch.tensor([-1.0, -0.5, 0.0])
    assert float(expected_value(torch.zeros(1, 3), c)) == pytest.approx(-0.5)
    logits = torch.log(torch.tensor([[0.2, 0.3, 0.5]]))
    assert float(expected_value(logits, c)) == pytest.approx(-0.2 - 0.15)


def _tiny(loss: str = "hl_gauss") -> ValueModel:
    cfg = ValueConfig(cameras=["front"], image_size=[16, 16], conv_channels=[8, 8], conv_strides=[2, 2],
                      image_feature_dim=16, text_dim=8, hidden_dim=32, loss=loss, random_shift=0,
                      state_lags=[])  # the current frame only (test_state_lags_... reads lags)
    stats = {keys.OBS_STATE: {"mean": torch.zeros(6), "std": torch.ones(6) * 10}}
    return ValueModel.from_stats(stats, ["lift the cube", "push the cube"], cfg)


def _frames(n: int) -> dict:
    g = torch.Generator().manual_seed(0)
    return {keys.OBS_STATE: torch.randn(n, 6, generator=g) * 10, keys.TASK: ["lift the cube", "push the cube"] * (n // 2),
            keys.lerobot_image_key("front"): torch.rand(n, 3, 16, 16, generator=g)}


@pytest.mark.parametrize("loss", ["hl_gauss", "two_hot"])
def test_a_tiny_model_fits_targets(loss):
    torch.manual_seed(0)
    model = _tiny(loss)
    frames, target = _frames(8), torch.linspace(-1.0, 0.0, 8)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = float((model.value(frames) - target).abs().mean())
    for _ in range(150):
        loss_value, _ = model.loss(frames, target)
        opt.zero_grad()
        loss_value.backward()
        opt.step()
    err = float((model.value(frames) - target).abs().mean())
    assert err < 0.05 < first, (first, err)
    v = model.value(frames)
    assert v.shape == (8,) and bool(((v >= -1) & (v <= 0)).all())


def test_random_shift_only_in_training():
    model = _tiny()
    model.cfg.random_shift = 2
    frames = _frames(4)
    torch.testing.assert_close(model.eval()(frames), model(frames))  # eval: deterministic
    torch.manual_seed(0)
    assert not torch.equal(model.train()(frames), model(frames))  # training: shifted images


def test_save_and_load_give_the_same_values(tmp_path):
    model = _tiny()
    frames = _frames(4)
    save_value_model(model, tmp_path / "value", {"note": "test"})
    loaded, meta = load_value_model(tmp_path / "value")
    assert meta["note"] == "test" and loaded.cfg == model.cfg
    torch.testing.assert_close(loaded.value(frames), model.eval().value(frames))


def test_bad_frames_are_named():
    model = _tiny()
    frames = _frames(4)
    del frames[keys.lerobot_image_key("front")]
    with pytest.raises(ValueError, match="observation.images.front"):
        model.value(frames)
    with pytest.raises(ValueError, match="loss"):
        ValueConfig(loss="mse")


@pytest.mark.skipif(not native_bf16(torch.device("cpu")), reason="this CPU computes bf16 only by emulation")
def test_the_value_learner_in_bf16_runs_its_convs_in_bf16_and_still_fits():
    torch.manual_seed(0)
    model = _tiny()
    seen = {}
    model.images["front"].convs[0].register_forward_hook(lambda m, i, o: seen.__setitem__("conv", o.dtype))
    learner = ValueLearner(model, ValueTrainConfig(learning_rate=3e-3, bf16=True))
    frames, target = _frames(8), torch.linspace(-1.0, 0.0, 8)
    first = float((model.value(frames) - target).abs().mean())
    for _ in range(150):
        learner.update(frames, target)
    assert seen["conv"] == torch.bfloat16 and all(p.dtype == torch.float32 for p in model.parameters())
    err = float((model.value(frames) - target).abs().mean())
    assert err < 0.05 < first, (first, err)


def test_the_target_distribution_is_the_configured_loss():
    y = torch.tensor([-0.3, -0.9975, 0.0])
    torch.testing.assert_close(_tiny("two_hot").target_distribution(y), two_hot(y, bin_centers(201, -1.0, 0.0)))
    torch.testing.assert_close(_tiny("hl_gauss").target_distribution(y),
                               hl_gauss(y, bin_centers(201, -1.0, 0.0), sigma=0.75 * 0.005))


def test_the_state_is_normalised_by_the_datasets_statistics():
    """from_stats' mean and std are applied to the state (a std below 1 degree floored there, ValueConfig.state_std_min):
    the model on x equals the same weights with identity statistics on (x - mean) / std."""
    mean, std = torch.arange(6.0) * 10, torch.tensor([5.0, 0.0, 2.0, 1.0, 0.5, 20.0])
    cfg = _tiny().cfg
    model = ValueModel.from_stats({keys.OBS_STATE: {"mean": mean, "std": std}}, ["lift the cube", "push the cube"],
                                  cfg).eval()
    plain = ValueModel(model.cfg).eval()
    plain.load_state_dict({**model.state_dict(), "state_mean": torch.zeros(6), "state_std": torch.ones(6)})
    frames = _frames(4)
    shifted = {**frames, keys.OBS_STATE: (frames[keys.OBS_STATE] - mean) / std.clamp_min(1.0)}
    torch.testing.assert_close(model(frames), plain(shifted))
    assert not torch.allclose(model(frames), plain(frames))


def test_value_inputs_and_config_are_checked_at_their_bounds():
    model = _tiny().eval()
    frames = _frames(4)
    one_task = {**frames, keys.TASK: "lift the cube"}  # one instruction for every frame
    torch.testing.assert_close(model.value(one_task), model.value({**frames, keys.TASK: ["lift the cube"] * 4}))
    with pytest.raises(ValueError, match="holds 3 instructions for 4 frames"):
        model.value({**frames, keys.TASK: ["lift the cube"] * 3})
    for state in (torch.zeros(4, 5), torch.zeros(6)):
        with pytest.raises(ValueError, match=r"observation.state has shape .*reads \[B, 6\]"):
            model.value({**frames, keys.OBS_STATE: state})
    stats = {keys.OBS_STATE: {"mean": torch.zeros(6), "std": torch.ones(6)}}
    cfg = dataclasses.replace(model.cfg, max_words=3)
    ValueModel.from_stats(stats, ["lift the cube"], cfg)  # exactly max_words
    with pytest.raises(ValueError, match="a task has 4 words, more than value max_words=3"):
        ValueModel.from_stats(stats, ["lift the red cube"], cfg)
    for bad in ({"mean": torch.zeros(5), "std": torch.ones(6)}, {"mean": torch.zeros(6), "std": torch.ones(5)}):
        with pytest.raises(ValueError, match="state statistics have"):
            ValueModel.from_stats({keys.OBS_STATE: bad}, ["lift the cube"], cfg)
    ValueConfig(num_bins=2, random_shift=0, sigma_ratio=1e-3)  # the bounds themselves
    for kw, match in (({"num_bins": 1}, "num_bins must be >= 2"), ({"v_min": 0.0}, "v_min < v_max"),
                      ({"random_shift": -1}, "random_shift must be >= 0"), ({"sigma_ratio": 0.0}, "sigma_ratio"),
                      ({"conv_channels": [8]}, "same, non-zero length"),
                      ({"conv_channels": [], "conv_strides": []}, "same, non-zero length"),
                      ({"cameras": []}, "at least one camera")):
        with pytest.raises(ValueError, match=match):
            ValueConfig(**kw)


def test_the_loss_is_the_cross_entropy_to_the_target_distribution_by_hand():
    model = _tiny().eval()
    frames, target = _frames(4), torch.tensor([-0.1, -0.5, -0.75, -1.0])
    ce, stats = model.loss(frames, target)
    logits = model(frames)
    want = -(model.target_distribution(target) * torch.log_softmax(logits, -1)).sum(-1).mean()
    torch.testing.assert_close(ce, want)
    assert stats["loss/value_ce"] == pytest.approx(float(want.detach()), rel=1e-6)
    assert stats["value/mae"] == pytest.approx(float((model.value(frames) - target).abs().mean()), rel=1e-5)


def test_state_lags_are_read_normalised_beside_the_state():
    """With state_lags the head also reads the joints L frames back, normalised as the state: the model equals the
    same weights with identity statistics on normalised inputs, a frame without them (or of another shape) is refused
    naming the key, and a model without lags ignores the key."""
    cfg = dataclasses.replace(_tiny().cfg, state_lags=[2, 5])
    mean, std = torch.arange(6.0), torch.full((6,), 4.0)
    model = ValueModel.from_stats({keys.OBS_STATE: {"mean": mean, "std": std}}, ["lift the cube", "push the cube"],
                                  cfg).eval()
    assert model.head[0].in_features == 16 + 8 + 6 * 3
    frames = _frames(4)
    lags = torch.randn(4, 2, 6, generator=torch.Generator().manual_seed(1)) * 10
    with_lags = {**frames, keys.OBS_STATE_LAGS: lags}
    plain = ValueModel(model.cfg).eval()
    plain.load_state_dict({**model.state_dict(), "state_mean": torch.zeros(6), "state_std": torch.ones(6)})
    normalised = {**frames, keys.OBS_STATE: (frames[keys.OBS_STATE] - mean) / std,
                  keys.OBS_STATE_LAGS: (lags - mean) / std}
    torch.testing.assert_close(model(with_lags), plain(normalised))
    assert not torch.allclose(model(with_lags), model({**with_lags, keys.OBS_STATE_LAGS: lags.flip(1)}))
    with pytest.raises(ValueError, match=r"reads 'observation.state_lags' \(the joints \[2, 5\] frames back"):
        model(frames)
    for shape in ((4, 1, 6), (4, 2, 5), (3, 2, 6)):
        with pytest.raises(ValueError, match=r"observation.state_lags has shape .*reads \[B, 2, 6\]"):
            model({**frames, keys.OBS_STATE_LAGS: torch.zeros(shape)})
    lagless = _tiny().eval()
    torch.testing.assert_close(lagless({**frames, keys.OBS_STATE_LAGS: lags}), lagless(frames))
    ValueConfig(state_lags=[1])
    for bad in ([0], [3, -1], [2, 2]):
        with pytest.raises(ValueError, match="state_lags must be distinct frames back"):
            ValueConfig(state_lags=bad)


def test_value_and_features_give_the_value_and_the_heads_last_hidden_layer():
    """The recovery memory's key: the head's last hidden layer, from which the value follows (the same numbers as
    ``value``)."""
    model = _tiny().eval()
    frames = _frames(6)
    v, feats = model.value_and_features(frames)
    assert torch.equal(v, model.value(frames))
    assert feats.shape == (6, model.cfg.hidden_dim)
    with torch.no_grad():
        assert torch.equal(model.head[-1](feats), model(frames))
