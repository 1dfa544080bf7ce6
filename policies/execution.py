"""Running any policy one control step at a time, chunked or not: what evaluation, video and deployment call."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from policies import keys
from policies.base import Policy

FROM_POLICY = object()  # ActionQueue's temporal_ensemble default: the policy's own ``temporal_ensemble``


def ensemble_weights(num: int, coeff: float) -> torch.Tensor:
    """ACT's temporal-ensembling weights [num], oldest prediction first: w_i = exp(−coeff · i) / Σ_j exp(−coeff · j).

    ``coeff`` > 0 favours older predictions (ACT's m = 0.01: nearly uniform), < 0 newer ones, 0 is the mean.
    """
    w = torch.exp(-coeff * torch.arange(num, dtype=torch.float64))
    return (w / w.sum()).float()


def add_to_ensemble(total: torch.Tensor, weight: torch.Tensor, count: torch.Tensor, chunk: torch.Tensor,
                    coeff: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One more chunk into ACT's temporal-ensembling sums, row by row, for the same K future steps: ``total`` Σ w·a
    [n, K, A], ``weight`` Σ w [n, K] and ``count`` the predictions so far [n, K]; the i-th prediction for a step
    weighs exp(−m · i) (``ensemble_weights``), m = ``coeff`` [n]. A row whose m is NaN runs as a queue: it restarts
    from this chunk alone. Returns the new (total, weight, count); the step's action is total / weight."""
    queued = coeff.isnan()
    count = torch.where(queued[:, None], 0.0, count)
    w = torch.exp(-torch.nan_to_num(coeff)[:, None] * count)
    total = torch.where(queued[:, None, None], 0.0, total) + w[..., None] * chunk
    weight = torch.where(queued[:, None], 0.0, weight) + w
    return total, weight, count + 1


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


def set_temporal_ensemble(policy: Policy, m: float | None) -> None:
    """Make a chunking policy blend its chunks by ACT's temporal ensembling with coefficient ``m`` (None: run each
    chunk as a queue) for every task (a per-task map, where the config keeps one, gives way); it is then asked every
    executed steps. ``robot-rl eval temporal_ensemble=m``; benchmarks.

    Raises:
        ValueError: the policy acts one step at a time, or its config has no ``temporal_ensemble``.
    """
    horizon = int(policy.horizon)
    if horizon == 1 or not dataclasses.is_dataclass(policy.cfg) or not hasattr(policy.cfg, "temporal_ensemble"):
        raise ValueError(f"bad config: temporal_ensemble={m} is for chunking policies that keep one; this "
                         f"{policy.type_name} policy has horizon {horizon}")
    fields: dict[str, Any] = {"temporal_ensemble": None if m is None else float(m)}
    if hasattr(policy.cfg, "temporal_ensemble_by_task"):  # the per-task values give way to the one asked for
        fields["temporal_ensemble_by_task"] = {}
    policy.cfg = dataclasses.replace(policy.cfg, **fields)


def set_mean_of_samples(policy: Policy, k: int) -> None:
    """Make a sampling policy act with the mean of ``k`` sampled chunks per observation (the flow VLA's
    ``mean_of_samples``; 1: one sample). ``robot-rl eval mean_of_samples=k``; benchmarks.

    Raises:
        ValueError: the policy's config has no ``mean_of_samples``, or k < 1.
    """
    if not dataclasses.is_dataclass(policy.cfg) or not hasattr(policy.cfg, "mean_of_samples"):
        raise ValueError(f"bad config: mean_of_samples={k} is for policies that sample their actions (the flow VLA); "
                         f"this {policy.type_name} policy does not")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"bad config: mean_of_samples={k} must be an int >= 1")
    policy.cfg = dataclasses.replace(policy.cfg, mean_of_samples=k)


def set_sample_reduction(policy: Policy, how: str) -> None:
    """Make a sampling policy reduce its ``mean_of_samples`` sampled chunks per observation to one by ``how``
    ("mean", "median" or "medoid": ``policies.flow_vla.flow.reduce_samples``). ``robot-rl eval
    sample_reduction=...``; benchmarks.

    Raises:
        ValueError: the policy's config has no ``sample_reduction``, or ``how`` is not one of the reductions.
    """
    if not dataclasses.is_dataclass(policy.cfg) or not hasattr(policy.cfg, "sample_reduction"):
        raise ValueError(f"bad config: sample_reduction={how!r} is for policies that sample their actions (the flow "
                         f"VLA); this {policy.type_name} policy does not")
    try:
        policy.cfg = dataclasses.replace(policy.cfg, sample_reduction=how)
    except ValueError as err:
        raise ValueError(f"bad config: {err}") from None


