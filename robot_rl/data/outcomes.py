"""The outcome checks of a dataset that RECAP and AWR learn from: are its outcomes (``next.success``, or the episodes
named in ``algo.labels``) there, and does any episode succeed? Read from the dataset's metadata and data files, or
the frames a sampler holds, before any value model is fitted; and which extra columns the labels read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from policies import keys
from robot_rl.data.labels import LabelConfig, intervention_frames, solved_frames, task_scales


def check_outcome_columns(metas: Any, labels: LabelConfig | None = None) -> None:
    """Refuse data whose outcomes ``labels`` cannot read (by default each dataset's ``next.success`` column) before
    anything is decoded or trained. ``metas``: one dataset's metadata, or a mix's (root first; episodes numbered
    as ``episode_offsets`` numbers them).

    Raises:
        ValueError: naming the dataset and column, and how to label the outcomes instead.
    """
    from robot_rl.data.lerobot_loader import numbered_episodes

    metas = metas if isinstance(metas, list) else [metas]
    labels = labels or LabelConfig()
    if labels.named_episodes is not None:
        name, listed = labels.named_episodes
        held = set(numbered_episodes(metas).tolist())
        outside = sorted(set(listed) - held)
        if outside:
            where = f"dataset {metas[0].root}" + (" and the mixed ones" if len(metas) > 1 else "")
            raise ValueError(f"algo.labels.{name} lists episodes {outside} that {where} does not hold "
                             f"(it has {len(held)}: {min(held, default=None)}..{max(held, default=None)})")
        return
    col = labels.success_column
    for meta in metas:
        if col in meta.features:
            continue
        hint = ""
        if col == keys.SUCCESS_COL and keys.REWARD_COL in meta.features:
            hint = (f" This dataset has {keys.REWARD_COL!r}: LeRobot's HIL-SERL recorder (gym_manipulator) writes 1.0 "
                    f"there on the frame success is flagged, and algo.labels.success_column={keys.REWARD_COL} reads "
                    f"success from it (frames >= algo.labels.success_threshold).")
        raise ValueError(
            f"dataset {meta.root} has no {col!r} column: RECAP and AWR need each episode's outcome (per frame, true "
            f"from the frame the task is solved, as lerobot-eval writes {keys.SUCCESS_COL!r}).{hint} Record with "
            f"`robot-rl collect` (it writes {keys.SUCCESS_COL!r} and {keys.INTERVENTION_COL!r}), name the episodes "
            f"that succeeded with algo.labels.successful_episodes=[...] or those that failed with "
            f"algo.labels.failed_episodes=[...] (a success is solved on its last frame), or add the "
            f"column to a copy of the dataset with lerobot.datasets.dataset_tools.add_features(dataset, "
            f"features={{{keys.SUCCESS_COL!r}: (values, {{'dtype': 'bool', 'shape': (1,), 'names': None}})}}, "
            f"output_dir=NEW_DIR); algo=bc needs no outcomes")


def check_some_success(sampler: Any, labels: LabelConfig) -> str:
    """Refuse frames in which no episode succeeds, as ``labels`` reads the outcomes: every value target would be -1
    and the advantages noise. The usual cause is a recording from a real arm, which cannot report success (our
    deploy and record write ``next.success`` false throughout there). Returns a one-line summary of the outcomes
    read (successes, episodes with corrections), for the user to check their labelling against.

    Raises:
        ValueError: naming the column read and how to name the successful episodes instead.
    """
    cols = frame_table(sampler)
    solved = solved_frames(cols, labels)
    if solved.any():
        eps = cols["episode_index"].reshape(-1)
        n_eps, n_ok = len(np.unique(eps)), len(np.unique(eps[solved]))
        how = (f"algo.labels.{labels.named_episodes[0]}" if labels.named_episodes is not None else
               f"{labels.success_column} >= {labels.success_threshold:g}")
        line = f"outcomes: {n_ok} of {n_eps} episodes succeed ({how})"
        inter = intervention_frames(cols, labels)
        if inter is not None:
            line += f"; {len(np.unique(eps[inter]))} with {labels.intervention_column} frames"
        scales = task_scales(eps, cols["task_index"], sampler.tasks, labels)
        guessed = {sampler.tasks[t]: m for t, m in scales.items()
                   if labels.max_episode_length is None and sampler.tasks[t] not in labels.max_episode_length_by_task}
        if guessed:  # M scales every value: the longest episode stands in for the task's time limit, so that
            # episode's first frame is valued -1 like a failure's (robot-rl recap passes the task's)
            shown = (f"M = {next(iter(guessed.values()))} frames" if len(guessed) == 1 else
                     "M = " + ", ".join(f"{m} frames for {t!r}" for t, m in guessed.items()))
            line += (f"; value scale {shown}, the longest episode (set algo.labels.max_episode_length, or "
                     f"max_episode_length_by_task, to the task's time limit)")
        return line
    what = (f"algo.labels.{labels.named_episodes[0]} leaves none" if labels.named_episodes is not None else
            f"{labels.success_column!r} is never >= {labels.success_threshold} in its {sampler.num_episodes} "
            f"episodes")
    raise ValueError(_no_success(sampler.cfg.root, what))


def check_success_recorded(metas: Any, labels: LabelConfig) -> None:
    """Before anything is decoded: refuse datasets whose success column is never solved in any episode (read from
    the data files alone). ``check_some_success`` checks the frames actually loaded later (an episode subset, named
    episodes); this catches the common case (a real arm's recording) without decoding its videos first.

    Raises:
        ValueError: as ``check_some_success``.
    """
    from robot_rl.data.lerobot_format import read_frames

    if labels.named_episodes is not None:
        return
    col, episodes = labels.success_column, 0
    for m in metas:
        if col not in m.features:
            continue
        eps = np.asarray(m.episodes["episode_index"], dtype=np.int64)
        episodes += len(eps)
        values = read_frames(m, eps, [col]).columns[col].astype(np.float64)
        if (values >= labels.success_threshold).any():
            return
    raise ValueError(_no_success(metas[0].root, f"{col!r} is never >= {labels.success_threshold} in its {episodes} "
                                                f"episodes"))


def _no_success(root: Any, what: str) -> str:
    return (f"no episode of dataset {root} succeeds ({what}): RECAP and AWR learn from the difference between "
            f"successes and failures. A real arm cannot report success: name the episodes that succeeded with "
            f"algo.labels.successful_episodes=[...] or those that failed with algo.labels.failed_episodes=[...] (a "
            f"success is solved on its last frame); algo=bc needs no outcomes")


def outcome_columns(metas: Any, labels: LabelConfig | None = None) -> tuple[list[str], list[str]]:
    """(the extra columns the labels read, those of them some dataset of a mix may lack): the success column (none
    with outcomes named by episode) and, where any dataset has it, the intervention column, read as no correction
    (False) in a dataset without it (e.g. lerobot-record demos beside a DAgger rollout)."""
    metas = metas if isinstance(metas, list) else [metas]
    labels = labels or LabelConfig()
    cols = [] if labels.named_episodes is not None else [labels.success_column]
    have = [labels.intervention_column in m.features for m in metas]
    if any(have):
        cols.append(labels.intervention_column)
    return cols, ([labels.intervention_column] if any(have) and not all(have) else [])


def frame_table(sampler: Any) -> dict[str, np.ndarray]:
    """A sampler's per-frame columns as the labels read them: numpy [F] each (no state, no action), with
    ``task_index``."""
    cols = {k: v.numpy() for k, v in sampler.columns().items() if k not in (keys.OBS_STATE, keys.ACTION_COL)}
    cols["task_index"] = np.asarray(sampler.task_index)
    return cols
