"""Policy evaluation and filming over any ``VecEnv``: seeded episodes -> success rate and returns, and an mp4.

Every runner (on-policy, off-policy, offline) and ``robot-rl eval`` use these. They take any ``Policy``
(chunked or not: ``policies.ActionQueue`` executes it step by step, its queue reset where an episode ends) or a
plain ``act`` function (observations -> actions [N, A]).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from policies import ActionQueue, Policy, keys
from robot_rl.env import Obs, VecEnv, episode_mask
from robot_rl.logging import write_video

log = logging.getLogger(__name__)
ActFn = Callable[[Obs], torch.Tensor]


def _stepper(env: VecEnv, policy: Policy | ActFn) -> ActFn:
    """One action [N, A] per call: a policy runs through an ``ActionQueue``; a function is used as it is."""
    if isinstance(policy, Policy):
        policy.eval()
        return ActionQueue(policy, env.num_envs, env.action_dim, deterministic=True)
    return policy


def _ask_images_for_due(env: VecEnv, act: ActFn) -> None:
    """Where the env renders on request (``sim.lerobot_view.LeRobotView.render_ids``), ask the next step for the
    images of the envs whose policy will read them (a chunking policy reads them once per chunk); envs that reset in
    that step are rendered by the env itself."""
    if isinstance(act, ActionQueue) and hasattr(env, "render_ids"):
        env.render_ids = act.due().cpu()


def _episodes_ended(act: ActFn, done: torch.Tensor) -> None:
    """Clear the queued chunk and per-env policy state of envs that start a new episode."""
    if isinstance(act, ActionQueue) and bool(done.any()):
        act.reset(done.nonzero().flatten())


@dataclass
class EvalResult:
    num_episodes: int
    success_rate: float  # fraction of episodes that succeeded at any step
    mean_return: float  # undiscounted, reward units
    std_return: float
    mean_length: float  # env steps
    seed: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@torch.no_grad()
def evaluate(env: VecEnv, policy: Policy | ActFn, num_episodes: int, seed: int) -> EvalResult:
    """Run ``num_episodes`` episodes from ``env.reset(seed)`` and summarize them.

    Episodes are spread evenly over the envs and each env contributes its *first* episodes (not whichever end
    first), so short episodes are not over-represented.
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    n = env.num_envs
    quota = torch.full((n,), num_episodes // n, dtype=torch.long)
    quota[: num_episodes % n] += 1
    taken = torch.zeros(n, dtype=torch.long)
    returns, lengths, successes = [], [], []
    act = _stepper(env, policy)
    obs, _ = env.reset(seed=seed)
    max_steps = int(quota.max()) * env.max_episode_length + 1
    for _ in range(max_steps):
        if bool((taken >= quota).all()):
            break
        action = act(obs).to(env.device)
        _ask_images_for_due(env, act)
        obs, _, terminated, truncated, info = env.step(action)
        done = episode_mask(terminated, truncated).cpu()
        _episodes_ended(act, done)
        if not bool(done.any()):
            continue
        ep = {k: v.cpu() for k, v in info[keys.EPISODE].items()}
        for i in done.nonzero().flatten().tolist():
            if taken[i] < quota[i]:
                taken[i] += 1
                returns.append(float(ep[keys.EP_RETURN][i]))
                lengths.append(float(ep[keys.EP_LENGTH][i]))
                successes.append(float(ep[keys.EP_SUCCESS][i]))
    r = torch.tensor(returns)
    # the share in float64 (a float32 mean reads 45 of 50 as 0.8999999761, below a 0.9 threshold)
    return EvalResult(num_episodes=len(returns), success_rate=sum(successes) / len(successes) if successes else math.nan,
                      mean_return=float(r.mean()), std_return=float(r.std()) if len(returns) > 1 else 0.0,
                      mean_length=float(torch.tensor(lengths).mean()), seed=seed)


@torch.no_grad()
def record_video(env: VecEnv, policy: Policy | ActFn, path: str | Path, seed: int, num_episodes: int = 2,
                 camera: str = "front", width: int = 320, height: int = 240) -> Path | None:
    """Film env 0 for ``num_episodes`` episodes into an mp4 at the env's control rate.

    The env resets inside ``step``, so the frame after an episode's last step already shows the next episode.
    Returns None, after a warning, when the file cannot be written (a full disk): a video is not worth failing for.
    """
    env_ids = torch.tensor([0])

    def frame() -> torch.Tensor:
        return env.render(camera=camera, width=width, height=height, env_ids=env_ids)[0].cpu()

    act = _stepper(env, policy)
    obs, _ = env.reset(seed=seed)
    frames, episodes = [frame()], 0
    for _ in range(num_episodes * env.max_episode_length + 1):
        obs, _, terminated, truncated, _ = env.step(act(obs).to(env.device))
        frames.append(frame())
        done = episode_mask(terminated, truncated).cpu()
        _episodes_ended(act, done)
        if bool(done[0]):
            episodes += 1
            if episodes >= num_episodes:
                break
    try:
        return write_video(torch.stack(frames), path, fps=1.0 / env.control_dt)
    except OSError as e:
        log.warning("no video: could not write %s (%s)", path, e.strerror or e)
        return None
