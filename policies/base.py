"""The policy contract: what evaluation, video, deployment and export rely on, for every policy type.

A policy maps a batch of observations to actions:

    act(obs: {group: [N, ...]}) -> [N, A]            (a step policy, ``horizon == 1``)
                                -> [N, H, A]         (a chunking policy, ``horizon == H``)

in the action space of the env it was trained for ([-1, 1] for the state policies; joint position targets in
degrees for the flow VLA, whose observations are LeRobot frames holding a ``task`` list[str] beside the tensors),
of which the first ``executed_steps`` actions of a chunk are executed before the policy is asked again
(``policies.execution.ActionQueue`` does that for any policy). ``reset(env_ids)`` clears whatever a policy keeps
per env (frame history, a queued chunk). A policy carries a ``processor`` (its features and normalisation
statistics) and saves as ``config.json`` + ``model.safetensors`` + ``processor.json`` + ``processor.safetensors``
(``policies.persistence``), loadable without any training code.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from policies.processor import Processor


class Policy(nn.Module, ABC):
    """Base of every deployable policy. Subclasses set ``type_name`` and ``config_class`` and build from
    ``(cfg, processor)``; ``processor=None`` builds the default one from the config."""

    type_name: ClassVar[str]
    config_class: ClassVar[type]
    cfg: Any
    processor: Processor

    @property
    def horizon(self) -> int:
        """H: actions returned per ``act`` call (1: ``act`` returns [N, A])."""
        return 1

    @property
    def executed_steps(self) -> int:
        """Actions of each chunk executed before asking again (1 <= executed_steps <= horizon)."""
        return 1

    def executed_steps_for(self, task: str | None) -> int:
        """``executed_steps`` for an episode of this instruction (None: unknown). The default is the same for
        every instruction; a policy may keep a per-task value (``FlowVLAConfig.executed_steps_by_task``)."""
        return self.executed_steps

    @property
    def temporal_ensemble(self) -> float | None:
        """ACT's temporal-ensembling coefficient m for a chunking policy (``policies.execution.ActionQueue``: each
        step executes the weighted mean of every chunk's prediction for it), or None: chunks run as a queue."""
        return None

    def temporal_ensemble_for(self, task: str | None) -> float | None:
        """``temporal_ensemble`` for an episode of this instruction (None: unknown); a policy may keep a per-task
        value (``FlowVLAConfig.temporal_ensemble_by_task``)."""
        return self.temporal_ensemble

    @abstractmethod
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        """Actions in the action space of the env the policy was trained for: [N, A] when ``horizon == 1``, else a
        chunk [N, H, A]. The state policies' are the env's normalised actions in [-1, 1]; the flow VLA's are joint
        position targets in degrees (LeRobot's ``action``, ``policies.keys``)."""

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        """Forget what the policy keeps for these envs (all when None); called when their episodes start."""

    @property
    def device(self) -> torch.device:
        return next(iter(self.parameters()), torch.zeros(())).device

    def save(self, path: str | Path) -> None:
        """Write the exported folder (created if missing)."""
        from policies.persistence import save_policy

        save_policy(self, path)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> Policy:
        """A policy saved by ``save``, in eval mode (normalisers frozen)."""
        from policies.persistence import load_policy_as

        return load_policy_as(cls, path, device)


def config_from_dict[C](cls: type[C], raw: dict[str, Any], where: str = "") -> C:
    """Build the dataclass ``cls`` from a JSON-like dict, nested dataclass fields included (the inverse of
    ``dataclasses.asdict``). Unknown keys are an error naming them and the allowed ones."""
    if not isinstance(raw, dict):
        raise TypeError(f"{where or cls.__name__}: expected a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise TypeError(f"{where or cls.__name__}: unknown keys {unknown}; allowed: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in raw.items():
        sub = _dataclass_of(hints[name])
        values[name] = (config_from_dict(sub, value, f"{where}.{name}" if where else name)
                        if sub is not None and isinstance(value, dict) else value)
    return cls(**values)


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field is typed as (``X`` or ``X | None``), else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        subs = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
        return subs[0] if len(subs) == 1 else None
    return None
