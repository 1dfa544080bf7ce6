"""When someone other than the policy should act, per env: a trigger reads the value model's V(o_t) [N] once per
control step and says which envs ask for a take-over now (DESIGN.md §5, the HIL intervention agent).

    trigger = ValueStall(window=20, min_slope=0.25 / 150, num_envs=N)   # or ValueThreshold(-0.8, 3, 10, N)
    arbiter = Arbiter(N, latch=True)                                     # robot_rl.hil.arbiter
    started = arbiter.update(trigger(value))                             # each step

Value units are RECAP's (``robot_rl.data.labels``): V = -(steps to success) / M, so an episode on course to succeed
gains 1 / M per step and a predicted failure sits at -1. A person at a take-over key is a trigger too
(``Polled``), so the arbiter, the recorder and the loops treat a key, a schedule and a value model alike; and so
is a person's judgment as a scripted expert plays it in simulation (``ActionGap``: the policy's action strays from
the one the person would give; ``Deadline``: the policy has not finished in time).
"""

from __future__ import annotations

from typing import Protocol

import torch


class Trigger(Protocol):
    """Batched take-over requests over N envs (CPU tensors)."""

    def __call__(self, value: torch.Tensor | None) -> torch.Tensor:
        """What the trigger reads this step: V(o_t) [N] for the value triggers, the action gap [N] for a person's
        judgment (``ActionGap``), None for a device -> bool [N]: asks for a take-over now. Called once per control
        step of every env."""

    def reset(self, env_ids: torch.Tensor | None) -> None:
        """Envs ``env_ids`` (all: None) start a new episode."""


def _per_env(trigger: object, value: torch.Tensor | None, what: str) -> torch.Tensor:
    """``value`` as float32 [N] on the CPU, or a ValueError naming the trigger and what it reads."""
    n = trigger.num_envs  # type: ignore[attr-defined]
    if value is None or value.shape != (n,):
        raise ValueError(f"{type(trigger).__name__} reads {what} [{n}], got {None if value is None else list(value.shape)}")
    return value.detach().float().cpu()


class _Stepped:
    """Per-env steps into the episode (the call count since the env's reset)."""

    def __init__(self, num_envs: int, after: int) -> None:
        if num_envs < 1 or after < 0:
            raise ValueError(f"num_envs must be >= 1 and after >= 0 steps, got {num_envs}, {after}")
        self.num_envs, self.after = num_envs, after
        self.t = torch.zeros(num_envs, dtype=torch.long)

    def _check(self, value: torch.Tensor | None) -> torch.Tensor:
        return _per_env(self, value, "V(o_t)")

    def reset(self, env_ids: torch.Tensor | None) -> None:
        self.t[slice(None) if env_ids is None else env_ids.cpu()] = 0


class ValueThreshold(_Stepped):
    """Asks where V(o_t) < ``threshold`` on ``patience`` consecutive steps, from step ``after`` of the episode on
    (the first ``after`` steps never ask: the value of an episode's first frames says least).

    Args:
        threshold: value units (-1: a predicted failure).
        patience: consecutive steps below it, >= 1.
        after: steps into the episode before it may ask.
        num_envs: N.
    """

    def __init__(self, threshold: float, patience: int, after: int, num_envs: int) -> None:
        super().__init__(num_envs, after)
        if patience < 1:
            raise ValueError(f"patience must be >= 1 step, got {patience}")
        self.threshold, self.patience = float(threshold), int(patience)
        self.below = torch.zeros(num_envs, dtype=torch.long)

    def __call__(self, value: torch.Tensor | None) -> torch.Tensor:
        v = self._check(value)
        self.below = torch.where(v < self.threshold, self.below + 1, torch.zeros_like(self.below))
        fire = (self.t >= self.after) & (self.below >= self.patience)
        self.t += 1
        return fire

    def reset(self, env_ids: torch.Tensor | None) -> None:
        super().reset(env_ids)
        self.below[slice(None) if env_ids is None else env_ids.cpu()] = 0


def window_slopes(values: torch.Tensor) -> torch.Tensor:
    """The Theil-Sen slope per row of ``values`` [N, W] (value units per step): the median, over every pair of steps
    i < j of the window, of (v_j − v_i) / (j − i). One bad frame spoils W − 1 of the W (W − 1) / 2 pairs, fewer than
    half from W = 4 on, so the slope answers to a trend, not to a one-frame dip (a least-squares fit would move by
    the dip times the frame's weight: at the end of a 5-step window, a fifth of it)."""
    w = values.shape[-1]
    if w < 2:
        raise ValueError(f"a slope needs a window of >= 2 steps, got {w}")
    i, j = torch.triu_indices(w, w, offset=1)
    pairs = (values[..., j] - values[..., i]) / (j - i).to(values.dtype)
    return torch.quantile(pairs, 0.5, dim=-1)


