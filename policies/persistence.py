"""A deployable policy on disk: a folder with ``config.json`` (its type and config) and ``model.safetensors``.

Loading refuses, with one ``PolicyFileError`` naming the file, anything that is not exactly what ``save_policy``
wrote for that policy: a config that is not a JSON object of the config's fields, a malformed safetensors file
(``policies/safetensors_check.py``), or weights whose names, shapes or dtypes differ from the policy's.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from policies.base import config_from_dict
from policies.processor import PROCESSOR_FILE, STATS_FILE, Features, Processor
from policies.safetensors_check import MalformedFileError, load_safetensors

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PROCESSOR_PREFIX = "processor."  # the processor's entries in a policy's state dict


class PolicyFileError(MalformedFileError):
    """An exported policy folder whose config or weights are malformed or do not fit each other (path, problem)."""


def _model_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's state dict without its processor (saved beside it in ``processor.safetensors``)."""
    return {k: v for k, v in policy.state_dict().items() if not k.startswith(PROCESSOR_PREFIX)}


def save_policy(policy: Any, path: str | Path) -> None:
    """Write ``config.json`` (type + nested config), ``model.safetensors`` and the processor's two files into the
    folder ``path`` (created if missing)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(json.dumps({"type": policy.type_name, **asdict(policy.cfg)}, indent=2))
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in _model_weights(policy).items()},
              str(path / WEIGHTS_FILE))
    policy.processor.save(path)


def read_config(path: str | Path) -> dict[str, Any]:
    """``config.json`` of a policy folder as a dict; a ``PolicyFileError`` when it is not a JSON object."""
    file = Path(path) / CONFIG_FILE
    try:
        raw = json.loads(file.read_bytes())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PolicyFileError(file, f"not JSON ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(raw, dict):
        raise PolicyFileError(file, f"holds a JSON {type(raw).__name__}, not an object")
    return raw


def check_weights(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor], path: str | Path) -> None:
    """Refuse weights that ``load_state_dict`` would refuse (missing / unexpected names, other shapes) or would
    silently cast (another dtype): ``expected`` is the freshly built policy's state dict."""
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing or extra:
        raise PolicyFileError(path, f"tensor names differ from the policy's: missing {missing[:5]}, "
                                    f"unexpected {extra[:5]}")
    for name, want in expected.items():
        have = got[name]
        if have.shape != want.shape or have.dtype != want.dtype:
            raise PolicyFileError(path, f"tensor {name!r} is {have.dtype} {list(have.shape)}, the policy's config "
                                        f"gives {want.dtype} {list(want.shape)}")


def load_processor(path: str | Path) -> Processor:
    """The processor saved beside a policy's weights (``processor.json`` + ``processor.safetensors``).

    Raises:
        PolicyFileError: either file is missing, malformed, or the statistics do not fit the features.
    """
    path = Path(path)
    file = path / PROCESSOR_FILE
    try:
        raw = json.loads(file.read_bytes())
        proc = Processor(Features(**raw["features"]), raw["normalize"])
    except FileNotFoundError:
        raise PolicyFileError(file, "missing: an exported policy folder holds its processor") from None
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, RecursionError) as e:
        raise PolicyFileError(file, f"not a valid processor ({type(e).__name__}: {str(e)[:160]})") from None
    stats = load_safetensors(path / STATS_FILE, PolicyFileError)
    check_weights(proc.state_dict(), stats, path / STATS_FILE)
    proc.load_state_dict(stats)
    return proc


def load_policy_as(cls: Any, path: str | Path, device: str | torch.device = "cpu") -> Any:
    """A policy of class ``cls`` saved by ``save_policy``, in eval mode; refuses a folder of another type.

    Raises:
        PolicyFileError: the config or the weights are malformed, or do not fit each other.
    """
    path = Path(path)
    raw = read_config(path)
    if raw.pop("type", cls.type_name) != cls.type_name:
        raise PolicyFileError(path / CONFIG_FILE, f"is not a {cls.type_name!r} policy")
    for key, value in getattr(cls.config_class, "ABSENT_KEY_DEFAULTS", {}).items():
        raw.setdefault(key, value)  # a file written before the option existed: built without it
    # The weights file is checked before any model is built: a malformed one is refused in bounded time
    # (RELIABILITY.md F3), while the first model built in a process on the meta device imports torch._dynamo
    # (orthogonal init goes through torch._refs there: ~1.5 s once).
    weights = load_safetensors(path / WEIGHTS_FILE, PolicyFileError)
    try:
        cfg = config_from_dict(cls.config_class, raw)
        with torch.device("meta"):  # shapes and dtypes only: a config asking for huge layers allocates nothing
            expected = _model_weights(cls(cfg))
    except (TypeError, ValueError, KeyError) as e:
        raise PolicyFileError(path / CONFIG_FILE, f"not a valid {cls.type_name!r} config: {str(e)[:200]}") from None
    check_weights(expected, weights, path / WEIGHTS_FILE)
    policy = cls(cfg, load_processor(path))
    policy.load_state_dict({**weights, **{PROCESSOR_PREFIX + k: v for k, v in policy.processor.state_dict().items()}})
    return policy.to(device).eval()
