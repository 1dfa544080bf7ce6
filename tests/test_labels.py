"""RECAP's labels against numbers worked out by hand on a two-episode set (M = 8 frames, so every number is exact in
binary): value targets, rewards, N-step advantages, per-task thresholds, the indicator with interventions forced
positive, and the sidecar round trip."""

from __future__ import annotations

import numpy as np
import pytest

from robot_rl.data.labels import (
    LabelConfig,
    compute_labels,
    corrections,
    episode_bounds,
    frame_scales,
    indicators,
    intervention_frames,
    max_length,
    n_step_advantages,
    read_sidecar,
    rewards,
    smooth_advantages,
    solved_frames,
    targets_for,
    task_scales,
    task_thresholds,
    value_targets,
    write_sidecar,
)

# episode 0: 4 frames, next.success first True at frame 2; episode 1: 3 frames, never succeeds
EPS = np.array([0, 0, 0, 0, 1, 1, 1])
SUCCESS = np.array([False, False, True, False, False, False, False])
TASKS = np.array([0, 0, 0, 0, 1, 1, 1])
M, C = 8, 2


def test_value_targets_by_hand():
    # success: -(2 - t)/8 up to the success frame, 0 after; failure: -(L - t + C)/8 = -(3 + 2)/8, -(2 + 2)/8, -(1 + 2)/8
    np.testing.assert_array_equal(value_targets(EPS, SUCCESS, M, C),
                                  [-0.25, -0.125, 0.0, 0.0, -0.625, -0.5, -0.375])
    # C = M (the default): every failed frame is clipped to -1
    np.testing.assert_array_equal(value_targets(EPS, SUCCESS, M)[4:], [-1.0, -1.0, -1.0])
    assert max_length(EPS, None) == 4 and max_length(EPS, 8) == 8


def test_rewards_sum_to_the_value_targets():
    r = rewards(EPS, SUCCESS, M, C)
    np.testing.assert_array_equal(r, [-0.125, -0.125, 0.0, 0.0, -0.125, -0.125, -0.375])
    _, end = episode_bounds(EPS)
    to_end = np.array([r[i:end[i] + 1].sum() for i in range(len(r))])
    np.testing.assert_array_equal(to_end, value_targets(EPS, SUCCESS, M, C))


def test_solved_frames_from_a_reward_column_or_a_list_of_episodes():
    # LeRobot's HIL-SERL recorder: next.reward 1.0 on the frame success is flagged, 0 elsewhere (here a 0.3 below the
    # threshold and a -1 penalty, neither a success)
    cols = {"episode_index": EPS, "next.success": SUCCESS,
            "next.reward": np.array([0.0, 0.25, 1.0, 0.0, -1.0, 0.0, 0.0], dtype=np.float32)}
    np.testing.assert_array_equal(solved_frames(cols, LabelConfig()), SUCCESS)
    np.testing.assert_array_equal(solved_frames(cols, LabelConfig(success_column="next.reward")), SUCCESS)
    at_threshold = LabelConfig(success_column="next.reward", success_threshold=0.25)  # solved at >= the threshold
    np.testing.assert_array_equal(solved_frames(cols, at_threshold), [False, True, True, False, False, False, False])
    # named episodes: each solved on its last frame, the others failed, whatever the columns say
    np.testing.assert_array_equal(solved_frames(cols, LabelConfig(successful_episodes=[1])),
                                  [False, False, False, False, False, False, True])
    np.testing.assert_array_equal(solved_frames(cols, LabelConfig(successful_episodes=[])), np.zeros(7, dtype=bool))
    np.testing.assert_array_equal(solved_frames(cols, LabelConfig(failed_episodes=[1])),  # the other way round
                                  [False, False, False, True, False, False, False])
    with pytest.raises(ValueError, match="not both"):
        LabelConfig(successful_episodes=[0], failed_episodes=[1])
    # an episode not among the frames (a split, the timing check) plays no part
    np.testing.assert_array_equal(solved_frames(cols, LabelConfig(successful_episodes=[0, 5])),
                                  solved_frames(cols, LabelConfig(successful_episodes=[0])))
    with pytest.raises(ValueError, match="'next.done'"):
        solved_frames(cols, LabelConfig(success_column="next.done"))
    with pytest.raises(ValueError, match="successful_episodes"):
        LabelConfig(successful_episodes=[-1])


