"""Deliberate faults that exercise the skip path, installed into ``TrainStep`` as a hook.

The step itself has no fault logic: the run loop installs a ``FaultInjector`` when the
config asks for one (``fault.*``, 1-based optimizer-step indices).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from stability.core.config import FaultConfig

# A x1e8 target spike gives a huge loss: finite in fp32 and bf16 (the BCE/MSE of such targets
# is ~1e8, far below float32's max), but its gradients overflow fp16's range (65504) once scaled.
LOSS_SPIKE_FACTOR = 1e8


class FaultInjector:
    """``StepHook`` that multiplies targets at one step and writes inf into a gradient at one.

    Args:
        fault: which optimizer steps to disturb.
    """

    def __init__(self, fault: FaultConfig) -> None:
        self.fault = fault

    @property
    def active(self) -> bool:
        """Whether any fault is configured (the loop installs the hook only then)."""
        return self.fault.loss_spike_at_step is not None or self.fault.inf_grad_at_step is not None

    def on_micro_batch(self, step: int, x: torch.Tensor,
                       y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Spike the targets of every micro-batch of ``fault.loss_spike_at_step``."""
        if step == self.fault.loss_spike_at_step:
            return x, y * LOSS_SPIKE_FACTOR
        return x, y

    def on_gradients(self, step: int, params: Sequence[nn.Parameter]) -> None:
        """Write inf into the first gradient element at ``fault.inf_grad_at_step``."""
        if step == self.fault.inf_grad_at_step:
            next(p for p in params if p.grad is not None).grad.view(-1)[0] = math.inf
