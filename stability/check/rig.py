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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from stability.core.config import ClipConfig, PrecisionConfig
from stability.core.precision import autocast, make_scaler
from stability.core.step import MicroBatch, TrainStep

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
BatchLoss = Callable[[nn.Module, Any], torch.Tensor]


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
        loss_of: a trainer task's own loss of a batch (a Lightning ``training_step``).
        grad_of: the gradient of the loss over one batch as the trainer itself computes it
            (a Lightning fit of one step, so ``self.trainer`` and ``self.optimizers()``
            work in the user's hooks); None: a backward of ``loss``.
        join: the window's micro-batches as one batch (a task's dynamic-padding collator
            over all their samples); None: ``concat``.
        known: ``(model, window) -> {fault: gradient scale}`` of the trainer's own known
            faults (``integrations.protocol.Probe.known``); None: none.
    """

    model: nn.Module
    loss_fn: LossFn
    seed: int
    loss_of: BatchLoss | None = None
    grad_of: Callable[[Template, Any], list[torch.Tensor]] | None = None
    join: Callable[[Sequence[Any]], Any] | None = None
    known: Callable[[nn.Module, Sequence[Any]], Mapping[str, float]] | None = None

    def loss(self, model: nn.Module, batch: Any, precision: str = "fp32") -> torch.Tensor:
        """The task's loss of ``model`` on ``batch``: the forward under ``precision``'s
        autocast, the loss in fp32. ``loss_of`` (a trainer task's own loss: a Lightning
        ``training_step``, an HF model's ``.loss``) when set, else ``loss_fn(model(x), y)``."""
        with autocast(precision, "cpu"):
            if self.loss_of is not None:
                return _wide(self.loss_of(model, batch))
            out = model(batch[0])
        return self.loss_fn(_wide(out), batch[1])

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


def _wide(t: torch.Tensor) -> torch.Tensor:
    # fp16/bf16 up to fp32; fp32 and float64 (the accumulation probe's reference) as they are
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


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
    """Install a step post-hook on the rig's optimizer; the list gets the gradients each
    ``optimizer.step`` used (unscaled: ``scaler.step`` unscales before it steps).

    A post-hook, not a pre-hook: a trainer may pass the forward/backward as the step's closure
    (Lightning's fp32 ``optimizer.step(closure)``), so the gradients exist only inside the step.
    """
    seen: list[list[torch.Tensor]] = []

    def hook(opt: torch.optim.Optimizer, *_: Any) -> None:
        seen.append([torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                     for g in opt.param_groups for p in g["params"]])

    rig.optimizer.register_step_post_hook(hook)
    return seen


def concat(window: Sequence[Any]) -> Any:
    """The window's micro-batches as one batch (tuples/lists and dicts of tensors)."""
    first = window[0]
    if isinstance(first, dict):
        return {k: torch.cat([m[k] for m in window]) for k in first}
    if isinstance(first, list | tuple):
        return type(first)(torch.cat(parts) for parts in zip(*window, strict=True))
    return torch.cat(list(window))


def size(batch: Any) -> int:
    """The number of samples in a batch (its first tensor's length; any mapping)."""
    if isinstance(batch, Mapping):
        return len(next(iter(batch.values())))
    return len(batch[0]) if isinstance(batch, list | tuple) else len(batch)


def to_dtype(batch: Any, dtype: torch.dtype) -> Any:
    """The batch with its floating-point tensors in ``dtype`` (ids and labels unchanged)."""
    def one(t: Any) -> Any:
        return t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
    if isinstance(batch, dict):
        return {k: one(v) for k, v in batch.items()}
    return type(batch)(one(t) for t in batch) if isinstance(batch, list | tuple) else one(batch)


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
