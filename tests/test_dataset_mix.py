"""Mixed datasets (``dataset.mix``): the episodes of several LeRobotDataset v3 folders train as one sequence, read in
place: numbered one after another, one task list, chunks and history that never cross a dataset, columns a dataset
lacks filled only where asked, and a clear error where the datasets do not hold the same quantities."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from policies import keys
from robot_rl.data.lerobot_loader import DatasetError, episode_offsets, read_meta
from tests.test_lerobot_loader import action_value, image_value, make_dataset, sampler, state_value, tree_hash

OURS_LENGTHS, THEIRS_LENGTHS = [12, 20, 15], [10, 18]
FRONT = keys.lerobot_image_key("front")


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """Ours (3 episodes, intervention recorded) and theirs (2 episodes, one task shared with ours, one new, no
    intervention column, as a lerobot-eval recording)."""
    base = tmp_path_factory.mktemp("mix")
    ours = make_dataset(base / "ours", lengths=OURS_LENGTHS)
    theirs = make_dataset(base / "theirs", lengths=THEIRS_LENGTHS, tasks=("pick the cube 1", "place the cube"),
                          without=(keys.INTERVENTION_COL,))
    return ours, theirs


def test_mixed_datasets_train_as_one_sequence_of_episodes(pair, capsys):
    ours, theirs = pair
    before = {p: tree_hash(p) for p in pair}
    s = sampler(ours, mix=[str(theirs)], extra_columns=[keys.SUCCESS_COL, keys.INTERVENTION_COL],
                fill_missing=[keys.INTERVENTION_COL], augment=False)
    n_ours = sum(OURS_LENGTHS)
    assert s.num_frames == n_ours + sum(THEIRS_LENGTHS) and s.num_episodes == 5
    assert episode_offsets([read_meta(ours), read_meta(theirs)]) == [0, 3]
    assert [(x["first_episode"], x["last_episode"], x["frames"]) for x in s.sources] == [(0, 2, 47), (3, 4, 28)]
    assert f"dataset.mix: {theirs}: 2 episodes, numbered 3..4 (its own + 3), 28 frames" in capsys.readouterr().err
    eps = s.indices["episode_index"].numpy()
    np.testing.assert_array_equal(np.unique(eps), [0, 1, 2, 3, 4])
    assert (eps[n_ours:n_ours + 10] == 3).all() and (eps[n_ours + 10:] == 4).all()
    assert s.indices["index"][n_ours].item() == n_ours  # theirs' frame 0 follows ours' last frame
    assert s.tasks == ["pick the cube 0", "pick the cube 1", "place the cube"]
    # theirs' episode 1, frame 2: its state, its image, its task, chunks padded at its own end
    row = n_ours + 10 + 2
    batch = s.batch(torch.tensor([row, n_ours - 1]))
    np.testing.assert_array_equal(batch[keys.OBS_STATE][0].numpy(), state_value(1, 2))
    assert torch.equal(s.images[FRONT][row], sampler(theirs).images[FRONT][10 + 2])  # decoded as theirs alone
    assert (batch[FRONT][0] * 255).round().to(torch.uint8).permute(1, 2, 0).int().sub(
        torch.from_numpy(image_value(1, 2)).int()).abs().float().mean() < 12  # the frame written (AV1: ~5 of 255)
    assert batch[keys.TASK] == ["place the cube", "pick the cube 0"]
    assert batch[keys.ACTION_IS_PAD][1, 1:].all()  # ours' last frame: its chunk does not run into theirs
    last = s.batch(torch.tensor([s.num_frames - 1]))  # theirs' last frame: padded with its own last action
    assert last[keys.ACTION_IS_PAD][0, 1:].all() and not last[keys.ACTION_IS_PAD][0, 0]
    np.testing.assert_array_equal(last[keys.ACTION_COL][0, -1].numpy(), action_value(1, 17))
    # intervention read where recorded (odd frames of ours), False throughout theirs
    inter = s.extras[keys.INTERVENTION_COL].numpy()
    np.testing.assert_array_equal(inter[:12], np.arange(12) % 2 == 1)
    assert not inter[n_ours:].any() and s.extras[keys.SUCCESS_COL][n_ours + 9].item()  # theirs' ep 0 ends solved
    # statistics over both datasets' frames, not read from one's meta/stats.json
    assert s.stats_source[keys.OBS_STATE] == "computed"
    np.testing.assert_allclose(s.stats[keys.OBS_STATE]["mean"].numpy(), s.state.numpy().mean(0), rtol=1e-5)
    # a split in the one numbering: ours' episode 1 and theirs' episode 1 (numbered 4)
    part = sampler(ours, mix=[str(theirs)], episodes=[1, 4])
    assert part.num_frames == 20 + 18 and sorted(np.unique(part.indices["episode_index"].numpy())) == [1, 4]
    # the fingerprint names the mix: not ours' alone, the same for the same mix
    alone = sampler(ours)
    assert s.fingerprint() != alone.fingerprint()
    assert sampler(ours, mix=[str(theirs)], extra_columns=[keys.SUCCESS_COL, keys.INTERVENTION_COL],
                   fill_missing=[keys.INTERVENTION_COL], augment=False).fingerprint() == s.fingerprint()
    assert {p: tree_hash(p) for p in pair} == before  # only read



def test_a_mix_keeps_global_indices_unique_without_total_frames(pair, tmp_path):
    """The second dataset's indices go past the first's highest index even when the first's info.json does not say
    how many frames it holds (labels key frames by the global index: a repeat would hand one frame another's label;
    a total_frames that disagrees with the episodes is refused by read_meta, tests/test_dataset_fuzz.py)."""
    import json
    import shutil

    ours, theirs = pair
    lying = tmp_path / "ours_without_total"
    shutil.copytree(ours, lying)
    info = json.loads((lying / "meta" / "info.json").read_text())
    del info["total_frames"]
    (lying / "meta" / "info.json").write_text(json.dumps(info))
    s = sampler(lying, mix=[str(theirs)], augment=False)
    index = s.indices["index"].numpy()
    n_ours = sum(OURS_LENGTHS)
    assert len(np.unique(index)) == len(index) == s.num_frames
    assert index[n_ours] == n_ours  # theirs' frame 0 right after ours' last frame


def test_history_does_not_reach_back_into_the_dataset_before(pair):
    ours, theirs = pair
    s = sampler(ours, mix=[str(theirs)], history=2, augment=False)
    n_ours = sum(OURS_LENGTHS)
    batch = s.batch(torch.tensor([n_ours, n_ours + 1]))  # theirs' first two frames
    state = batch[keys.OBS_STATE].numpy()  # [B, K = 2, 6], oldest first
    np.testing.assert_array_equal(state[0], [state_value(0, 0)] * 2)  # its first frame repeated, not ours' last
    np.testing.assert_array_equal(state[1], [state_value(0, 0), state_value(0, 1)])
    assert torch.equal(batch[FRONT][0, 0], batch[FRONT][0, 1])

def test_datasets_that_do_not_mix_are_refused_naming_why(pair, tmp_path):
    ours, theirs = pair
    with pytest.raises(DatasetError, match=rf"{theirs}.*no column 'intervention'"):
        sampler(ours, mix=[str(theirs)], extra_columns=[keys.INTERVENTION_COL])  # not filled: required
    with pytest.raises(DatasetError, match=rf"dataset {ours} and the mixed ones have no column 'next\.rewards'"):
        sampler(ours, mix=[str(theirs)], extra_columns=["next.rewards"])  # in none of them
    with pytest.raises(DatasetError, match=rf"dataset {ours} has no column 'next\.rewards'"):
        sampler(ours, extra_columns=["next.rewards"])  # alone: no mixed ones to name
    with pytest.raises(DatasetError, match="no episode 7"):
        sampler(ours, mix=[str(theirs)], episodes=[0, 7])
    slow = make_dataset(tmp_path / "slow", lengths=[9], use_videos=False, fps=10)
    with pytest.raises(DatasetError, match=rf"{slow} was recorded at 10 fps, {ours} at 30"):
        sampler(ours, mix=[str(slow)])
    small = make_dataset(tmp_path / "small", lengths=[9], use_videos=False, size=16)
    with pytest.raises(DatasetError, match=r"\[16, 16\].*\[32, 32\].*dataset.image_size"):
        sampler(ours, mix=[str(small)])
    both = sampler(ours, mix=[str(small)], image_size=[16, 16])
    assert both.images[FRONT].shape[1:] == (3, 16, 16) and both.num_frames == sum(OURS_LENGTHS) + 9
    assert both.video_backend == "pyav"  # ours' videos, though the last dataset stores PNG images
    # the RAM cap holds for the mix as a whole: ours alone fits in 0.0003 GiB (2 cameras x 47 frames x 3 KiB), the
    # two together do not
    assert sampler(ours, max_cache_gib=0.0003).num_frames == sum(OURS_LENGTHS)
    with pytest.raises(DatasetError, match="with the mixed ones.*max_cache_gib=0.0003"):
        sampler(ours, mix=[str(theirs)], max_cache_gib=0.0003)
