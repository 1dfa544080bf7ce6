"""Running any policy one control step at a time, chunked or not: what evaluation, video and deployment call."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from policies import keys
from policies.base import Policy


def ensemble_weights(num: int, coeff: float) -> torch.Tensor:
    """ACT's temporal-ensembling weights [num], oldest prediction first: w_i = exp(−coeff · i) / Σ_j exp(−coeff · j).

    ``coeff`` > 0 favours older predictions (ACT's m = 0.01: nearly uniform), < 0 newer ones, 0 is the mean.
    """
    w = torch.exp(-coeff * torch.arange(num, dtype=torch.float64))
    return (w / w.sum()).float()


def set_executed_steps(policy: Policy, k: int) -> None:
    """Make a chunking policy execute ``k`` actions of each chunk, for every task (a per-task map, where the config
    keeps one, gives way). ``robot-rl eval executed_steps=k``; benchmarks sweeping k.

    Raises:
        ValueError: the policy acts one step at a time (or its config has no ``executed_steps``), or k is outside
            [1, horizon].
    """
    horizon = int(policy.horizon)
    if horizon == 1 or not dataclasses.is_dataclass(policy.cfg) or not hasattr(policy.cfg, "executed_steps"):
        raise ValueError(f"bad config: executed_steps={k} is for chunking policies; this {policy.type_name} policy "
                         f"acts one step at a time (horizon {horizon})")
    if not 1 <= k <= horizon:
        raise ValueError(f"bad config: executed_steps={k} must be in [1, horizon {horizon}]")
    fields: dict[str, Any] = {"executed_steps": k}
    if hasattr(policy.cfg, "executed_steps_by_task"):  # the per-task values give way to the one asked for
        fields["executed_steps_by_task"] = {}
    policy.cfg = dataclasses.replace(policy.cfg, **fields)


def subset_obs(obs: Mapping[str, Any], env_ids: torch.Tensor) -> dict[str, Any]:
    """The rows ``env_ids`` of every observation entry: tensors indexed on their first dim, lists and tuples
    (``task``: list[str]) picked element by element; anything else (a str, None) passed as it is."""
    idx: list[int] | None = None
    out: dict[str, Any] = {}
    for k, v in obs.items():
        if isinstance(v, torch.Tensor):
            out[k] = v[env_ids.to(v.device)]
        elif isinstance(v, list | tuple):
            idx = env_ids.tolist() if idx is None else idx
            out[k] = [v[i] for i in idx]
        else:
            out[k] = v
    return out


class ActionQueue:
    """Turns a policy's ``act`` into one action [N, A] per control step.

    A step policy (``horizon == 1``) is asked every step. A chunking policy is asked only for the envs that are
    ``due``, in one of two modes:

    - queue (default): each env executes the first ``executed_steps`` actions of its chunk, then asks again
      (``policy.executed_steps_for`` its instruction, ``obs["task"]``, when the observation carries one: a policy
      may execute more or fewer steps per task);
    - temporal ensembling (``temporal_ensemble=m``, ACT's): each env asks every ``query_every`` steps (1 <=
      query_every <= H) and executes, at each step, the weighted mean of every prediction any of its chunks made
      for that step, oldest first, w_i ∝ exp(−m · i) (``ensemble_weights``), so consecutive chunks blend smoothly.

    Chunks are validated on arrival (shape [n, H, A], finite), so a malformed chunk is an error before any of it
    is executed. Observation entries that are not tensors (``task``: list[str]) pass through, subset like the
    tensors. Call ``reset(env_ids)`` when those envs start a new episode (their queue and the policy's own
    per-env state are cleared).

    Args:
        policy: any ``Policy``.
        num_envs: N.
        action_dim: A.
        deterministic: ask the policy for its deterministic action (evaluation, deployment).
        temporal_ensemble: ACT's coefficient m (None: the plain queue); chunking policies only.
        query_every: steps between a chunking policy's calls per env when ensembling.
    """

    def __init__(self, policy: Policy, num_envs: int, action_dim: int, deterministic: bool = True,
                 temporal_ensemble: float | None = None, query_every: int = 1) -> None:
        self.policy, self.num_envs, self.action_dim, self.deterministic = policy, num_envs, action_dim, deterministic
        self.horizon, self.executed = int(policy.horizon), int(policy.executed_steps)
        if not 1 <= self.executed <= self.horizon:
            raise ValueError(f"{type(policy).__name__}: executed_steps {self.executed} must be in [1, horizon "
                             f"{self.horizon}]")
        self.ensemble = None if temporal_ensemble is None else float(temporal_ensemble)
        if self.ensemble is not None:
            if self.horizon == 1:
                raise ValueError(f"temporal ensembling needs a chunking policy; {type(policy).__name__} has horizon 1")
            if not math.isfinite(self.ensemble) or not 1 <= query_every <= self.horizon:
                raise ValueError(f"temporal_ensemble must be finite ({self.ensemble}) and query_every in [1, horizon "
                                 f"{self.horizon}] ({query_every})")
        self.device = policy.device
        # steps between an env's calls, per env; pos = steps taken from its chunk (>= period: due)
        self.period = torch.full((num_envs,), query_every if self.ensemble is not None else self.executed,
                                 dtype=torch.long, device=self.device)
        self.chunk = torch.zeros(num_envs, self.horizon, action_dim, device=self.device)
        if self.ensemble is not None:  # per env and future step k: Σ w·a, Σ w, number of predictions so far
            self.weight = torch.zeros(num_envs, self.horizon, device=self.device)
            self.count = torch.zeros(num_envs, self.horizon, device=self.device)
        self.pos = torch.full((num_envs,), self.horizon, dtype=torch.long, device=self.device)  # all due

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        """Drop the queued actions of these envs (all when None) and reset the policy's state for them."""
        ids = slice(None) if env_ids is None else env_ids.to(self.device)
        self.pos[ids] = self.horizon
        if self.ensemble is not None:
            self.chunk[ids], self.weight[ids], self.count[ids] = 0.0, 0.0, 0.0
        self.policy.reset(env_ids)

    def due(self) -> torch.Tensor:
        """Env ids [n] (int64, on the policy's device) the next call asks the policy for: their observations
        (images) are read then; the rows of the other envs are not."""
        if self.horizon == 1:
            return torch.arange(self.num_envs, device=self.device)
        return (self.pos >= self.period).nonzero().flatten()

    @torch.no_grad()
    def __call__(self, obs: Mapping[str, Any]) -> torch.Tensor:
        """The action [N, A] to execute now, on the policy's device. ``obs`` holds N rows per entry."""
        obs = {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in obs.items()}
        if self.horizon == 1:
            return self._checked(self.policy.act(obs, deterministic=self.deterministic), self.num_envs)
        need = self.due()
        if len(need):
            sub = obs if len(need) == self.num_envs else subset_obs(obs, need)
            chunk = self._checked(self.policy.act(sub, deterministic=self.deterministic), len(need))
            if self.ensemble is None:
                self.chunk[need] = chunk
                self.period[need] = self._executed(sub, len(need))
            else:  # the i-th prediction for a step (i = predictions made before it) weighs exp(−m·i)
                w = torch.exp(-self.ensemble * self.count[need])
                self.chunk[need] += w[..., None] * chunk
                self.weight[need] += w
                self.count[need] += 1
            self.pos[need] = 0
        if self.ensemble is None:
            action = self.chunk[torch.arange(self.num_envs, device=self.device), self.pos]
        else:  # execute step 0's weighted mean, then shift every env's future one step left
            action = self.chunk[:, 0] / self.weight[:, 0, None]
            for buf in (self.chunk, self.weight, self.count):
                buf[:, :-1] = buf[:, 1:].clone()
                buf[:, -1] = 0.0
        self.pos += 1
        return action

    def _executed(self, obs: Mapping[str, Any], n: int) -> torch.Tensor:
        """[n] actions to execute from each of these envs' new chunks: per instruction where the observation has
        one (``policy.executed_steps_for``), else the policy's ``executed_steps``."""
        tasks = obs.get(keys.TASK)
        if not isinstance(tasks, list | tuple) or len(tasks) != n:
            return torch.full((n,), self.executed, dtype=torch.long, device=self.device)
        steps = [int(self.policy.executed_steps_for(t)) for t in tasks]
        bad = sorted({k for k in steps if not 1 <= k <= self.horizon})
        if bad:
            raise ValueError(f"{type(self.policy).__name__}.executed_steps_for gave {bad}, outside [1, horizon "
                             f"{self.horizon}]")
        return torch.tensor(steps, dtype=torch.long, device=self.device)

    def _checked(self, out: torch.Tensor, n: int) -> torch.Tensor:
        want = (n, self.action_dim) if self.horizon == 1 else (n, self.horizon, self.action_dim)
        if tuple(out.shape) != want:
            raise ValueError(f"{type(self.policy).__name__}.act returned shape {tuple(out.shape)}, expected {want} "
                             f"(horizon {self.horizon}, action_dim {self.action_dim})")
        if not bool(torch.isfinite(out).all()):
            raise ValueError(f"{type(self.policy).__name__}.act returned non-finite actions")
        return out
