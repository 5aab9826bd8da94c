"""The loop under check, as an adapter, and the fresh state each probe hands it.

A loop is a *step function* (``StepFn``)::

    def step(rig: Rig, window: Sequence[tuple[x, y]]) -> bool   # True: the step was taken

It trains one optimizer step over ``window`` (1..``rig.accum_steps`` micro-batches) using
``rig.model``, ``rig.optimizer``, ``rig.scheduler`` (may be None), ``rig.scaler`` (a GradScaler,
enabled for fp16 only), ``rig.loss_fn`` (``loss_fn(output, y)``: the task's loss, a mean over the
micro-batch), ``rig.precision`` (fp32 | fp16 | bf16: the autocast it should use) and
``rig.max_norm`` (clip the global L2 norm to it; None: no clipping). It returns whether the
optimizer step was taken (False: skipped on non-finite gradients). ``ours`` is our loop
(``core.step.TrainStep``); a user's plain loop is any function of that signature
(``stability check loop=my_module.my_step``).

Every probe builds its ``Rig`` from the same seeded initial weights (``Template``): a deepcopy of
the model and a fresh optimizer, so no probe sees another's steps.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from stability.core.config import ClipConfig, PrecisionConfig
from stability.core.precision import make_scaler
from stability.core.step import MicroBatch, TrainStep

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Rig:
    """The mutable training state one probe gives the loop (see the module docstring)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    scaler: torch.amp.GradScaler
    loss_fn: LossFn
    precision: str
    max_norm: float | None
    accum_steps: int
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)  # a loop's own per-rig state


StepFn = Callable[[Rig, Sequence[MicroBatch]], bool]


@dataclass(frozen=True)
class Template:
    """The initial weights every probe starts from, and how to build the rest around them.

    Attributes:
        model: the task's model right after seeding (never trained: probes deepcopy it).
        loss_fn: the task's loss.
        seed: the training seed the model was built under.
    """

    model: nn.Module
    loss_fn: LossFn
    seed: int

    def rig(self, *, precision: str = "fp32", max_norm: float | None = None,
            accum_steps: int = 1, optimizer: str = "sgd", lr: float = 0.05,
            scheduler: bool = False, init_scale: float = 2.0**16) -> Rig:
        """A fresh ``Rig`` on a deepcopy of the initial weights.

        ``optimizer="sgd"`` (plain, no momentum) makes the update proportional to the gradient,
        so a gradient scale error shows in the parameters; Adam's first update is about
        ``lr * sign(g)`` and would hide it. ``adamw`` gives optimizer state to check.
        """
        model = copy.deepcopy(self.model)
        params = list(model.parameters())
        opt: torch.optim.Optimizer = (torch.optim.SGD(params, lr=lr) if optimizer == "sgd"
                                      else torch.optim.AdamW(params, lr=lr * 0.02))
        sched = (torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
                 if scheduler else None)
        scaler = make_scaler(PrecisionConfig(name=precision, init_scale=init_scale), "cpu")
        scaler.scale(torch.zeros(()))  # the scale tensor exists before the first step
        return Rig(model, opt, sched, scaler, self.loss_fn, precision, max_norm, accum_steps)


def ours(rig: Rig, window: Sequence[MicroBatch]) -> bool:
    """Our loop: ``core.step.TrainStep`` on the rig's state (its scaler is the rig's)."""
    trainer = rig.extra.get("trainer")
    if trainer is None:
        clip = (ClipConfig(enabled=True, max_norm=rig.max_norm) if rig.max_norm is not None
                else ClipConfig())
        trainer = TrainStep(rig.model, rig.optimizer, rig.loss_fn,
                            precision=PrecisionConfig(name=rig.precision),
                            clip=clip, accum_steps=rig.accum_steps, scheduler=rig.scheduler)
        trainer.scaler = trainer.meter.scaler = rig.scaler
        rig.extra["trainer"] = trainer
    return not trainer.step(window).skipped


def gradients_at_step(rig: Rig) -> list[list[torch.Tensor]]:
    """Install a step pre-hook on the rig's optimizer; the list gets the gradients each
    ``optimizer.step`` sees (unscaled: ``scaler.step`` unscales before it steps)."""
    seen: list[list[torch.Tensor]] = []

    def hook(opt: torch.optim.Optimizer, *_: Any) -> None:
        seen.append([torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                     for g in opt.param_groups for p in g["params"]])

    rig.optimizer.register_step_pre_hook(hook)
    return seen


def flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors as one float64 vector (errors are measured in float64)."""
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def params_of(model: nn.Module) -> torch.Tensor:
    """The model's parameters as one float64 vector."""
    return flat(list(model.parameters()))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` (inf when ``b`` is zero and ``a`` is not)."""
    den = float(b.norm())
    num = float((a - b).norm())
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))
