"""Mixed-precision policy: the autocast context and the GradScaler, from one ``StepConfig``."""

from __future__ import annotations

import contextlib

import torch

from stability.core.config import ConfigError, StepConfig

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


def resolve_device(requested: str) -> str:
    """Map ``auto|cpu|cuda`` to a concrete device, refusing one that is not there."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device=cuda is invalid: no CUDA device is available (allowed: auto | cpu)"
        )
    if requested not in ("cpu", "cuda"):
        raise ConfigError(f"device={requested!r} is invalid: allowed values are auto | cpu | cuda")
    return requested


def check_precision_supported(precision: str, device: str) -> None:
    """Fail early when ``device`` cannot run ``precision``."""
    if device == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            "precision=bf16 is invalid on this CUDA device (no bfloat16 support): "
            "allowed values here are fp32 | fp16"
        )


def autocast(config: StepConfig) -> contextlib.AbstractContextManager:
    """The forward-pass context: ``torch.autocast`` for fp16/bf16, a no-op for fp32."""
    dtype = AUTOCAST_DTYPES[config.precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=config.device, dtype=dtype)


def make_scaler(config: StepConfig) -> torch.amp.GradScaler:
    """A GradScaler that is enabled for fp16 only (disabled, every call is a pass-through)."""
    return torch.amp.GradScaler(
        config.device,
        init_scale=config.init_scale,
        growth_interval=config.growth_interval,
        enabled=config.scaler_enabled,
    )


def fp16_underflow_fraction(grads: list[torch.Tensor]) -> float:
    """Share of nonzero gradient elements that would flush to zero if stored in fp16 unscaled."""
    nonzero = 0
    flushed = 0
    for g in grads:
        nz = g != 0
        nonzero += int(nz.sum())
        flushed += int((nz & (g.to(torch.float16) == 0)).sum())
    return flushed / nonzero if nonzero else 0.0