def test_n_step_advantages_by_hand():
    r = rewards(EPS, SUCCESS, M, C)
    v = np.array([-0.5, -0.125, 0.0, 0.0, -0.75, -0.5, -0.25])
    # N = 2: A_0 = -0.125 - 0.125 + V_2 - V_0 = 0.25; A_1 = -0.125 + 0 + V_3 + 0.125 = 0; A_2 = 0 + 0 (past the
    # end: no bootstrap) - 0; A_3 = 0; A_4 = -0.25 + V_6 + 0.75 = 0.25; A_5 = -0.5 + 0 + 0.5 = 0; A_6 = -0.375 + 0.25
    np.testing.assert_array_equal(n_step_advantages(v, r, EPS, 2), [0.25, 0.0, 0.0, 0.0, 0.25, 0.0, -0.125])
    # N = 1 is the one-step TD error r_t + V_{t+1} - V_t
    np.testing.assert_array_equal(n_step_advantages(v, r, EPS, 1), [0.25, 0.0, 0.0, 0.0, 0.125, 0.125, -0.125])


def test_smoothed_advantages_by_hand():
    adv = np.array([0.25, 0.0, 0.0, 0.5, 0.25, 0.0, -0.125])
    # W = 3, each mean over the rows of its own episode in t-1..t+1: row 0 (0.25 + 0) / 2; row 1 (0.25 + 0 + 0) / 3
    # is not exact in binary, so compare approximately; row 3 (0 + 0.5) / 2 (episode 1's 0.25 is outside); row 4
    # (0.25 + 0) / 2; row 6 (0 - 0.125) / 2
    np.testing.assert_allclose(smooth_advantages(adv, EPS, 3),
                               [0.125, 0.25 / 3, 0.5 / 3, 0.25, 0.125, 0.125 / 3, -0.0625], rtol=1e-6)
    # W = 7 spans each whole episode: its mean on every row
    np.testing.assert_allclose(smooth_advantages(adv, EPS, 7), [0.1875] * 4 + [0.125 / 3] * 3, rtol=1e-6)
    np.testing.assert_array_equal(smooth_advantages(adv, EPS, 1), adv)
    # compute_labels thresholds the smoothed advantage: W = 7 makes every frame of an episode alike
    cols = {"index": np.arange(7), "episode_index": EPS, "frame_index": np.array([0, 1, 2, 3, 0, 1, 2]),
            "task_index": np.zeros(7, dtype=int), "next.success": SUCCESS}
    v = np.array([-0.5, -0.125, 0.0, 0.0, -0.75, -0.5, -0.25])
    lab = compute_labels(cols, v, "next.success", LabelConfig(n_step=2, positive_fraction=0.5, max_episode_length=M,
                                                              fail_penalty=C, smooth_window=7))
    assert len(set(lab.advantage[:4].tolist())) == 1 and len(set(lab.advantage[4:].tolist())) == 1


def test_per_task_thresholds_and_the_indicator_by_hand():
    adv = np.array([0.25, 0.0, 0.0, 0.0, 0.25, 0.0, -0.125])
    thr = task_thresholds(adv, TASKS, 0.3)
    # task 0: sorted [0, 0, 0, 0.25], the 0.7 quantile at position 2.1: 0 + 0.1 * 0.25; task 1: sorted
    # [-0.125, 0, 0.25], position 1.4: 0 + 0.4 * 0.25
    assert thr == {0: pytest.approx(0.025), 1: pytest.approx(0.1)}
    np.testing.assert_array_equal(indicators(adv, TASKS, thr), [1, 0, 0, 0, 1, 0, 0])
    inter = np.array([0, 0, 0, 0, 0, 1, 1], dtype=bool)  # a human acted on frames 5 and 6: forced positive
    np.testing.assert_array_equal(indicators(adv, TASKS, thr, inter), [1, 0, 0, 0, 1, 1, 1])


