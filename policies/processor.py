"""A policy's processor: the names and shapes of what it reads and writes, and its normalisation statistics.

It travels with the weights (``processor.json`` + ``processor.safetensors`` in the exported folder), so a policy
can refuse, at start-up, observations that do not match what it was trained on, and so LeRobot-style feature
names (``observation.state``'s joint names, the action's joint names) are known without the training code.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from policies.normalizer import EmpiricalNormalizer

PROCESSOR_FILE = "processor.json"
STATS_FILE = "processor.safetensors"


@dataclass
class Features:
    """What a policy reads and writes.

    ``inputs`` maps each observation group the policy reads to its per-env shape; ``names`` may name the elements
    of flat groups (e.g. the six joint names of ``proprio``); ``action_names`` names the action dimensions.
    """

    inputs: dict[str, list[int]]  # observation group -> shape without the batch dimension
    action_dim: int  # A
    names: dict[str, list[str]] = field(default_factory=dict)  # observation group -> element names (optional)
    action_names: list[str] = field(default_factory=list)  # optional; len == action_dim when given

    def __post_init__(self) -> None:
        self.inputs = {k: [int(d) for d in v] for k, v in self.inputs.items()}
        if self.action_names and len(self.action_names) != self.action_dim:
            raise ValueError(f"{len(self.action_names)} action names for action_dim {self.action_dim}")
        for group, names in self.names.items():
            if group not in self.inputs:
                raise ValueError(f"names given for {group!r}, which is not an input ({sorted(self.inputs)})")
            if len(self.inputs[group]) != 1 or len(names) != self.inputs[group][0]:
                raise ValueError(f"{len(names)} names for input {group!r} of shape {self.inputs[group]}")


def _module_key(group: str) -> str:
    return group.replace(".", "__")  # ModuleDict keys may not hold dots ("image.front")


class Processor(nn.Module):
    """Checks observations against ``features`` and normalises the groups listed in ``normalize``.

    Normalisers are empirical (running mean and variance, ``policies.normalizer``); their statistics change only
    through ``update`` in training mode and are saved in ``processor.safetensors``.

    Args:
        features: the policy's inputs and outputs.
        normalize: observation groups to normalise (each must be an input).
    """

    def __init__(self, features: Features, normalize: list[str] | tuple[str, ...] = ()) -> None:
        super().__init__()
        unknown = sorted(set(normalize) - set(features.inputs))
        if unknown:
            raise ValueError(f"cannot normalise {unknown}: not inputs of the policy ({sorted(features.inputs)})")
        self.features = features
        self.normalized = list(normalize)
        self.normalizers = nn.ModuleDict(
            {_module_key(g): EmpiricalNormalizer(tuple(features.inputs[g])) for g in self.normalized})

    def check(self, obs: dict[str, torch.Tensor]) -> None:
        """Raise a ValueError naming the group when ``obs`` lacks an input or its shape differs."""
        for group, shape in self.features.inputs.items():
            if group not in obs:
                raise ValueError(f"the policy reads observation group {group!r}, which the env does not give "
                                 f"(it gives {sorted(obs)})")
            if list(obs[group].shape[1:]) != shape:
                raise ValueError(f"observation group {group!r} has shape {list(obs[group].shape[1:])} per env, "
                                 f"the policy was trained on {shape}")

    @torch.no_grad()
    def update(self, obs: dict[str, torch.Tensor]) -> None:
        """Merge a batch into the running statistics (a no-op in eval mode)."""
        for group in self.normalized:
            self.normalizers[_module_key(group)].update(obs[group])

    def forward(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The input groups, normalised where configured: {group: [B, ...]}."""
        return {g: (self.normalizers[_module_key(g)](obs[g]) if g in self.normalized else obs[g])
                for g in self.features.inputs}

    # ------------------------------------------------------------------------------------------ persistence
    def save(self, path: Path) -> None:
        """Write ``processor.json`` (features, normalised groups) and ``processor.safetensors`` (statistics); read
        back by ``policies.persistence.load_processor``."""
        (path / PROCESSOR_FILE).write_text(json.dumps({"features": asdict(self.features),
                                                       "normalize": self.normalized}, indent=2))
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in self.state_dict().items()},
                  str(path / STATS_FILE))
