"""The batched environment contract every simulator, adapter and real robot implements (DESIGN.md §3).

Batched torch tensors in and out, on the env's device; no numpy or gym spaces cross this boundary.

    obs, info = env.reset(seed)                       # every env; reset(env_ids=ids) resets some
    obs, reward[N], terminated[N], truncated[N], info = env.step(action[N, A])   # actor=keys.ACTOR_HUMAN ...

* Actions are float32 in [-1, 1]^A; the env maps them to its own units. ``info[APPLIED_ACTION]`` [N, A] is what
  was really applied (clipped to [-1, 1]; rows of a rejected non-finite action are 0) and ``info[ACTOR]`` int64
  [N] who chose it (``keys.ACTOR_POLICY`` unless ``step(action, actor=...)`` says otherwise: a HIL arbitrator
  passes who acted, the env only reports it).
* ``terminated`` (a true end: success, failure, a diverged simulation) and ``truncated`` (a time limit) are kept
  apart; bootstrapping on time-outs is the algorithm's decision.
* With ``autoreset`` (the default) envs that end are reset inside ``step``; the returned ``obs`` rows of those
  envs are the first observation of the new episode and ``info[FINAL_OBS]`` holds the true last observation
  (rows of other envs equal ``obs``). Without it (a real arm cannot reset itself) ended envs wait for
  ``reset(env_ids=...)``; stepping one before is an error.
* ``info[EPISODE]`` holds per-env episode statistics (return, length, success), valid where an episode ended.
* ``info[LOG]`` holds float scalars for the logger (each reward term as ``reward/<term>``, fault counters).
* ``instructions`` is the language instruction of each env's current episode (N strings; they may change when
  an env resets).
* ``resumable`` says whether ``state_dict`` captures everything needed to continue bitwise; a checkpoint of a
  non-resumable env (a real robot, Isaac Lab) holds no env state and cannot be resumed.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import torch

from policies import keys

Obs = dict[str, torch.Tensor]
Part = tuple[int, int]  # [start, stop) along the last dimension of a flat observation group


@dataclass(frozen=True)
class ObsSpec:
    """Shape (without the batch dimension) and dtype of each observation group, and the named parts of flat ones.

    ``parts[group][name] = (start, stop)`` names a slice of a flat group, e.g. ``parts["policy"]["joint_pos"] =
    (0, 6)``, so a consumer (a scripted expert, a dataset writer, a policy that must see only what a real robot
    gives) reads ``spec.part(obs, "joint_pos")`` instead of indices copied from a task file.
    """

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    parts: dict[str, dict[str, Part]] = field(default_factory=dict)

    @classmethod
    def from_parts(cls, layout: dict[str, Sequence[tuple[str, int]]]) -> ObsSpec:
        """Flat float groups from ordered ``(name, size)`` lists: ``{"proprio": [("joint_pos", 6)]}``."""
        shapes, parts = {}, {}
        for group, named in layout.items():
            start, slices = 0, {}
            for name, size in named:
                if name in slices:
                    raise ValueError(f"observation group {group!r} names part {name!r} twice")
                slices[name] = (start, start + int(size))
                start += int(size)
            shapes[group], parts[group] = (start,), slices
        return cls(shapes, parts=parts)

    def dtype(self, group: str) -> torch.dtype:
        return self.dtypes.get(group, torch.float32)

    @property
    def groups(self) -> list[str]:
        return list(self.shapes)

    def part(self, obs: Obs, name: str, groups: Sequence[str] | None = None) -> torch.Tensor:
        """[N, stop - start] view of the part ``name`` from the first of ``groups`` (default: every group, in
        order) that is present in ``obs`` and names it."""
        for group in groups if groups is not None else self.parts:
            if group in obs and name in self.parts.get(group, {}):
                start, stop = self.parts[group][name]
                return obs[group][..., start:stop]
        have = {g: sorted(p) for g, p in self.parts.items() if g in obs}
        raise KeyError(f"no observation part {name!r} in groups {list(groups or self.parts)}; named parts: {have}")

    def to_json(self) -> dict[str, Any]:
        """A plain description used to refuse resuming onto a different env."""
        out: dict[str, Any] = {k: {"shape": list(v), "dtype": str(self.dtype(k))} for k, v in self.shapes.items()}
        for group, named in self.parts.items():
            out[group]["parts"] = {name: list(s) for name, s in named.items()}
        return out


class VecEnv(ABC):
    """N environments stepped together. See the module docstring for the contract."""

    num_envs: int
    device: torch.device
    obs_spec: ObsSpec
    action_dim: int
    max_episode_length: int  # control steps before truncation
    control_dt: float  # seconds per env step
    instructions: list[str]  # [N] the language instruction of each env's current episode
    autoreset: bool = True  # envs that end are reset inside step (False: they wait for reset(env_ids=...))
    resumable: bool = False  # state_dict() holds everything needed to continue bitwise

    @abstractmethod
    def reset(self, seed: int | None = None, env_ids: torch.Tensor | None = None) -> tuple[Obs, dict[str, Any]]:
        """Reset the envs ``env_ids`` (int64 [K]; None: every env); a seed makes everything after it reproducible.
        Returns the observation of all N envs (other rows unchanged) and an info dict."""

    @abstractmethod
    def step(self, action: torch.Tensor, actor: int | torch.Tensor | None = None
             ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Advance every env by one control step. ``action`` is float [N, A] in [-1, 1]; ``actor`` (an int or
        int [N] of ``keys.ACTOR_*``; None: the policy) says who chose it and comes back as ``info[ACTOR]``."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bitwise-identically (physics state, task buffers, RNG); ``{}`` when the
        env is not ``resumable``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} is not resumable: its state is not checkpointed")

    def render(self, camera: str | None = None) -> torch.Tensor:
        """uint8 [N, 3, H, W] frames from a camera (for videos; tasks put images in obs themselves)."""
        raise NotImplementedError(f"{type(self).__name__} does not render")

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
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


def sanitize_action(action: torch.Tensor, num_envs: int, action_dim: int, device: torch.device,
                    on_nonfinite: str = "raise") -> tuple[torch.Tensor, torch.Tensor | None]:
    """The action every backend applies: checked, on ``device``, finite, clipped to [-1, 1].

    Args:
        action: float [N, A] from the caller.
        num_envs: N.
        action_dim: A.
        device: the env's device.
        on_nonfinite: "raise" (a ValueError naming the envs; nothing reaches the simulator) or "reset" (those rows
            become 0 and are returned in ``bad``, for the caller to terminate and reset those envs).

    Returns:
        ``(applied, bad)``: applied float32 [N, A] in [-1, 1] (a new tensor), and bool [N] of the rows that held a
        NaN or inf -- None when every row is finite (the common case costs nothing more).
    """
    a = check_action(action, num_envs, action_dim).to(device)
    if math.isfinite(float(a.sum())):  # a screen: a NaN or inf anywhere makes the sum non-finite (one op, one sync)
        return a.clamp(-1.0, 1.0), None
    bad = nonfinite_rows(a)  # or finite values summed past float32's range: the rows decide
    if not bool(bad.any()):
        return a.clamp(-1.0, 1.0), None
    if on_nonfinite == "raise":
        ids = bad.nonzero().flatten().tolist()
        raise ValueError(f"non-finite action (NaN/inf) for envs {ids[:10]}{'...' if len(ids) > 10 else ''}; "
                         "nothing was sent to the simulator (where the backend supports it, "
                         "sim.on_nonfinite_action=reset terminates and resets those envs instead)")
    if on_nonfinite != "reset":
        raise ValueError(f"on_nonfinite must be 'raise' or 'reset', got {on_nonfinite!r}")
    return torch.where(bad[:, None], torch.zeros_like(a), a).clamp(-1.0, 1.0), bad


def actor_ids(actor: int | torch.Tensor | None, num_envs: int, device: torch.device) -> torch.Tensor:
    """int64 [N] of ``keys.ACTOR_*`` from what ``step`` was given: None (the policy), one int, or an int [N]."""
    if actor is None:
        return torch.zeros(num_envs, dtype=torch.long, device=device)
    if isinstance(actor, int):
        if not 0 <= actor < len(keys.ACTOR_NAMES):
            raise ValueError(f"actor must be one of keys.ACTOR_* {dict(enumerate(keys.ACTOR_NAMES))}, got {actor}")
        return torch.full((num_envs,), actor, dtype=torch.long, device=device)
    if not isinstance(actor, torch.Tensor) or actor.shape != (num_envs,) or actor.dtype.is_floating_point:
        raise ValueError(f"actor must be None, an int or an integer tensor [{num_envs}], got {actor!r}")
    out = actor.to(device, torch.long)
    if bool(((out < 0) | (out >= len(keys.ACTOR_NAMES))).any()):
        raise ValueError(f"actor values must be keys.ACTOR_* {dict(enumerate(keys.ACTOR_NAMES))}, got {actor}")
    return out


def episode_mask(terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """bool [N]: envs whose episode ended this step (the only place the two are combined for bookkeeping)."""
    return terminated | truncated


class EpisodeTracker:
    """Return, length and success of each env's running episode, and ``info[EPISODE]`` when episodes end.

    Every backend keeps its bookkeeping here: ``add`` once per step, ``stats`` where an episode ended, ``reset``
    the envs that start a new one.

    Args:
        num_envs: N.
        device: where the [N] buffers live.
    """

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self.returns = torch.zeros(num_envs, dtype=torch.float32, device=device)  # summed reward
        self.lengths = torch.zeros(num_envs, dtype=torch.long, device=device)  # control steps
        self.successes = torch.zeros(num_envs, dtype=torch.bool, device=device)  # succeeded at any step

    def add(self, reward: torch.Tensor, success: torch.Tensor) -> None:
        """One step of every env: reward float [N], success bool [N]."""
        self.returns += reward
        self.lengths += 1
        self.successes |= success

    def stats(self) -> dict[str, torch.Tensor]:
        """``info[EPISODE]``: copies of the per-env statistics (valid where an episode ended this step)."""
        return {keys.EP_RETURN: self.returns.clone(), keys.EP_LENGTH: self.lengths.clone(),
                keys.EP_SUCCESS: self.successes.clone()}

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        """Start new episodes in ``env_ids``: int64 indices [K], a bool mask [N] (no device sync), or None (all)."""
        if env_ids is None:
            env_ids = torch.ones_like(self.successes)
        if env_ids.dtype == torch.bool:
            self.returns.masked_fill_(env_ids, 0.0)
            self.lengths.masked_fill_(env_ids, 0)
            self.successes.masked_fill_(env_ids, False)
        else:
            self.returns[env_ids], self.lengths[env_ids], self.successes[env_ids] = 0.0, 0, False

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"returns": self.returns.clone(), "lengths": self.lengths.clone(), "successes": self.successes.clone()}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        for k in ("returns", "lengths", "successes"):
            getattr(self, k).copy_(sd[k])


__all__ = [
    "EpisodeTracker",
    "Obs",
    "ObsSpec",
    "VecEnv",
    "actor_ids",
    "check_action",
    "episode_mask",
    "keys",
    "nonfinite_rows",
    "sanitize_action",
]