def test_only_corrections_inside_policy_episodes_are_forced_positive():
    # episode 0 recorded by a human throughout (a demo); episode 1: the policy, then a human from frame 5 on
    inter = np.array([1, 1, 1, 1, 0, 1, 1], dtype=bool)
    np.testing.assert_array_equal(corrections(EPS, inter), [0, 0, 0, 0, 0, 1, 1])
    cols = {"index": np.arange(7), "episode_index": EPS, "frame_index": np.array([0, 1, 2, 3, 0, 1, 2]),
            "task_index": TASKS, "next.success": SUCCESS, "intervention": inter}
    v = np.array([-0.5, -0.125, 0.0, 0.0, -0.75, -0.5, -0.25])
    cfg = LabelConfig(n_step=2, max_episode_length=M, fail_penalty=C)
    labels = compute_labels(cols, v, "next.success", cfg, "intervention")
    np.testing.assert_array_equal(labels.advantage_indicator, [1, 0, 0, 0, 1, 1, 1])


def test_compute_labels_and_the_sidecar_round_trip(tmp_path):
    cols = {"index": np.arange(7), "episode_index": EPS, "frame_index": np.array([0, 1, 2, 3, 0, 1, 2]),
            "task_index": TASKS, "next.success": SUCCESS, "intervention": np.array([0, 0, 0, 0, 0, 1, 0], bool)}
    v = np.array([-0.5, -0.125, 0.0, 0.0, -0.75, -0.5, -0.25])
    cfg = LabelConfig(n_step=2, positive_fraction=0.3, max_episode_length=M, fail_penalty=C)
    labels = compute_labels(cols, v, "next.success", cfg, "intervention")
    np.testing.assert_array_equal(labels.advantage_indicator, [1, 0, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(labels.value_target, [-0.25, -0.125, 0.0, 0.0, -0.625, -0.5, -0.375])
    write_sidecar(labels, tmp_path / "labels", {"dataset": "abc"})
    back, meta = read_sidecar(tmp_path / "labels")
    assert meta["dataset"] == "abc" and back.thresholds == labels.thresholds
    assert labels.max_episode_length == back.max_episode_length == {0: M, 1: M}
    for c in labels.COLUMNS:
        np.testing.assert_array_equal(getattr(back, c), getattr(labels, c))
    # a sidecar written when one M served every task reads as that M for each
    (tmp_path / "labels" / "labels.json").write_text(
        (tmp_path / "labels" / "labels.json").read_text().replace('"0": 8,\n    "1": 8', '"x": 0').replace(
            '"max_episode_length": {\n    "x": 0\n  }', '"max_episode_length": 8'))
    assert '"max_episode_length": 8' in (tmp_path / "labels" / "labels.json").read_text()
    assert read_sidecar(tmp_path / "labels")[0].max_episode_length == {0: M, 1: M}


def test_each_task_has_its_own_value_scale():
    """M per task: max_episode_length_by_task by instruction, else max_episode_length, else the task's longest
    episode. Task 0 (episode 0, 4 frames, success at frame 2) at M = 8, task 1 (episode 1, 3 frames, a failure) at
    M = 4 with C = 2: -(3 + 2)/4 = -1.25 -> -1, -(2 + 2)/4 = -1, -(1 + 2)/4 = -0.75."""
    cols = {"episode_index": EPS, "task_index": TASKS, "next.success": SUCCESS}
    tasks = ["lift", "push"]
    cfg = LabelConfig(max_episode_length=M, max_episode_length_by_task={"push": 4}, fail_penalty=C)
    assert task_scales(EPS, TASKS, tasks, cfg) == {0: 8, 1: 4}
    target, scales = targets_for(cols, "next.success", cfg, tasks)
    np.testing.assert_array_equal(target, [-0.25, -0.125, 0.0, 0.0, -1.0, -1.0, -0.75])
    r = rewards(EPS, SUCCESS, frame_scales(TASKS, scales), C)
    np.testing.assert_array_equal(r, [-0.125, -0.125, 0.0, 0.0, -0.25, -0.25, -0.75])  # -1/4 per frame, -C/4 more
    # nothing configured: each task's longest episode (4 and 3 frames)
    assert task_scales(EPS, TASKS, tasks, LabelConfig()) == {0: 4, 1: 3}
    with pytest.raises(ValueError, match=r"names \['pushh'\], which the data's instructions"):
        task_scales(EPS, TASKS, tasks, LabelConfig(max_episode_length_by_task={"pushh": 4}))
    with pytest.raises(ValueError, match="max_episode_length_by_task"):
        LabelConfig(max_episode_length_by_task={"push": 0})


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="grouped by episode"):
        episode_bounds(np.array([0, 1, 0]))
    with pytest.raises(ValueError, match="positive_fraction"):
        LabelConfig(positive_fraction=0.0)
    with pytest.raises(ValueError, match="smooth_window must be an odd"):
        LabelConfig(smooth_window=4)


def test_a_success_on_the_first_row_of_the_table():
    # episode 0 is solved on its first frame, which is also row 0 of the table (first success row = 0): its frames are
    # at the goal (target 0, reward 0), not a failure; episode 1 (2 frames) is solved on its last frame
    eps, succ = np.array([0, 0, 1, 1]), np.array([True, False, False, True])
    np.testing.assert_array_equal(value_targets(eps, succ, M, C), [0.0, 0.0, -0.125, 0.0])
    np.testing.assert_array_equal(rewards(eps, succ, M, C), [0.0, 0.0, -0.125, 0.0])


def test_a_one_frame_table_is_labelled():
    start, end = episode_bounds(np.array([7]))
    assert start.tolist() == [0] and end.tolist() == [0]
    np.testing.assert_array_equal(value_targets(np.array([7]), np.array([False]), M, C), [-0.375])  # -(1 + 2) / 8


def test_an_advantage_equal_to_its_tasks_threshold_is_positive():
    # five frames of one task, top 50 %: the 0.5 quantile falls exactly on the middle value 0.25
    adv = np.array([0.0, 0.125, 0.25, 0.5, 0.75])
    thr = task_thresholds(adv, np.zeros(5, dtype=int), 0.5)
    assert thr == {0: 0.25}
    np.testing.assert_array_equal(indicators(adv, np.zeros(5, dtype=int), thr), [0, 0, 1, 1, 1])


def test_a_human_demo_episode_anywhere_in_the_table_is_no_correction():
    # episode 0: the policy, then a human on its last frame; episode 1: a human throughout (a demo), after episode 0
    inter = np.array([0, 0, 0, 1, 1, 1, 1], dtype=bool)
    np.testing.assert_array_equal(corrections(EPS, inter), [0, 0, 0, 1, 0, 0, 0])


def test_the_intervention_column_counts_from_one_half():
    cols = {"intervention": np.array([0.0, 0.49, 0.5, 1.0])}
    np.testing.assert_array_equal(intervention_frames(cols, LabelConfig()), [False, False, True, True])
    assert intervention_frames({}, LabelConfig()) is None


@pytest.mark.parametrize("field, ok, bad", [("n_step", 1, 0), ("positive_fraction", 1.0, 1.01),
                                           ("positive_fraction", 0.01, 0.0),
                                           ("max_episode_length", 1, 0), ("fail_penalty", 0.0, -0.5),
                                           ("smooth_window", 1, -1)])
def test_label_settings_at_their_limits(field, ok, bad):
    assert getattr(LabelConfig(**{field: ok}), field) == ok
    with pytest.raises(ValueError, match=field):
        LabelConfig(**{field: bad})
