"""Typed schemas for the CLI's Hydra configs: YAML composes, these dataclasses check (key names and types)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TrainSettings:
    """Top-level keys of configs/train.yaml (see the comments there)."""

    seed: int = 0
    device: str = "cpu"
    run_dir: str | None = None
    resume: str | None = None
    total_steps: int | None = 3_000_000
    max_minutes: float | None = None
    stop_success_rate: float | None = None
    torch_threads: int = 1
    deterministic: bool = False
    success_window: int = 200

    def __post_init__(self) -> None:
        if self.total_steps is None and self.max_minutes is None:
            raise ValueError("set total_steps or max_minutes: the run needs a stopping rule")
        if self.total_steps is not None and self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1 env steps, got {self.total_steps}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0, got {self.max_minutes}")
        if self.stop_success_rate is not None and not 0.0 < self.stop_success_rate <= 1.0:
            raise ValueError(f"stop_success_rate must be in (0, 1] or null, got {self.stop_success_rate}")
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {self.torch_threads}")


@dataclass
class CheckpointSettings:
    every: int = 50  # iterations
    keep_last: int = 3

    def __post_init__(self) -> None:
        if self.every < 1 or self.keep_last < 1:
            raise ValueError(f"checkpoint.every and checkpoint.keep_last must be >= 1, got {self.every}, "
                             f"{self.keep_last}")


@dataclass
class EvalSettings:
    """Final evaluation: seeded episodes, a video from a camera."""

    enabled: bool = True
    num_episodes: int = 100  # episodes summarized
    num_envs: int = 50  # envs stepped together for them
    seed: int = 10000  # env.reset seed of the evaluation
    video: bool = True
    video_episodes: int = 5  # episodes filmed (env 0)
    camera: str = "front"
    width: int = 320  # px
    height: int = 240  # px

    def __post_init__(self) -> None:
        if self.num_episodes < 1 or self.num_envs < 1 or self.video_episodes < 1:
            raise ValueError("eval.num_episodes, eval.num_envs and eval.video_episodes must be >= 1")
        if self.width < 16 or self.height < 16:
            raise ValueError(f"eval.width and eval.height must be >= 16 px, got {self.width}x{self.height}")


@dataclass
class EvalCommand:
    """configs/eval.yaml."""

    checkpoint: str
    out_dir: str | None = None
    device: str = "cpu"
    num_episodes: int = 100
    num_envs: int = 50
    seed: int = 10000
    video: bool = True
    video_episodes: int = 5
    camera: str = "front"
    width: int = 320
    height: int = 240
    num_threads: int = 2


def typed(cls: type, values: dict[str, Any], where: str) -> Any:
    """``cls(**values)`` through OmegaConf's type checks; errors name the key, the value and what is allowed."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    prefix = f"{where}." if where else ""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), OmegaConf.create(values))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:  # wrong type or unknown key: name it and say what is allowed
        key = f"{prefix}{getattr(e, 'full_key', None) or getattr(e, 'key', None) or ''}"
        msg = str(e).splitlines()[0]
        if isinstance(e, ConfigKeyError):
            msg += f"; allowed keys{' under ' + where if where else ''}: {[f.name for f in dataclasses.fields(cls)]}"
        raise ValueError(f"bad config key {key}: {msg}") from None
    except ValueError as e:  # the dataclass's own validation names the key and the allowed values
        raise ValueError(f"bad config: {e}") from None


def resolve_device(name: str) -> torch.device:
    """cpu | cuda | cuda:<i> | auto -> a device that exists here, else a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"bad config: device={name!r}; allowed: cpu, cuda, cuda:<index>, auto") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"bad config: device={name!r}; allowed: cpu, cuda, cuda:<index>, auto")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"bad config: device={name!r} but CUDA is not available here; use device=cpu")
    return dev
