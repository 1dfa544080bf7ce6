"""What runs on the robot: policies with their processors, loadable without any algorithm code.

The contract every policy keeps is ``policies.base.Policy``; ``policies.execution.ActionQueue`` runs any of them
one control step at a time (chunked or not).
"""

from __future__ import annotations

from pathlib import Path

import torch

from policies.base import Policy, config_from_dict
from policies.execution import ActionQueue
from policies.flow_vla import FlowVLAConfig, FlowVLAPolicy
from policies.gaussian import GaussianPolicy, GaussianPolicyConfig
from policies.persistence import CONFIG_FILE, PolicyFileError, read_config
from policies.processor import Features, Processor
from policies.tanh_gaussian import TanhGaussianPolicy, TanhGaussianPolicyConfig

POLICY_TYPES: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Make a policy class loadable by ``load_policy`` under its ``type_name`` (usable as a class decorator)."""
    if POLICY_TYPES.get(cls.type_name, cls) is not cls:
        raise ValueError(f"policy type {cls.type_name!r} is already registered by {POLICY_TYPES[cls.type_name]}")
    POLICY_TYPES[cls.type_name] = cls
    return cls


for _cls in (GaussianPolicy, TanhGaussianPolicy, FlowVLAPolicy):
    register_policy(_cls)


def load_policy(path: str | Path, device: str | torch.device = "cpu") -> Policy:
    """Load an exported policy folder by the type named in its ``config.json``.

    Raises:
        FileNotFoundError: ``path`` is not an exported policy folder.
        PolicyFileError: its files are malformed or do not fit each other.
    """
    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{path} holds no {CONFIG_FILE}; expected an exported policy folder")
    kind = read_config(path).get("type")
    if kind not in POLICY_TYPES:
        raise PolicyFileError(path / CONFIG_FILE, f"unknown policy type {kind!r}; known: {sorted(POLICY_TYPES)}")
    return POLICY_TYPES[kind].load(path, device)


__all__ = ["POLICY_TYPES", "ActionQueue", "Features", "FlowVLAConfig", "FlowVLAPolicy", "GaussianPolicy",
           "GaussianPolicyConfig", "Policy", "PolicyFileError", "Processor", "TanhGaussianPolicy",
           "TanhGaussianPolicyConfig", "config_from_dict", "load_policy", "register_policy"]
