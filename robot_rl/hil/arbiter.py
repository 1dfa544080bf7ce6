"""Who acts in each env, step by step: the policy, a person (or a scripted expert playing one), or a recovery policy
(DESIGN.md §5). The arbiter turns a trigger's requests (``robot_rl.hil.triggers``) into control, says where control
changed hands (so the caller can reset the expert or drop the policy's queued chunk), mixes the actions and counts
what a HIL report needs: take-overs, steps by actor, interventions per success.

    started, released = arbiter.update(trigger(value))
    applied = arbiter.mix(policy_action, human_action)          # rows of the envs a person drives
    env.step(applied, actor=arbiter.actor)                      # info[ACTOR] and the dataset's ``intervention``
"""

from __future__ import annotations

import torch

from policies import keys


class Arbiter:
    """Control of N envs (CPU tensors). A request hands an env to ``taker`` (``keys.ACTOR_HUMAN`` or
    ``keys.ACTOR_RECOVERY``); with ``latch`` it keeps it until the env's episode ends (``reset``: a scripted expert
    finishing the episode), without it control goes back to the policy as soon as the request stops (a person's
    toggle key).

    Args:
        num_envs: N.
        latch: keep a take-over until the episode ends.
        taker: the actor a request hands control to.
    """

    def __init__(self, num_envs: int, latch: bool, taker: int = keys.ACTOR_HUMAN) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if taker not in (keys.ACTOR_HUMAN, keys.ACTOR_RECOVERY):
            raise ValueError(f"taker must be keys.ACTOR_HUMAN or keys.ACTOR_RECOVERY, got {taker}")
        self.latch, self.taker = latch, taker
        self.taken = torch.zeros(num_envs, dtype=torch.bool)  # control is not the policy's now
        self.who = torch.full((num_envs,), taker, dtype=torch.long)  # who holds it where taken
        self.takeovers = 0  # take-overs started, over all envs
        self.steps = torch.zeros(len(keys.ACTOR_NAMES), dtype=torch.long)  # env steps by actor

    @property
    def actor(self) -> torch.Tensor:
        """int64 [N] of ``keys.ACTOR_*``: who acts this step (for ``env.step(..., actor=)``)."""
        return torch.where(self.taken, self.who, keys.ACTOR_POLICY)

    def update(self, request: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's requests bool [N] -> (started, released) bool [N]: the envs whose control changed hands now.
        Counts the step for each env's actor after the change."""
        request = request.to(torch.bool).cpu()
        before = self.taken
        taken = before | request if self.latch else request | (before & (self.who != self.taker))
        started, released = taken & ~before, before & ~taken
        self.who = torch.where(started, self.taker, self.who)
        self.taken = taken
        self.takeovers += int(started.sum())
        self.steps += torch.bincount(self.actor, minlength=len(keys.ACTOR_NAMES))
        return started, released

    def take(self, envs: torch.Tensor, actor: int) -> None:
        """Hand envs ``envs`` (bool [N]) the policy holds to ``actor`` (a recovery policy), before this step's
        ``update``: they stay its until ``release`` or the episode's end, whatever the requests (a request there does
        not start the taker's turn). Counted as take-overs."""
        envs = envs.to(torch.bool).cpu() & ~self.taken
        self.taken = self.taken | envs
        self.who = torch.where(envs, actor, self.who)
        self.takeovers += int(envs.sum())

    def release(self, envs: torch.Tensor) -> None:
        """Give envs ``envs`` (bool [N]) back to the policy now, from the next ``update`` on."""
        self.taken = self.taken & ~envs.to(torch.bool).cpu()

    def mix(self, policy_action: torch.Tensor, other_action: torch.Tensor) -> torch.Tensor:
        """[N, ...]: ``other_action``'s rows where control is taken, ``policy_action``'s elsewhere."""
        taken = self.taken.to(policy_action.device).view(-1, *([1] * (policy_action.dim() - 1)))
        return torch.where(taken, other_action.to(policy_action.device), policy_action)

    def reset(self, env_ids: torch.Tensor | None) -> None:
        """Envs ``env_ids`` (all: None) start an episode with the policy in control."""
        self.taken[slice(None) if env_ids is None else env_ids.cpu()] = False

    def report(self, successes: int | None = None) -> dict[str, float]:
        """Take-overs, the share of steps not driven by the policy, steps by actor, and take-overs per success when
        ``successes`` is given (None where there was none)."""
        total = max(int(self.steps.sum()), 1)
        out: dict[str, float] = {"takeovers": float(self.takeovers),
                                 "intervention_rate": float(self.steps[1:].sum()) / total,
                                 **{f"steps/{name}": float(n) for name, n in zip(keys.ACTOR_NAMES, self.steps.tolist(),
                                                                                 strict=True)}}
        if successes is not None:
            out["takeovers_per_success"] = self.takeovers / successes if successes else float("nan")
        return out