class ValueStall(_Stepped):
    """The temporal value-risk trigger: asks where the value has not risen over the last ``window`` steps as an
    episode on course does (Theil-Sen slope < ``min_slope``): sustained decline or stagnation, not a one-frame dip
    (``window_slopes``). Under RECAP's targets an on-course episode's value rises by 1 / M per step (M the value
    scale), so ``min_slope = fraction / M`` asks when progress falls below that fraction of the expected rate.

    Args:
        window: W, steps of value history the slope is fitted to (>= 2); an env asks only once it has W values.
        min_slope: value units per step.
        after: steps into the episode before it may ask.
        num_envs: N.
        ceiling: ask only where V(o_t) is below this too (None: anywhere; a stalled value near 0 is an episode about
            to succeed).
    """

    def __init__(self, window: int, min_slope: float, after: int, num_envs: int,
                 ceiling: float | None = None) -> None:
        super().__init__(num_envs, after)
        if window < 2:
            raise ValueError(f"window must be >= 2 steps, got {window}")
        self.window, self.min_slope, self.ceiling = int(window), float(min_slope), ceiling
        self.history = torch.zeros(num_envs, window)  # the last W values, oldest first

    def __call__(self, value: torch.Tensor | None) -> torch.Tensor:
        v = self._check(value)
        self.history = torch.cat([self.history[:, 1:], v[:, None]], dim=1)
        self.t += 1
        fire = (self.t >= max(self.window, self.after + 1)) & (window_slopes(self.history) < self.min_slope)
        return fire if self.ceiling is None else fire & (v < self.ceiling)

    def reset(self, env_ids: torch.Tensor | None) -> None:
        super().reset(env_ids)
        self.history[slice(None) if env_ids is None else env_ids.cpu()] = 0.0


class ActionGap:
    """How a person watching decides to step in, played by a scripted expert in simulation (HIL-SERL's operator
    takes over when the arm heads the wrong way, corrects it for a moment and hands it back): asks where the gap
    between the policy's action and the one the person would give, RMS over the action's dimensions in the env's
    units ([-1, 1]), has exceeded ``threshold`` on ``patience`` consecutive steps, and keeps asking for ``hold``
    steps from then on (the correction), whatever the gap, after which it needs ``patience`` more such steps to ask
    again. Read it a step late, as a person reacts (``InterventionAgent`` does).

    Args:
        threshold: RMS gap in action units (the policy and the person disagree by more than this).
        patience: consecutive steps over it before asking, >= 1.
        hold: steps a take-over lasts, >= 1.
        num_envs: N.
    """

    def __init__(self, threshold: float, patience: int, hold: int, num_envs: int) -> None:
        if threshold < 0 or patience < 1 or hold < 1 or num_envs < 1:
            raise ValueError(f"need threshold >= 0, patience >= 1, hold >= 1 and num_envs >= 1, got {threshold}, "
                             f"{patience}, {hold}, {num_envs}")
        self.threshold, self.patience, self.hold = float(threshold), int(patience), int(hold)
        self.num_envs = num_envs
        self.over = torch.zeros(num_envs, dtype=torch.long)  # consecutive steps with the gap over the threshold
        self.left = torch.zeros(num_envs, dtype=torch.long)  # steps of the current take-over still to run

    def __call__(self, value: torch.Tensor | None) -> torch.Tensor:
        """``value``: the action gap [N] of this step (not a value estimate) -> bool [N]."""
        gap = _per_env(self, value, "the action gap")
        holding = self.left > 0
        self.over = torch.where(holding | (gap <= self.threshold), torch.zeros_like(self.over), self.over + 1)
        start = ~holding & (self.over >= self.patience)
        self.left = torch.where(start, torch.full_like(self.left, self.hold), self.left)
        fire = self.left > 0
        self.left = (self.left - 1).clamp(min=0)
        self.over = torch.where(start, torch.zeros_like(self.over), self.over)
        return fire

    def reset(self, env_ids: torch.Tensor | None) -> None:
        ids = slice(None) if env_ids is None else env_ids.cpu()
        self.over[ids] = 0
        self.left[ids] = 0


class Deadline(_Stepped):
    """A person who lets the policy try and finishes what it has not done in time: asks from step ``after`` of an
    episode until the episode ends (success ends it in the tasks that terminate on success). Reads nothing. As the
    policy learns to finish sooner, the person is asked less (HIL-SERL's interventions fade the same way).

    Args:
        after: steps into the episode the policy has alone.
        num_envs: N.
    """

    def __init__(self, after: int, num_envs: int) -> None:
        super().__init__(num_envs, after)

    def __call__(self, value: torch.Tensor | None = None) -> torch.Tensor:
        fire = self.t >= self.after
        self.t += 1
        return fire


def action_gap(policy_action: torch.Tensor, other_action: torch.Tensor) -> torch.Tensor:
    """RMS over the last dimension of the difference of two actions [N, A] -> [N] (``ActionGap``'s input)."""
    return (policy_action.float() - other_action.float()).pow(2).mean(dim=-1).sqrt()


class Polled:
    """A person's take-over device as a trigger of one env: ``source.engaged()`` (a key or pedal toggle, a schedule:
    ``real.teleop``'s take-over sources) polled once per step; reads no value."""

    def __init__(self, source: object) -> None:
        self.source = source

    def __call__(self, value: torch.Tensor | None = None) -> torch.Tensor:
        return torch.tensor([bool(self.source.engaged())])

    def reset(self, env_ids: torch.Tensor | None) -> None:
        pass  # the person decides; an episode boundary changes nothing
