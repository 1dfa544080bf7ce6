"""The folder a reward model is saved in: its config and scores as JSON beside its weights as safetensors (the progress
model and the success classifier)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import nn

from policies.safetensors_check import MalformedFileError, load_safetensors


def write_model_folder(path: str | Path, module: nn.Module, meta: dict[str, Any], config_file: str,
                       weights_file: str) -> Path:
    """``module``'s weights into ``path/weights_file`` and ``meta`` into ``path/config_file``; returns the folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}, str(path / weights_file))
    (path / config_file).write_text(json.dumps(meta, indent=2) + "\n")
    return path


def load_weights(module: nn.Module, file: Path, error: type[MalformedFileError]) -> None:
    """The weights in ``file`` into ``module``, refused (``error``) unless they are exactly the tensors and shapes its
    config builds."""
    weights = load_safetensors(file, error)
    expected = module.state_dict()
    if set(weights) != set(expected) or any(weights[k].shape != expected[k].shape for k in expected):
        raise error(file, "holds other tensors than its config describes")
    module.load_state_dict(weights)