def set_median_actions(policy: Policy, names: list[str]) -> None:
    """Make a sampling policy take the median of its sampled chunks for the action features ``names`` (the mean or
    ``sample_reduction`` for the others; ``policies.flow_vla.flow.reduce_samples``). ``robot-rl eval
    median_actions=[...]``; benchmarks.

    Raises:
        ValueError: the policy's config has no ``median_actions``, or its actions lack one of the names.
    """
    if not dataclasses.is_dataclass(policy.cfg) or not hasattr(policy.cfg, "median_actions"):
        raise ValueError(f"bad config: median_actions={names} is for policies that sample their actions (the flow "
                         f"VLA); this {policy.type_name} policy does not")
    before = policy.cfg
    policy.cfg = dataclasses.replace(policy.cfg, median_actions=list(names))
    try:
        policy.median_dims()
    except ValueError as err:
        policy.cfg = before
        raise ValueError(f"bad config: {err}") from None


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
    ``due``: each env asks again after ``policy.executed_steps_for`` its instruction (``obs["task"]``, when the
    observation carries one; a policy may execute more or fewer steps per task) and runs its chunks in one of two
    modes, per env (``policy.temporal_ensemble_for`` its instruction, unless the queue is given one for all):

    - queue (None): it executes the first executed steps of each chunk;
    - temporal ensembling (a coefficient m, ACT's): it executes, at each step, the weighted mean of every
      prediction any of its chunks made for that step, oldest first, w_i ∝ exp(−m · i) (``ensemble_weights``), so
      consecutive chunks blend smoothly.

    Both keep, per env and future step, Σ w·a and Σ w (a queue's new chunk replaces what it held, with w = 1), so
    envs of both modes step together. Chunks are validated on arrival (shape [n, H, A], finite), so a malformed
    chunk is an error before any of it is executed. Observation entries that are not tensors (``task``: list[str])
    pass through, subset like the tensors. Call ``reset(env_ids)`` when those envs start a new episode (their queue
    and the policy's own per-env state are cleared).

    Args:
        policy: any ``Policy``.
        num_envs: N.
        action_dim: A.
        deterministic: ask the policy for its deterministic action (evaluation, deployment).
        temporal_ensemble: ACT's coefficient m for every env, or None: the queue for every env (default: the
            policy's own, per instruction, as exported); chunking policies only.
        query_every: steps between a chunking policy's calls per env (None: its executed steps).
    """

    def __init__(self, policy: Policy, num_envs: int, action_dim: int, deterministic: bool = True,
                 temporal_ensemble: float | None | object = FROM_POLICY, query_every: int | None = None) -> None:
        self.policy, self.num_envs, self.action_dim, self.deterministic = policy, num_envs, action_dim, deterministic
        self.horizon, self.executed = int(policy.horizon), int(policy.executed_steps)
        if not 1 <= self.executed <= self.horizon:
            raise ValueError(f"{type(policy).__name__}: executed_steps {self.executed} must be in [1, horizon "
                             f"{self.horizon}]")
        self.forced = temporal_ensemble is not FROM_POLICY
        self.ensemble = None if temporal_ensemble is FROM_POLICY or temporal_ensemble is None \
            else float(temporal_ensemble)
        if self.ensemble is not None:
            if self.horizon == 1:
                raise ValueError(f"temporal ensembling needs a chunking policy; {type(policy).__name__} has horizon 1")
            if not math.isfinite(self.ensemble):
                raise ValueError(f"temporal_ensemble must be finite, got {self.ensemble}")
        if query_every is not None and not 1 <= query_every <= self.horizon:
            raise ValueError(f"query_every must be in [1, horizon {self.horizon}], got {query_every}")
        self.query_every = query_every
        self.device = policy.device
        n, h = num_envs, self.horizon
        # steps between an env's calls, per env; pos = steps taken since its last call (>= period: due)
        self.period = torch.full((n,), query_every or self.executed, dtype=torch.long, device=self.device)
        self.pos = torch.full((n,), h, dtype=torch.long, device=self.device)  # all due
        # per env: m of its current episode (NaN: the queue), and per future step Σ w·a, Σ w, predictions so far
        self.coeff = torch.full((n,), math.nan, device=self.device)
        self.chunk = torch.zeros(n, h, action_dim, device=self.device)
        self.weight = torch.zeros(n, h, device=self.device)
        self.count = torch.zeros(n, h, device=self.device)

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        """Drop the queued actions of these envs (all when None) and reset the policy's state for them."""
        ids = slice(None) if env_ids is None else env_ids.to(self.device)
        self.pos[ids] = self.horizon
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
            if self.query_every is None:
                self.period[need] = self._executed(sub, len(need))
            m = self._coefficients(sub, len(need))
            self.coeff[need] = m
            self.chunk[need], self.weight[need], self.count[need] = add_to_ensemble(
                self.chunk[need], self.weight[need], self.count[need], chunk, m)
            self.pos[need] = 0
        action = self.chunk[:, 0] / self.weight[:, 0, None]  # step 0's weighted mean, then every env's future shifts
        for buf in (self.chunk, self.weight, self.count):
            buf[:, :-1] = buf[:, 1:].clone()
            buf[:, -1] = 0.0
        self.pos += 1
        return action

    def _coefficients(self, obs: Mapping[str, Any], n: int) -> torch.Tensor:
        """[n] ensembling coefficients of these envs' episodes (NaN: the queue): the one given to the queue, else
        per instruction where the observation has one (``policy.temporal_ensemble_for``), else the policy's."""
        if self.forced:
            return torch.full((n,), math.nan if self.ensemble is None else self.ensemble, device=self.device)
        tasks = obs.get(keys.TASK)
        if not isinstance(tasks, list | tuple) or len(tasks) != n:
            tasks = [None] * n
        values = [self.policy.temporal_ensemble_for(t) for t in tasks]
        bad = sorted({str(v) for v in values if v is not None and not math.isfinite(v)})
        if bad:
            raise ValueError(f"{type(self.policy).__name__}.temporal_ensemble_for gave {bad}: not finite")
        return torch.tensor([math.nan if v is None else float(v) for v in values], device=self.device)

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
