"""The batched environment contract every simulator, adapter and real robot implements (DESIGN.md §3).

Batched torch tensors in and out, on the env's device; no numpy or gym spaces cross this boundary.

    obs, info = env.reset(seed)
    obs, reward[N], terminated[N], truncated[N], info = env.step(action[N, A])

* Actions are float32 in [-1, 1]^A; the env maps them to its own units.
* ``terminated`` (a true end: success, failure, a diverged simulation) and ``truncated`` (a time limit) are kept
  apart; bootstrapping on time-outs is the algorithm's decision.
* Envs that end are reset inside ``step``; the returned ``obs`` rows of those envs are the first observation of
  the new episode and ``info[FINAL_OBS]`` holds the true last observation (rows of other envs equal ``obs``).
* ``info[EPISODE]`` holds per-env episode statistics (return, length, success), valid where an episode ended.
* ``info[LOG]`` holds float scalars for the logger (each reward term as ``reward/<term>``, fault counters).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from robot_rl import keys

Obs = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ObsSpec:
    """Shape (without the batch dimension) and dtype of each observation group."""

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)

    def dtype(self, group: str) -> torch.dtype:
        return self.dtypes.get(group, torch.float32)

    @property
    def groups(self) -> list[str]:
        return list(self.shapes)

    def to_json(self) -> dict[str, Any]:
        """A plain description used to refuse resuming onto a different env."""
        return {k: {"shape": list(v), "dtype": str(self.dtype(k))} for k, v in self.shapes.items()}


class VecEnv(ABC):
    """N environments stepped together. See the module docstring for the contract."""

    num_envs: int
    device: torch.device
    obs_spec: ObsSpec
    action_dim: int
    max_episode_length: int  # control steps before truncation
    control_dt: float  # seconds per env step
    instruction: str  # the language instruction of the task, the same for every env

    @abstractmethod
    def reset(self, seed: int | None = None) -> tuple[Obs, dict[str, Any]]:
        """Reset every env; a seed makes everything after it reproducible."""

    @abstractmethod
    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Advance every env by one control step. ``action`` is float [N, A] in [-1, 1]."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bitwise-identically (physics state, task buffers, RNG)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be checkpointed")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be restored")

    def render(self, camera: str | None = None) -> torch.Tensor:
        """uint8 [N, 3, H, W] frames from a camera (for videos; tasks put images in obs themselves)."""
        raise NotImplementedError(f"{type(self).__name__} does not render")

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_action(action: torch.Tensor, num_envs: int, action_dim: int) -> torch.Tensor:
    """Validate an action batch; return a float32 view of it. Raises a ValueError that says what was expected."""
    if not isinstance(action, torch.Tensor):
        raise TypeError(f"action must be a torch.Tensor of shape [{num_envs}, {action_dim}], "
                        f"got {type(action).__name__}")
    if tuple(action.shape) != (num_envs, action_dim):
        raise ValueError(
            f"action has shape {tuple(action.shape)}, expected [num_envs, action_dim] = [{num_envs}, {action_dim}]"
        )
    if not (action.dtype.is_floating_point):
        raise ValueError(f"action dtype must be floating point, got {action.dtype}")
    return action.float()


def nonfinite_rows(x: torch.Tensor) -> torch.Tensor:
    """bool [N]: rows of a [N, ...] tensor holding a NaN or inf."""
    return ~torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)


def episode_mask(terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """bool [N]: envs whose episode ended this step (the only place the two are combined for bookkeeping)."""
    return terminated | truncated


__all__ = ["ObsSpec", "VecEnv", "Obs", "check_action", "nonfinite_rows", "episode_mask", "keys"]
