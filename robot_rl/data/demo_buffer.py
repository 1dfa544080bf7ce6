"""A LeRobotDataset v3 as an off-policy demonstration buffer (RLPD: FlashSAC mixes it 50/50 into every batch).

    buffer, transitions = load_demo_buffer("data/lift_demos", {"policy": 33, "critic": 36}, action_dim=6,
                                           ends=EpisodeEnds(max_episode_length=150))
    runner = OffPolicyRunner(env, algo, cfg, logger, checkpoints, meta, demo=buffer)

A state-based learner observes the env's own observation groups and acts in the env's own action space, not in
LeRobot's frame (joint degrees, images). ``robot-rl collect env_state=true`` records both beside the frame
(``policies.keys``): ``observation.environment_state`` (LeRobot's privileged-state column) = the ``policy`` group,
``env_critic_state`` = the ``critic`` group, ``env_action`` = the env's applied action. Only parquet is read (no
video), through ``robot_rl.data.lerobot_format``'s checked reader; nothing is ever written under the dataset's root.

Transitions, per episode of frames 0..L-1 (o_t, a_t, r_t = ``next.reward``, s_t = ``next.success``):

* (o_t, a_t, r_t, o_{t+1}) for t < L-1, neither terminated nor truncated;
* where the env ends episodes on success (``EpisodeEnds.terminate_on_success``), the episode ends at its first
  success frame t*, terminated (frames after it, recorded under other settings, are dropped);
* the last frame is terminated when it succeeded (as above) or when the episode is shorter than the env's time limit
  (it ended on a failure, e.g. the cube fell off the table); its o' is o_t itself, never read (discount 0);
* an episode that ran into the time limit (L >= ``max_episode_length``, not a success) is a time-out, not a
  terminal: its last frame has no recorded o' to bootstrap from, so that transition is dropped and the one before it
  is marked truncated (o' = o_{L-1}, which is recorded): targets bootstrap there and n-step windows stop.

The sim-side knowledge (the time limit, success ending episodes, how LeRobot's degree targets map to the env's
actions when ``env_action`` was not recorded) is passed in by the caller (``robot_rl/cli``): this module never
imports ``sim``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from policies import keys
from robot_rl.buffers.replay import ReplayBuffer
from robot_rl.data.lerobot_format import DatasetError, read_frames, read_meta
from robot_rl.data.timing import drop_late_episodes

# observation group -> the dataset column holding it (what ``robot-rl collect env_state=true`` writes)
OBS_COLUMNS = {keys.POLICY: keys.ENV_STATE_COL, keys.CRITIC: keys.ENV_CRITIC_STATE_COL}
HOW_TO_ADD = "record it with `robot-rl collect task=<task> env_state=true dataset.root=DIR ...`"

# (observation.state [M, D] degrees, action [M, D] degree targets) -> env actions [M, A]
ToEnvAction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class EpisodeEnds:
    """How the env ends episodes, to tell a dataset's terminations from its time-outs.

    Args:
        max_episode_length: the env's time limit, control steps; an episode this long that did not succeed was cut
            by it (truncated), a shorter one ended on a termination.
        terminate_on_success: the env ends an episode at its first success frame (terminated).
    """

    max_episode_length: int
    terminate_on_success: bool = True

    def __post_init__(self) -> None:
        if self.max_episode_length < 1:
            raise ValueError(f"max_episode_length must be >= 1, got {self.max_episode_length}")


@dataclass(frozen=True)
class Transitions:
    """Flat transitions, episodes back to back in dataset order: ``obs`` / ``next_obs`` group -> float32 [M, D],
    ``action`` float32 [M, A], ``reward`` float32 [M], ``terminated`` / ``truncated`` bool [M] (one of them set on
    each episode's last transition), ``episode`` int64 [M] the dataset's episode_index, ``frame`` int64 [M],
    ``actor`` int8 [M] who acted (the ``actor`` column; else ``intervention`` as a person; else the policy); and
    what they came from: episodes read, of them those with a success frame, the column actions came from."""

    obs: dict[str, torch.Tensor]
    next_obs: dict[str, torch.Tensor]
    action: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    episode: torch.Tensor
    frame: torch.Tensor
    num_episodes: int
    num_successes: int
    action_source: str  # keys.ENV_ACTION_COL, or "action (converted)"
    actor: torch.Tensor | None = None  # None: the policy's throughout

    def __len__(self) -> int:
        return int(self.action.shape[0])


def read_transitions(root: str | Path, obs_dims: dict[str, int], action_dim: int, ends: EpisodeEnds,
                     to_env_action: ToEnvAction | None = None, max_episodes: int | None = None,
                     timing_check: bool = True) -> Transitions:
    """The transitions of the dataset at ``root`` (see the module docstring), checked against the env.

    Args:
        root: a LeRobotDataset v3 folder.
        obs_dims: observation group -> its size in the env (groups of ``OBS_COLUMNS``).
        action_dim: A, the env's action size.
        ends: how the env ends episodes.
        to_env_action: for a dataset without ``env_action``: LeRobot's (``observation.state``, ``action``) in
            degrees -> the env's actions (None: ``env_action`` is required).
        max_episodes: read only the first this many episodes (by episode_index; None: all).
        timing_check: leave out episodes recorded with late ticks (``robot_rl.data.timing``).

    Raises:
        DatasetError: not a v3 dataset, a column missing (naming it and how to record it), a size that differs
            from the env's (naming both), unreadable or inconsistent files, NaN, ...
    """
    meta = read_meta(root)
    feats = meta.features
    problems = []
    for group, dim in obs_dims.items():
        if group not in OBS_COLUMNS:
            raise DatasetError(f"the learner reads observation group {group!r}; a dataset holds only "
                               f"{sorted(OBS_COLUMNS)} (columns {sorted(OBS_COLUMNS.values())})")
        col = OBS_COLUMNS[group]
        if col not in feats:
            problems.append(f"no column {col!r} (the env's {group!r} observation, {dim} values): {HOW_TO_ADD}")
        elif tuple(feats[col].get("shape", ())) != (dim,):
            problems.append(f"column {col!r} holds {list(feats[col].get('shape', ()))} values per frame, the env's "
                            f"{group!r} observation {dim}: recorded on another task or task version")
    if keys.ENV_ACTION_COL in feats:
        action_cols = [keys.ENV_ACTION_COL]
        if tuple(feats[keys.ENV_ACTION_COL].get("shape", ())) != (action_dim,):
            problems.append(f"column {keys.ENV_ACTION_COL!r} holds {list(feats[keys.ENV_ACTION_COL].get('shape', ()))}"
                            f" values per frame, the env's actions {action_dim}")
    elif to_env_action is not None:
        action_cols = [keys.OBS_STATE, keys.ACTION_COL]
        problems += [f"no column {c!r} (the env's action is computed from it)" for c in action_cols if c not in feats]
    else:
        action_cols = []
        problems.append(f"no column {keys.ENV_ACTION_COL!r} (the env's own action, {action_dim} values): {HOW_TO_ADD}")
    problems += [f"no column {c!r} ({why})" for c, why in ((keys.REWARD_COL, "the reward of each step"),
                                                           (keys.SUCCESS_COL, "whether the task is solved"))
                 if c not in feats]
    if problems:
        raise DatasetError(f"dataset {meta.root} cannot fill a demo buffer: " + "; ".join(problems))
    episodes = np.asarray(meta.episodes["episode_index"], dtype=np.int64)
    if max_episodes is not None:
        if max_episodes < 1:
            raise ValueError(f"max_episodes must be >= 1, got {max_episodes}")
        episodes = episodes[:max_episodes]
    if len(episodes) == 0:
        raise DatasetError(f"dataset {meta.root} holds no episodes")
    if timing_check:
        episodes = drop_late_episodes(meta, episodes, what="demo_dataset.timing_check")
    obs_cols = [OBS_COLUMNS[g] for g in obs_dims]
    done_col = [keys.DONE_COL] if keys.DONE_COL in feats else []
    who_col = [c for c in (keys.ACTOR_COL, keys.INTERVENTION_COL) if c in feats][:1]
    wanted = list(dict.fromkeys([*obs_cols, *action_cols, keys.REWARD_COL, keys.SUCCESS_COL, *done_col, *who_col]))
    frames = read_frames(meta, episodes, wanted)
    cols = frames.columns
    if done_col:  # LeRobot's next.done marks an episode's last frame, and only it
        last = np.arange(len(frames.ep_end)) == frames.ep_end
        bad = np.flatnonzero(cols[keys.DONE_COL].reshape(-1).astype(bool) != last)
        if len(bad):
            r = int(bad[0])
            raise DatasetError(f"dataset {meta.root}, episode {int(cols['episode_index'][r])}: {keys.DONE_COL!r} is "
                               f"{not last[r]} at frame {int(cols['frame_index'][r])}, but that frame is "
                               f"{'' if last[r] else 'not '}the episode's last")
    if action_cols != [keys.ENV_ACTION_COL]:
        state = torch.as_tensor(cols[keys.OBS_STATE], dtype=torch.float32)
        target = torch.as_tensor(cols[keys.ACTION_COL], dtype=torch.float32)
        action = to_env_action(state, target).float()
        if tuple(action.shape) != (len(state), action_dim):
            raise ValueError(f"to_env_action returned shape {tuple(action.shape)}, expected [{len(state)}, "
                             f"{action_dim}]")
    else:
        action = torch.as_tensor(cols[keys.ENV_ACTION_COL], dtype=torch.float32)
    success = cols[keys.SUCCESS_COL].reshape(-1).astype(bool)
    rows, next_rows, terminated, truncated = episode_transitions(cols["episode_index"], success, frames.ep_start,
                                                                 frames.ep_end, ends)
    r, nr = torch.as_tensor(rows), torch.as_tensor(next_rows)
    obs = {g: torch.as_tensor(cols[c], dtype=torch.float32) for g, c in zip(obs_dims, obs_cols, strict=True)}
    actor = None
    if who_col:
        who = cols[who_col[0]].reshape(-1)
        actor = torch.as_tensor(who if who_col[0] == keys.ACTOR_COL else
                                np.where(who.astype(bool), keys.ACTOR_HUMAN, keys.ACTOR_POLICY)).to(torch.int8)[r]
    return Transitions(
        obs={g: v[r] for g, v in obs.items()}, next_obs={g: v[nr] for g, v in obs.items()}, action=action[r],
        reward=torch.as_tensor(cols[keys.REWARD_COL].reshape(-1), dtype=torch.float32)[r],
        terminated=torch.as_tensor(terminated), truncated=torch.as_tensor(truncated),
        episode=torch.as_tensor(cols["episode_index"], dtype=torch.int64)[r],
        frame=torch.as_tensor(cols["frame_index"], dtype=torch.int64)[r], num_episodes=len(episodes),
        num_successes=len(np.unique(cols["episode_index"][success])),
        action_source=keys.ENV_ACTION_COL if action_cols == [keys.ENV_ACTION_COL] else f"{keys.ACTION_COL} (converted)",
        actor=actor)


def episode_transitions(episode: np.ndarray, success: np.ndarray, ep_start: np.ndarray, ep_end: np.ndarray,
                        ends: EpisodeEnds) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which frames become transitions and how each ends (the rules of the module docstring), as pure index math.

    Args:
        episode: int [R] episode of each row, rows sorted by (episode, frame); success: bool [R] ``next.success``;
        ep_start / ep_end: int [R] the row of each row's episode's first / last frame.
        ends: how the env ends episodes.

    Returns:
        ``rows`` int64 [M] the frames kept, ``next_rows`` int64 [M] the frame holding each one's o' (itself on a
        terminal), ``terminated`` bool [M], ``truncated`` bool [M].
    """
    starts = np.flatnonzero(np.r_[True, episode[1:] != episode[:-1]]) if len(episode) else np.zeros(0, np.int64)
    rows, next_rows, term, trunc = [], [], [], []
    for s in starts.tolist():
        e = int(ep_end[s])
        hit = np.flatnonzero(success[s:e + 1]) if ends.terminate_on_success else np.zeros(0, np.int64)
        length = e - s + 1
        if len(hit):  # ends at its first success
            last, terminal = s + int(hit[0]), True
        elif length < ends.max_episode_length:  # ended early: a termination (a failure)
            last, terminal = e, True
        else:  # the time limit: the last frame's o' is not recorded; the one before bootstraps from it
            last, terminal = e - 1, False
        if last < s:
            continue  # a one-frame time-out: no transition with a known o'
        kept = np.arange(s, last + 1)
        nxt = kept + 1
        if terminal:
            nxt[-1] = last  # never read: discount 0
        rows.append(kept)
        next_rows.append(nxt)
        flag = np.zeros(len(kept), bool)
        flag[-1] = True
        term.append(flag if terminal else np.zeros(len(kept), bool))
        trunc.append(np.zeros(len(kept), bool) if terminal else flag)
    if not rows:
        z = np.zeros(0, np.int64)
        return z, z, z.astype(bool), z.astype(bool)
    return (np.concatenate(rows).astype(np.int64), np.concatenate(next_rows).astype(np.int64), np.concatenate(term),
            np.concatenate(trunc))


def demo_buffer(tr: Transitions, device: torch.device | str = "cpu") -> ReplayBuffer:
    """A ``ReplayBuffer`` (one 'env', M rows, exactly full) holding ``tr`` in order, so n-step windows run along
    each episode and stop at its terminated or truncated last transition."""
    if len(tr) == 0:
        raise DatasetError("the dataset gives no transitions (every episode was a one-frame time-out)")
    buf = ReplayBuffer(len(tr), 1, {g: tuple(v.shape[1:]) for g, v in tr.obs.items()}, tr.action.shape[1], device)
    dev = buf.device
    obs = {g: v.to(dev) for g, v in tr.obs.items()}
    nxt = {g: v.to(dev) for g, v in tr.next_obs.items()}
    action, reward = tr.action.to(dev), tr.reward.to(dev)
    term, trunc = tr.terminated.to(dev), tr.truncated.to(dev)
    actor = None if tr.actor is None else tr.actor.to(dev)
    for i in range(len(tr)):
        s = slice(i, i + 1)
        buf.add({g: v[s] for g, v in obs.items()}, action[s], reward[s], term[s], trunc[s],
                {g: v[s] for g, v in nxt.items()}, actor=None if actor is None else actor[s])
    return buf


def load_demo_buffer(root: str | Path, obs_dims: dict[str, int], action_dim: int, ends: EpisodeEnds,
                     device: torch.device | str = "cpu", to_env_action: ToEnvAction | None = None,
                     max_episodes: int | None = None, timing_check: bool = True
                     ) -> tuple[ReplayBuffer, Transitions]:
    """``read_transitions`` then ``demo_buffer``: the dataset at ``root`` as a demo buffer on ``device``, and the
    transitions it holds (with their counts)."""
    tr = read_transitions(root, obs_dims, action_dim, ends, to_env_action, max_episodes, timing_check)
    return demo_buffer(tr, device), tr
