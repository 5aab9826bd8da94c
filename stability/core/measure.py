"""The step's measurements, for any training loop: norms, finiteness, clipping, scale.

``measure`` turns (parameters holding unscaled gradients, the clip setting, the GradScaler)
into plain numbers, clipping in place on the way. Call it between ``scaler.unscale_`` and
``scaler.step``; it needs neither our loop nor a tracker. ``StepMeter`` adds the step index,
the cumulative skip count and the fp16 underflow sampling, and returns the ``StepLog`` that
``TrainStep`` returns for the same step. A plain PyTorch loop gets the same telemetry::

    meter = StepMeter(ClipConfig(enabled=True, max_norm=1.0), scaler)
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        log = meter.step(model, loss, lr=opt.param_groups[0]["lr"], samples=len(y))
        if not log.skipped:
            scaler.step(opt)
        scaler.update()

(``scaler = torch.amp.GradScaler("cpu", enabled=False)`` outside fp16; ``TrainStep`` also
hands in every micro-batch's loss, ``losses=``, so that a non-finite loss skips the step even
when its gradients came out finite.)

Host reads (a device sync on CUDA) per call, pinned by tests/core/test_measure.py and
tests/core/test_host_reads.py: one ``.tolist()`` of ``[pre, post, loss, scale, underflow counts,
each micro-batch's loss]`` (whichever apply), which decides the skip and carries everything
logged; plus one finiteness read before value clipping (``clip.method=value`` only). The read
cannot be deferred: the host must know the skip before the optimizer steps (torch's optimizers
and LR schedulers take no device-side predicate). Non-finite gradients are never clipped: a
skipped step leaves them as they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

import torch
from torch import nn

from stability.core.clipping import (
    clip_by_norm_,
    clip_by_value_,
    grad_norms,
)
from stability.core.config import ClipConfig
from stability.core.precision import underflow_counts
from stability.core.steplog import SkipReason, StepLog, build


@dataclass(frozen=True)
class Measurement:
    """What ``measure`` found on one optimizer step's gradients (plain Python values).

    A field named as a ``StepLog`` field is that field's value in the step's record
    (``StepMeter.log`` copies them by name); ``finite`` decides the skip.
    """

    grad_l2_pre_clip: float  # global L2 norm of the unscaled gradients (inf/nan: not finite)
    grad_l2_post_clip: float  # after clipping (== pre when nothing was clipped)
    loss: float  # the loss handed in, read together with the norms
    finite: bool  # every gradient element is finite: the step may be taken
    clipped: bool  # clipping changed the gradients
    scaler_scale: float  # the loss scale of this step's backward (1.0 without fp16)
    underflow_frac: float = math.nan  # fp16 underflow share, when sampled
    nonfinite_param: str = ""  # the first parameter with a non-finite gradient, when skipped
    # every micro-batch loss handed in (``losses=``) was finite; when not, ``loss`` is the
    # first non-finite one and ``finite`` is False (the step must be skipped)
    loss_finite: bool = True


# The Measurement fields that are StepLog fields of the same name.
RECORDED = tuple(f.name for f in fields(Measurement)
                 if f.name in {g.name for g in fields(StepLog)})
_recorded = attrgetter(*RECORDED)  # their values, in RECORDED's order


def unmeasured(loss: float, scale: float) -> Measurement:
    """The ``Measurement`` of a step skipped before its gradients existed (a non-finite loss
    skips the backward): no norms (NaN), nothing clipped, the loss and the loss scale."""
    return Measurement(grad_l2_pre_clip=math.nan, grad_l2_post_clip=math.nan, loss=loss,
                       finite=False, clipped=False, scaler_scale=scale)


def _named(model: nn.Module) -> Iterable[tuple[str, nn.Parameter]]:
    # DistributedDataParallel prefixes every name with "module.": report the model's own names.
    return getattr(model, "module", model).named_parameters()


def _first_non_finite(model: nn.Module, with_grad: list[nn.Parameter],
                      per_tensor: torch.Tensor) -> str:
    """The model's first parameter (in its own order) whose gradient was non-finite before
    clipping, from the per-tensor norms taken then (value clipping turns inf into a finite
    bound, so the gradients themselves can no longer tell). A read only on the skip path."""
    bad = (~torch.isfinite(per_tensor)).tolist()
    index = {id(p): i for i, p in enumerate(with_grad)}
    for name, p in _named(model):
        i = index.get(id(p))
        if i is not None and bad[i]:
            return name
    return ""


def _scale_tensor(scaler: torch.amp.GradScaler) -> torch.Tensor:
    # The scale as a device tensor (what get_scale() reads with .item()): read with the rest.
    get = getattr(scaler, "_get_scale_async", None)
    scale = get() if get is not None else None
    if scale is None:
        return torch.tensor(scaler.get_scale())
    return scale


def measure(params: Iterable[nn.Parameter], clip: ClipConfig,
            scaler: torch.amp.GradScaler | None = None, *,
            loss: torch.Tensor | float = math.nan, model: nn.Module | None = None,
            sample_underflow: bool = False, losses: torch.Tensor | None = None) -> Measurement:
    """Measure (and clip in place) the unscaled gradients of one optimizer step.

    Call after ``scaler.unscale_(optimizer)`` (or after backward without a scaler) and before
    the optimizer step. Clipping runs once, on finite gradients only (clipping inf yields nan).

    Args:
        params: the parameters being optimized, in the optimizer's order.
        clip: the clip setting (``enabled``, ``method`` = norm | value, thresholds).
        scaler: the GradScaler, or None; a disabled one counts as none (scale 1.0).
        loss: the step's loss (a 0-d tensor is read in the same host read as the norms).
        model: names the first non-finite parameter of a skipped step (``""`` without it).
        sample_underflow: measure the fp16 underflow share (enabled scaler only).
        losses: each micro-batch's loss (1-d, on the device), read in the same host read:
            a non-finite one makes the step a skip (``loss_finite`` False, ``loss`` that one).

    Returns:
        The ``Measurement``; take the optimizer step only if ``finite``.
    """
    with_grad = [p for p in params if p.grad is not None]
    grads = [p.grad for p in with_grad]
    scaling = scaler is not None and scaler.is_enabled()
    per_tensor, pre = grad_norms(grads)
    # The underflow share describes the raw unscaled gradients, so it is sampled before
    # clipping (clipped gradients are smaller and would inflate it).
    sampled = scaling and sample_underflow
    # Norm clipping runs before the host knows whether the gradients are finite, so that one
    # host read serves both the skip decision and the log: ``clip_by_norm_`` leaves
    # non-finite gradients untouched on the device. Value clipping would turn inf into a
    # finite bound (hiding which gradient went bad), so it decides first: one more read.
    counts = underflow_counts(grads) if sampled else None
    post = pre
    if clip.enabled and clip.method == "norm":
        post = clip_by_norm_(grads, pre, clip.max_norm)
    elif clip.enabled and bool(torch.isfinite(pre)):
        post = clip_by_value_(grads, clip.clip_value)
    # One host read for the decision and everything logged (a device sync on CUDA), in
    # float64: exact for the float32 norms, losses and scale and for the integer counts.
    # The loss rides along when it is a tensor (our loop); a trainer callback passes a float.
    head = [pre, post] + ([loss.detach().float().to(pre.device)]
                          if isinstance(loss, torch.Tensor) else [])
    if scaling:
        head.append(_scale_tensor(scaler).to(pre.device))
    parts = [torch.stack(head).double()]
    if counts is not None:
        parts.append(counts.to(pre.device).double())
    if losses is not None:
        parts.append(losses.detach().to(pre.device).double().reshape(-1))
    values = (parts[0] if len(parts) == 1 else torch.cat(parts)).tolist()
    pre_f, post_f = values[0], values[1]
    at = 2
    loss_f = values[at] if isinstance(loss, torch.Tensor) else float(loss)
    at += isinstance(loss, torch.Tensor)
    scale = values[at] if scaling else 1.0
    at += scaling
    underflow = math.nan
    if counts is not None:
        nonzero, flushed = values[at], values[at + 1]
        underflow = flushed / nonzero if nonzero else 0.0
        at += 2
    bad_loss = next((v for v in values[at:] if not math.isfinite(v)), None)
    # A non-finite norm is exactly "some gradient element is inf/nan" (up to float32 overflow).
    finite = math.isfinite(pre_f) and bad_loss is None
    if not finite:
        post_f, underflow = pre_f, math.nan  # nothing was clipped or sampled that counts
    if bad_loss is not None:
        return Measurement(grad_l2_pre_clip=pre_f, grad_l2_post_clip=post_f, loss=bad_loss,
                           finite=False, clipped=False, scaler_scale=scale,
                           underflow_frac=math.nan, nonfinite_param="", loss_finite=False)
    nonfinite = "" if finite or model is None else _first_non_finite(model, with_grad, per_tensor)
    return Measurement(grad_l2_pre_clip=pre_f, grad_l2_post_clip=post_f, loss=loss_f,
                       finite=finite, clipped=finite and clip.enabled and post_f < pre_f,
                       scaler_scale=scale, underflow_frac=underflow, nonfinite_param=nonfinite)


class StepMeter:
    """Counts optimizer steps and skips and builds each step's ``StepLog`` (``TrainStep``'s).

    Args:
        clip: the clip setting.
        scaler: the GradScaler, or None.
        underflow_every: sample the fp16 underflow share on step 1 and every N steps.
    """

    def __init__(self, clip: ClipConfig, scaler: torch.amp.GradScaler | None = None,
                 underflow_every: int = 25) -> None:
        self.clip = clip
        self.scaler = scaler
        self.underflow_every = underflow_every
        self.step_count = 0  # optimizer steps attempted (taken or skipped)
        self.skip_count = 0  # of which skipped

    def samples_underflow(self, step: int) -> bool:
        """Whether step ``step`` measures the fp16 underflow share (step 1 and every N)."""
        return step == 1 or step % self.underflow_every == 0

    def begin(self) -> int:
        """Start the next optimizer step; returns its 1-based index."""
        self.step_count += 1
        return self.step_count

    def step(self, model: nn.Module, loss: torch.Tensor | float, *, lr: float,
             micro_batches: int = 1, samples: int = 0,
             params: Iterable[nn.Parameter] | None = None) -> StepLog:
        """Measure (and clip) this step's unscaled gradients; its ``StepLog``.

        Call between ``scaler.unscale_`` and ``scaler.step``; step only if not ``skipped``.
        ``params`` defaults to the model's (pass the optimizer's when they differ).
        """
        step = self.begin()
        m = measure(model.parameters() if params is None else params, self.clip, self.scaler,
                    loss=loss, model=model, sample_underflow=self.samples_underflow(step))
        reason = SkipReason.NONE
        if not m.finite:
            reason = (SkipReason.NONFINITE_GRAD if math.isfinite(m.loss)
                      else SkipReason.NONFINITE_LOSS)
        return self.log(step=step, lr=lr, skip=reason, micro_batches=micro_batches,
                        samples=samples, measured=m)

    def log(self, *, step: int, lr: float, skip: SkipReason, micro_batches: int, samples: int,
            measured: Measurement, **override: Any) -> StepLog:
        """The ``StepLog`` of step ``step`` (a skip is counted here, once).

        Args:
            step: the 1-based optimizer-step index (``begin``'s).
            lr: the learning rate the step used.
            skip: why the step was not taken (``SkipReason.NONE``: taken).
            micro_batches: micro-batches accumulated into the step.
            samples: samples in them.
            measured: the step's ``Measurement`` (``unmeasured`` for a step skipped before its
                backward); its fields named as ``StepLog`` fields are copied (``RECORDED``).
            **override: ``StepLog`` fields that replace the measured ones (a trainer's own
                loss and post-clip norm).
        """
        skipped = skip is not SkipReason.NONE
        self.skip_count += skipped
        # keywords, not string keys: the column names are spelled once, in steplog
        values = dict(step=step, lr=lr, skipped=skipped, skip_reason=skip,
                      micro_batches=micro_batches, samples=samples,
                      skips_cumulative=self.skip_count)
        values.update(zip(RECORDED, _recorded(measured), strict=True))
        if override:
            values.update(override)
        # StepLog(**values), built without its frozen __init__: this runs on every step of
        # every loop, a trainer callback's included
        return build(StepLog, values)

    def state_dict(self) -> dict[str, Any]:
        """The counters (``load_state_dict`` continues them)."""
        return {"step": self.step_count, "skips": self.skip_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the counters of ``state_dict``."""
        self.step_count, self.skip_count = int(state["step"]), int(state["skips"])
