"""RECAP's and AWR's pieces: VOC and success AUC on hand-made sequences, AWR's sampling weights, and the sampler that
hands the indicator to the policy (classifier-free guidance's v_u + β(v_c − v_u) is tested by hand in
tests/test_flow_vla.py::test_classifier_free_guidance_by_hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from policies.flow_vla import CONDITION_KEY
from robot_rl.algos.awr import AWRConfig, awr_weights
from robot_rl.algos.recap import ConditionedSampler, RecapConfig, indicator_weights
from robot_rl.data.lerobot_loader import ChunkDatasetConfig, ChunkSampler
from robot_rl.models.voc import average_ranks, spearman, success_auc, value_order_correlation
from tests.test_lerobot_loader import make_dataset


def test_spearman_and_voc_on_hand_made_sequences():
    np.testing.assert_array_equal(average_ranks(np.array([0.0, 0.0, 1.0])), [1.5, 1.5, 3.0])
    assert spearman([0.1, 0.2, 0.3], [0, 1, 2]) == pytest.approx(1.0)
    assert spearman([0.3, 0.2, 0.1], [0, 1, 2]) == pytest.approx(-1.0)
    # ranks [1.5, 1.5, 3] vs [1, 2, 3]: centred [-.5, -.5, 1] . [-1, 0, 1] = 1.5, over sqrt(1.5 * 2)
    assert spearman([0.0, 0.0, 1.0], [0, 1, 2]) == pytest.approx(1.5 / math.sqrt(3.0))
    assert math.isnan(spearman([1.0, 1.0], [0, 1]))
    assert spearman([1.0, 2.0], [0, 1]) == pytest.approx(1.0) and math.isnan(spearman([1.0], [0]))  # n = 2 is enough
    values = np.array([-0.3, -0.2, -0.1, -0.1, -0.2, -0.3, -0.9, -0.8])
    eps = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    frames = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    ok = np.array([1, 1, 1, 1, 1, 1, 0, 0], bool)  # episode 2 failed: left out
    voc, per = value_order_correlation(values, eps, frames, ok)
    assert per == {0: pytest.approx(1.0), 1: pytest.approx(-1.0)} and voc == pytest.approx(0.0)


def test_success_auc_by_hand():
    # pairs (0.9 > 0.5), (0.9 > 0.4), (0.4 < 0.5), (0.4 = 0.4): (1 + 1 + 0 + 0.5) / 4
    assert success_auc([0.9, 0.4, 0.5, 0.4], [1, 1, 0, 0]) == pytest.approx(0.625)
    assert success_auc([0.9, 0.8, 0.1], [1, 1, 0]) == 1.0
    assert math.isnan(success_auc([0.1, 0.2], [1, 1]))


def test_awr_weights_favour_high_advantages_and_interventions():
    adv = np.array([-1.0, 0.0, 1.0, 0.0])  # median 0, std sqrt(0.5)
    w = awr_weights(adv, AWRConfig(temperature=1.0, max_weight=3.0))
    z = 1.0 / math.sqrt(0.5)
    np.testing.assert_allclose(w.numpy(), [math.exp(-z), 1.0, 3.0, 1.0])  # exp(z) = 4.1 capped at 3
    w = awr_weights(adv, AWRConfig(max_weight=3.0), intervention=np.array([1, 0, 0, 0], bool))
    assert float(w[0]) == 3.0
    np.testing.assert_array_equal(awr_weights(np.zeros(3), AWRConfig()).numpy(), [1.0, 1.0, 1.0])
    # advantages on a small scale (std 0.1118 < 1), median 0.15 between two frames, at temperature 1 and 0.5
    small = np.array([0.0, 0.1, 0.2, 0.3])
    np.testing.assert_allclose(awr_weights(small, AWRConfig()).numpy(), [0.261416, 0.639407, 1.563948, 3.825315],
                               rtol=1e-5)
    np.testing.assert_allclose(awr_weights(small, AWRConfig(temperature=0.5, max_weight=1.0)).numpy(),
                               [0.068339, 0.408842, 1.0, 1.0], rtol=1e-5)  # max_weight 1: nothing above the median
    for bad in ({"temperature": 0.0}, {"max_weight": 0.99}):
        with pytest.raises(ValueError, match="temperature must be > 0 and max_weight >= 1"):
            AWRConfig(**bad)


def test_outcome_columns_read_the_intervention_column_where_any_dataset_has_it():
    from types import SimpleNamespace

    from robot_rl.data.labels import LabelConfig
    from robot_rl.data.outcomes import outcome_columns

    def meta(*cols):  # the one attribute outcome_columns reads of a dataset's metadata
        return SimpleNamespace(features=dict.fromkeys(cols))

    both, demos = meta("next.success", "intervention"), meta("next.success")
    assert outcome_columns(both) == (["next.success", "intervention"], [])
    assert outcome_columns([both, both]) == (["next.success", "intervention"], [])  # every dataset has it
    assert outcome_columns([both, demos]) == (["next.success", "intervention"], ["intervention"])  # one may lack it
    assert outcome_columns([demos, demos]) == (["next.success"], [])
    named = LabelConfig(successful_episodes=[0])
    assert outcome_columns([demos], named) == ([], [])  # outcomes named by episode: no success column read


def test_indicator_weights_draw_positives_at_the_share_asked():
    w = indicator_weights(np.array([1, 0, 0, 0]), 0.5).numpy()
    np.testing.assert_allclose(w, [0.5, 1 / 6, 1 / 6, 1 / 6])  # 1 positive: 0.5; 3 negatives share 0.5
    w = indicator_weights(np.array([True, True, False, False, False]), 0.8).numpy()
    np.testing.assert_allclose(w, [0.4, 0.4, 0.2 / 3, 0.2 / 3, 0.2 / 3])
    np.testing.assert_allclose(indicator_weights(np.ones(4), 0.5).numpy(), [0.25] * 4)  # one class: uniform
    np.testing.assert_allclose(indicator_weights(np.zeros((3, 1)), 0.5).numpy(), [1 / 3] * 3)  # [F, 1] columns too
    assert indicator_weights(np.ones(1), 0.5).tolist() == [1.0] and len(indicator_weights(np.ones(0), 0.5)) == 0
    for bad in (1.0, 0.0, -0.5):  # the open interval (0, 1), or None
        with pytest.raises(ValueError, match="positive_share must be in"):
            RecapConfig(positive_share=bad)
    assert RecapConfig().positive_share is None and RecapConfig(positive_share=0.01).positive_share == 0.01


def test_conditioned_sampler_gives_each_frame_its_own_indicator(tmp_path):
    root = make_dataset(tmp_path / "ds")
    sampler = ChunkSampler(ChunkDatasetConfig(root=str(root), horizon=4, batch_size=8, progress=False,
                                              augment=False))
    ind = (sampler.indices["index"].numpy() % 3 == 0)  # a pattern tied to the frame's dataset index
    wrapped = ConditionedSampler(sampler, ind)
    assert wrapped.fingerprint() != sampler.fingerprint()  # the labels are part of what is trained on
    for _ in range(5):
        batch = wrapped.sample()
        expected = (batch["index"] % 3 == 0).float()
        torch.testing.assert_close(batch[CONDITION_KEY], expected)
    with pytest.raises(ValueError, match="indicators"):
        ConditionedSampler(sampler, ind[:-1])


def test_the_value_scores_of_a_labelled_dataset_by_hand():
    """What ``robot-rl offline algo=recap|awr`` reports of its value model: VOC over the successful episodes, the AUC
    of the first frame's value for success, the mean absolute error against the targets, episodes and successes."""
    from robot_rl.algos.advantages import value_scores
    from robot_rl.data.labels import Labels

    eps = np.array([0, 0, 0, 1, 1, 2, 2, 2])
    frame = np.array([0, 1, 2, 0, 1, 0, 1, 2])
    value = np.array([-0.6, -0.4, -0.5, -0.9, -0.1, -0.7, -0.8, -0.9])
    target = np.array([-0.3, -0.2, -0.1, -0.2, -0.1, -1.0, -1.0, -1.0])
    success = np.array([0, 0, 1, 0, 1, 0, 0, 0], dtype=bool)  # next.success: episodes 0 and 1 succeed at their end
    zeros = np.zeros(8)
    labels = Labels(index=np.arange(8), episode_index=eps, frame_index=frame, task_index=zeros, value_target=target,
                    reward=zeros, value=value, advantage=zeros, advantage_indicator=zeros.astype(bool),
                    intervention=zeros.astype(bool), thresholds={0: 0.0}, max_episode_length={0: 3})
    got = value_scores(labels, success[:, None])
    # VOC: Spearman of episode 0's values (ranks 1, 3, 2) with its frames: 1 - 6 * 2 / (3 * 8) = 0.5; episode 1: 1.0
    assert got["voc"] == pytest.approx(0.75)
    # first frames: successes -0.6 and -0.9 against the failure's -0.7: one of the two pairs ranked right
    assert got["success_auc"] == pytest.approx(0.5)
    assert got["value_mae"] == pytest.approx(2.2 / 8)  # |V - target|: 0.3 0.2 0.4 0.7 0 0.3 0.2 0.1
    assert (got["episodes"], got["successes"]) == (3, 2)


@pytest.mark.parametrize("bad,words", [({"steps": 0}, "steps, batch_size"), ({"batch_size": 0}, "steps, batch_size"),
                                       ({"eval_batch_size": 0}, "steps, batch_size"),
                                       ({"learning_rate": 0.0}, "learning_rate and max_grad_norm"),
                                       ({"max_grad_norm": 0.0}, "learning_rate and max_grad_norm")])
def test_value_training_settings_out_of_range_are_refused(bad, words):
    from robot_rl.algos.value_learning import ValueTrainConfig

    with pytest.raises(ValueError, match=f"value {words}"):
        ValueTrainConfig(**bad)
    ValueTrainConfig(steps=1, batch_size=1, eval_batch_size=1, learning_rate=1e-9, max_grad_norm=1e-9)  # the edges


def test_a_score_the_data_cannot_give_is_logged_with_the_reason_not_as_nan():
    """Every episode a success: success AUC is undefined, and the log says why instead of printing 'nan'."""
    from robot_rl.algos.advantages import _score

    assert _score(0.8766, "needs successes and failures") == "0.877"
    assert _score(float("nan"), "needs successes and failures") == "n/a (needs successes and failures)"
