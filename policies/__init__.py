"""What runs on the robot: actors with their normalizers, loadable without any algorithm code."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from policies.gaussian import CONFIG_FILE, GaussianPolicy, GaussianPolicyConfig
from policies.tanh_gaussian import TanhGaussianPolicy, TanhGaussianPolicyConfig

POLICY_TYPES = {p.type_name: p for p in (GaussianPolicy, TanhGaussianPolicy)}


def load_policy(path: str | Path, device: str | torch.device = "cpu") -> torch.nn.Module:
    """Load an exported policy folder (``config.json`` + ``model.safetensors``) by the type in its config."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{path} holds no {CONFIG_FILE}; expected an exported policy folder")
    kind = json.loads((path / CONFIG_FILE).read_text()).get("type")
    if kind not in POLICY_TYPES:
        raise ValueError(f"unknown policy type {kind!r} in {path / CONFIG_FILE}; known: {sorted(POLICY_TYPES)}")
    return POLICY_TYPES[kind].load(path, device)


__all__ = ["GaussianPolicy", "GaussianPolicyConfig", "TanhGaussianPolicy", "TanhGaussianPolicyConfig", "load_policy"]
