"""The HF Trainer internals our callback uses: two bound methods wrapped on one trainer.

No ``TrainerCallback`` event runs between the last backward of an optimizer step and the
gradient clip, and the callbacks get neither the accelerator nor HF's ``grad_norm``
(transformers 5.24, ``Trainer._inner_training_loop``; docs/integrations.md). So
``wrap_measuring_points`` replaces, on that trainer's instances only (nothing global is
patched), ``accelerator.unscale_gradients`` (measure right after it: the unscaled, not yet
clipped gradients that ``clip_grad_norm_`` then norms and clips) and ``training_step`` (each
micro-batch's loss as the Trainer computed it, and its inputs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stability.compat.gate import VersionGate

GATE = VersionGate(package="transformers", low="5.24", below="6",
                   module="stability/compat/transformers.py",
                   reads="Trainer.training_step(model, inputs, ...) and the hook order of "
                   "Trainer._inner_training_loop")
ACCELERATE_GATE = VersionGate(package="accelerate", low="1.15", below="2",
                              module="stability/compat/transformers.py",
                              reads="Accelerator.unscale_gradients and "
                              "_clip_grad_norm_dtensor_aware, called by clip_grad_norm_")


def wrap_measuring_points(trainer: Any, after_unscale: Callable[[], None],
                          on_loss: Callable[[Any, Any], None]) -> None:
    """Wrap ``trainer``'s ``accelerator.unscale_gradients`` and ``training_step``.

    Args:
        trainer: a ``transformers.Trainer`` (its own instances are changed).
        after_unscale: called right after each ``unscale_gradients`` call.
        on_loss: ``(loss, inputs)`` after each ``training_step`` (the loss it returned).

    Raises:
        RuntimeError: the trainer or its accelerator lacks either method.
    """
    GATE.check()
    ACCELERATE_GATE.check()
    accelerator = getattr(trainer, "accelerator", None)
    unscale = getattr(accelerator, "unscale_gradients", None)
    step = getattr(trainer, "training_step", None)
    if not callable(unscale) or not callable(step):
        raise RuntimeError("this Trainer has no accelerator.unscale_gradients or "
                           f"training_step to measure at: {GATE.why_not() or 'changed'}")

    def unscale_then_measure(*args: Any, **kwargs: Any) -> Any:
        out = unscale(*args, **kwargs)
        after_unscale()
        return out

    def training_step_recorded(*args: Any, **kwargs: Any) -> Any:
        loss = step(*args, **kwargs)
        on_loss(loss, args[1] if len(args) > 1 else kwargs.get("inputs"))
        return loss

    accelerator.unscale_gradients = unscale_then_measure
    trainer.training_step = training_step_recorded


def wrap_clip_norm(trainer: Any, make: Callable[[Any], Any]) -> bool:
    """Replace ``trainer``'s ``accelerator._clip_grad_norm_dtensor_aware`` by ``make(original)``.

    ``clip_grad_norm_`` calls it right after ``unscale_gradients`` when torch.distributed is
    available (else accelerate clips through torch directly and nothing is wrapped), so the
    callback can take the Trainer's own pre-clip norm instead of computing it again.

    Args:
        trainer: a ``transformers.Trainer`` (its accelerator instance is changed).
        make: given the original method, returns its replacement.

    Returns:
        Whether the method was wrapped.

    Raises:
        RuntimeError: torch.distributed is available but the accelerator lacks the method.
    """
    import torch

    ACCELERATE_GATE.check()
    if not torch.distributed.is_available():
        return False
    accelerator = trainer.accelerator
    clip = getattr(accelerator, "_clip_grad_norm_dtensor_aware", None)
    if not callable(clip):
        raise RuntimeError("this accelerator has no _clip_grad_norm_dtensor_aware to take the "
                           f"pre-clip norm from: {ACCELERATE_GATE.why_not() or 'changed'}")
    accelerator._clip_grad_norm_dtensor_aware = make(clip)
    return True
