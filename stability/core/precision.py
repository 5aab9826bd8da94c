"""Mixed-precision policy: the autocast context and the GradScaler, from the precision section.

fp16 = autocast(float16) + GradScaler; bf16 = autocast(bfloat16), no scaling; fp32 = neither.
One code path: the scaler always exists and is enabled for fp16 alone.
"""

from __future__ import annotations

import contextlib
from enum import StrEnum
from typing import Protocol

import torch

from stability.core.validation import ConfigError


class Precision(StrEnum):
    """The precision names (``precision.name``); the one place they are spelled."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"

    @classmethod
    def parse(cls, value: object, key: str = "precision") -> Precision:
        """The member named ``value``.

        Raises:
            ConfigError: ``value`` names none, with the allowed values.
        """
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r} is invalid: allowed values are "
                              f"{' | '.join(cls)}") from None

    @property
    def scaled(self) -> bool:
        """Whether this precision uses the GradScaler (fp16 alone: bf16 has fp32's range)."""
        return self is Precision.FP16


# Simplest first (no autocast, autocast, autocast with loss scaling): the report's display
# order and the selection's tie-break.
SIMPLEST_FIRST = (Precision.FP32, Precision.BF16, Precision.FP16)

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {
    Precision.FP32: None,
    Precision.FP16: torch.float16,
    Precision.BF16: torch.bfloat16,
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
    if (device == "cuda" and precision == Precision.BF16
            and not torch.cuda.is_bf16_supported()):
        raise ConfigError(
            "precision=bf16 is invalid on this CUDA device (no bfloat16 support): "
            f"allowed values here are {Precision.FP32} | {Precision.FP16}"
        )


def autocast(precision: str, device: str) -> contextlib.AbstractContextManager:
    """The forward-pass context: ``torch.autocast`` for fp16/bf16, a no-op for fp32.

    Args:
        precision: ``fp32`` | ``fp16`` | ``bf16``.
        device: ``cpu`` or ``cuda``.
    """
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=dtype)


class ScalerSettings(Protocol):
    """What the scaler is built from (``config.PrecisionConfig``; config.py imports the enum
    from here, so this module names the fields it reads instead of importing the class)."""

    name: str
    init_scale: float
    growth_interval: int


def make_scaler(precision: ScalerSettings, device: str) -> torch.amp.GradScaler:
    """A GradScaler that is enabled for fp16 only (disabled, every call is a pass-through)."""
    return torch.amp.GradScaler(
        device,
        init_scale=precision.init_scale,
        growth_interval=precision.growth_interval,
        enabled=Precision(precision.name).scaled,
    )


def underflow_counts(grads: list[torch.Tensor]) -> torch.Tensor:
    """``[nonzero, flushed]`` gradient elements (int64, on the gradients' device, no host read):
    nonzero ones, and of those the ones that would flush to zero if stored in fp16 unscaled."""
    if not grads:
        return torch.zeros(2, dtype=torch.int64)
    sums = []
    for g in grads:
        nz = g != 0
        sums += [nz.sum(), (nz & (g.to(torch.float16) == 0)).sum()]
    return torch.stack(sums).view(-1, 2).sum(0)


def fp16_underflow_fraction(grads: list[torch.Tensor]) -> float:
    """Share of nonzero gradient elements that would flush to zero if stored in fp16 unscaled
    (``underflow_counts``, one host read)."""
    nonzero, flushed = underflow_counts(grads).tolist()
    return flushed / nonzero if nonzero else 0.0
