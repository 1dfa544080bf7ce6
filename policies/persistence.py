"""A deployable policy on disk: a folder with ``config.json`` (its type and config) and ``model.safetensors``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_policy(policy: torch.nn.Module, type_name: str, cfg: Any, path: str | Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` into the folder ``path`` (created if missing)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(json.dumps({"type": type_name, **asdict(cfg)}, indent=2))
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in policy.state_dict().items()},
              str(path / WEIGHTS_FILE))


def load_policy_as(cls: Any, cfg_cls: Any, path: str | Path, device: str | torch.device = "cpu") -> Any:
    """A policy of class ``cls`` saved by ``save_policy``, in eval mode; refuses a folder of another type."""
    path = Path(path)
    raw = json.loads((path / CONFIG_FILE).read_text())
    if raw.pop("type", cls.type_name) != cls.type_name:
        raise ValueError(f"{path / CONFIG_FILE} is not a {cls.type_name!r} policy")
    policy = cls(cfg_cls(**raw))
    policy.load_state_dict(load_file(str(path / WEIGHTS_FILE)))
    return policy.to(device).eval()
