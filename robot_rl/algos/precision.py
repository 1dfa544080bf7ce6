"""bf16 mixed precision for the offline learners: where the hardware computes bf16 natively, and the autocast
context an update runs its forward pass in (weights, gradients and optimiser state stay float32)."""

from __future__ import annotations

import contextlib

import torch


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 natively (a CUDA GPU that supports it; a CPU with AVX512-BF16 or AMX)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def check_bf16(enabled: bool, device: torch.device, option: str) -> None:
    """Refuse ``option`` = true where bf16 would be emulated (slower than float32).

    Raises:
        ValueError: naming the option.
    """
    if enabled and not native_bf16(device):
        raise ValueError(f"{option}=true: this {device.type} has no native bf16 (emulated, it would be slower than "
                         f"float32); leave {option}=false")


def bf16_autocast(enabled: bool, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward pass's context: bf16 autocast on ``device`` when enabled, else nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def check_bf16_setting(setting: object, option: str) -> None:
    """Refuse a bf16 setting other than true, false or "auto" (a config's check, before any device is known).

    Raises:
        ValueError: naming ``option`` and the setting.
    """
    if not (isinstance(setting, bool) or setting == "auto"):
        raise ValueError(f"{option} must be true, false or auto, got {setting!r}")


def resolve_bf16(setting: bool | str, device: torch.device, option: str) -> bool:
    """Whether a learner computes in bf16: ``setting`` true (refused without native bf16, ``check_bf16``), false, or
    ``"auto"``: where ``device`` computes bf16 natively, float32 elsewhere.

    Raises:
        ValueError: naming ``option``, for any other setting or a true one on hardware without native bf16.
    """
    check_bf16_setting(setting, option)
    if setting == "auto":
        return native_bf16(device)
    check_bf16(setting, device, option)
    return setting
