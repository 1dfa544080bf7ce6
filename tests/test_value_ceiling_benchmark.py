"""benchmarks/value_ceiling.py's scoring: VOC split into the held-out set's expert episodes and degraded successes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.value_ceiling import (
    N_EXPERT_HELDOUT,
    image_model_scores,
    predict,
    scores,
    split_validation,
    train_value,
)


def _held(lengths: list[int], succeeded: list[bool]) -> dict[str, np.ndarray]:
    eps = np.concatenate([np.full(n, e) for e, n in enumerate(lengths)])
    frames = np.concatenate([np.arange(n) for n in lengths])
    success = np.concatenate([np.arange(n) == n - 1 if ok else np.zeros(n, bool) for n, ok in zip(lengths, succeeded)])
    return {"episode_index": eps, "frame_index": frames, "success": success}


def test_scores_split_expert_and_degraded_successes():
    n = N_EXPERT_HELDOUT + 2  # the expert's episodes, then a degraded success and a degraded failure
    held = _held([4] * n, [True] * (n - 1) + [False])
    values = held["frame_index"].astype(float)  # rising everywhere: VOC 1 ...
    drop = held["episode_index"] == N_EXPERT_HELDOUT
    values[drop] = np.array([0.0, 2.0, 1.0, 3.0])  # ... except the degraded success, which drops once: ρ = 0.8
    r = scores(values, held)
    assert r["voc_expert"] == pytest.approx(1.0)
    assert r["voc_degraded_successes"] == pytest.approx(0.8)  # 1 - 6 Σd² / (n (n² - 1)) = 1 - 6·2/60
    assert r["voc"] == pytest.approx((N_EXPERT_HELDOUT * 1.0 + 0.8) / (N_EXPERT_HELDOUT + 1))
    assert r["successful_episodes"] == N_EXPERT_HELDOUT + 1  # the failure is not scored


def test_image_model_scores_split_the_same_way(tmp_path):
    per = {str(e): 0.9 for e in range(N_EXPERT_HELDOUT)} | {str(N_EXPERT_HELDOUT): 0.5, str(N_EXPERT_HELDOUT + 1): 0.3}
    path = tmp_path / "recap.json"
    path.write_text(json.dumps({"value_heldout_runs": {"m_s0": {"voc": 0.8, "success_auc": 0.6, "per_episode": per}}}))
    r = image_model_scores(path)["m_s0"]
    assert r["voc_expert"] == pytest.approx(0.9) and r["voc_degraded_successes"] == pytest.approx(0.4)
    assert image_model_scores(tmp_path / "missing.json") == {}


def test_state_value_learns_a_monotone_target():
    """The MLP with recap's HL-Gauss head fits V = -(1 - s) on [-1, 0] from s alone."""
    s = np.linspace(0, 1, 200, dtype=np.float32)[:, None]
    model, info = train_value(s, -(1.0 - s[:, 0]), steps=400, seed=0, batch=64)
    v = predict(model, s)
    assert np.abs(v - (-(1.0 - s[:, 0]))).mean() < 0.05
    assert "chosen_step" not in info  # no validation set: the last step


def test_early_stopping_keeps_the_best_validation_step():
    """Validation episodes are every tenth training episode; the model returned is the one of the best VOC seen."""
    held = _held([5] * 20, [True] * 20)
    fit, val = split_validation(held)
    assert sorted(set(held["episode_index"][val].tolist())) == [9, 19] and fit.sum() == 90
    x = held["frame_index"][:, None].astype(np.float32)
    y = -(4 - held["frame_index"]).astype(np.float32) / 150
    vcols = {k: v[val] for k, v in held.items()}
    model, info = train_value(x[fit], y[fit], steps=300, seed=0, batch=32, val=(x[val], vcols), every=100)
    assert [s for s, _ in info["validation_curve"]] == [100, 200, 300]
    best = max(info["validation_curve"], key=lambda c: c[1])
    assert info["chosen_step"] == best[0] and info["validation_voc"] == best[1]
    assert scores(predict(model, x[val]), vcols)["voc"] == pytest.approx(best[1], abs=1e-4)  # that model, restored


def test_recap_stage_needs_the_scaled_image_model_first(tmp_path):
    import argparse

    from benchmarks.value_ceiling import recap_with_scaled_value

    a = argparse.Namespace(compare=tmp_path / "recap" / "heldout", work=tmp_path / "vc", scale=5,
                           recap_value_steps=12000, recap_steps=3000, num_envs=25)
    with pytest.raises(SystemExit, match=r"image_value_train_5x_12000.*--image-value-steps 12000"):
        recap_with_scaled_value(a)
    assert not (tmp_path / "vc").exists()  # nothing trained or written
