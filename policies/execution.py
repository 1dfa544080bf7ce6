"""Running any policy one control step at a time, chunked or not: what evaluation, video and deployment call."""

from __future__ import annotations

import torch

from policies.base import Policy


class ActionQueue:
    """Turns a policy's ``act`` into one action [N, A] per control step.

    A step policy (``horizon == 1``) is asked every step. A chunking policy is asked only for the envs whose
    queue ran out: each env executes the first ``executed_steps`` actions of its chunk, then asks again.
    Chunks are validated on arrival (shape [n, H, A], finite), so a malformed chunk is an error before any of it
    is executed. Call ``reset(env_ids)`` when those envs start a new episode (their queue and the policy's own
    per-env state are cleared).

    Args:
        policy: any ``Policy``.
        num_envs: N.
        action_dim: A.
        deterministic: ask the policy for its deterministic action (evaluation, deployment).
    """

    def __init__(self, policy: Policy, num_envs: int, action_dim: int, deterministic: bool = True) -> None:
        self.policy, self.num_envs, self.action_dim, self.deterministic = policy, num_envs, action_dim, deterministic
        self.horizon, self.executed = int(policy.horizon), int(policy.executed_steps)
        if not 1 <= self.executed <= self.horizon:
            raise ValueError(f"{type(policy).__name__}: executed_steps {self.executed} must be in [1, horizon "
                             f"{self.horizon}]")
        self.device = policy.device
        self.chunk = torch.zeros(num_envs, self.horizon, action_dim, device=self.device)
        self.pos = torch.full((num_envs,), self.executed, dtype=torch.long, device=self.device)  # all empty

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        """Drop the queued actions of these envs (all when None) and reset the policy's state for them."""
        if env_ids is None:
            self.pos.fill_(self.executed)
        else:
            self.pos[env_ids.to(self.device)] = self.executed
        self.policy.reset(env_ids)

    @torch.no_grad()
    def __call__(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The action [N, A] to execute now, on the policy's device."""
        obs = {k: v.to(self.device, non_blocking=True) for k, v in obs.items()}
        if self.horizon == 1:
            return self._checked(self.policy.act(obs, deterministic=self.deterministic), self.num_envs)
        need = (self.pos >= self.executed).nonzero().flatten()
        if len(need):
            sub = obs if len(need) == self.num_envs else {k: v[need] for k, v in obs.items()}
            self.chunk[need] = self._checked(self.policy.act(sub, deterministic=self.deterministic), len(need))
            self.pos[need] = 0
        action = self.chunk[torch.arange(self.num_envs, device=self.device), self.pos]
        self.pos += 1
        return action

    def _checked(self, out: torch.Tensor, n: int) -> torch.Tensor:
        want = (n, self.action_dim) if self.horizon == 1 else (n, self.horizon, self.action_dim)
        if tuple(out.shape) != want:
            raise ValueError(f"{type(self.policy).__name__}.act returned shape {tuple(out.shape)}, expected {want} "
                             f"(horizon {self.horizon}, action_dim {self.action_dim})")
        if not bool(torch.isfinite(out).all()):
            raise ValueError(f"{type(self.policy).__name__}.act returned non-finite actions")
        return out
