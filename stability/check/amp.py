"""Probes 2 and 3: clipping sees unscaled gradients; a skip is a skip.

Both run under a GradScaler with a large scale (2**16; the clip probe halves it, as the scaler
backs off, until the task's scaled gradients at init do not overflow, and runs again 2**8
below it). The clip threshold comes from the task's loss alone, never from a step the user's
hooks touched. On CPU the
scaler is ``torch.amp.GradScaler("cpu")``, which scales, unscales, finds infs and backs off
exactly as on CUDA; the forward runs under the rig's precision (fp16 autocast on CPU where the
task supports it: the default task's RNN does).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch

from stability.check.raised import NotApplicable
from stability.check.result import ProbeResult, Status, verdict
from stability.check.rig import StepFn, Template, concat, flat, gradients_at_step, params_of
from stability.core.step import MicroBatch

SCALE = 2.0**16
SECOND = 2.0**8  # the clip probe's second scale: this factor below the first
CLIP_TOL = 1e-2  # fp16 forward: the seen norm vs max_norm within 1% (a scaled clip is 1/SCALE)


def unscaled_norm(template: Template, window: Sequence[MicroBatch], precision: str,
                  baseline: StepFn | None = None) -> tuple[float, float]:
    """The global gradient norm of a correct fp16/scaled step (unscaled), no clipping, and the
    largest scale from 2**16 down (halving, as the scaler backs off) whose step is taken.

    ``baseline`` takes that step: our loop, or a trainer's own step without clipping (a trainer
    task's model runs only through its trainer).
    """
    from stability.check.rig import ours

    scale = SCALE
    while scale >= 1.0:
        rig = template.rig(precision=precision, accum_steps=len(window), init_scale=scale)
        seen = gradients_at_step(rig)
        if (baseline or ours)(rig, window) and seen:
            return float(flat(seen[-1]).norm()), scale
        scale /= 2
    return math.nan, SCALE


def loss_norm(template: Template, window: Sequence[MicroBatch],
              precision: str) -> tuple[float, float]:
    """The unscaled gradient norm of the task's loss on ``window`` under ``precision``'s
    autocast, from the loss alone (no loop, no trainer, no hook of the user's can touch it),
    and the largest scale from 2**16 down (halving, as the scaler backs off) whose scaled
    gradient is finite.

    Raises:
        NotApplicable: the loss runs only through its trainer (a Lightning ``training_step``
            that needs ``self.trainer``).
    """
    batch = (template.join or concat)(window)
    scale = SCALE
    while scale >= 1.0:
        model = template.rig().model
        (template.loss(model, batch, precision) * scale).backward()
        grad = flat([p.grad for p in model.parameters() if p.grad is not None]) / scale
        if bool(torch.isfinite(grad).all()):
            return float(grad.norm()), scale
        scale /= 2
    return math.nan, SCALE


def _clipped(template: Template, step: StepFn, window: Sequence[MicroBatch], precision: str,
             max_norm: float, scale: float) -> float:
    # the norm of the gradient optimizer.step saw, the loop clipping at max_norm
    rig = template.rig(precision=precision, max_norm=max_norm, accum_steps=len(window),
                       init_scale=scale)
    seen = gradients_at_step(rig)
    step(rig, window)
    return float(flat(seen[-1]).norm()) if seen else math.nan


def probe_clip(template: Template, step: StepFn, window: Sequence[MicroBatch],
               precision: str = "fp16", baseline: StepFn | None = None) -> ProbeResult:
    """Clip to half the true norm at two loss scales; the gradient the optimizer sees must
    have norm max_norm at both.

    The true norm comes from the task's loss alone (``loss_norm``), so a user's hook that
    already clipped the scaled gradients cannot lower the threshold with it; ``baseline``
    (a correct step without clipping) only when the loss needs its trainer. The second scale
    (``SECOND`` below the first) tells a threshold tied to one scale (``max_norm * 65536`` on
    the scaled gradients) from a clip of unscaled gradients.

    Measured: the larger ``|seen / max_norm - 1|`` of the two scales. Clipping the scaled
    gradients leaves about ``max_norm / scale``: near 1; no clipping gives 1 (2x).
    """
    name = "clip.unscaled"
    try:
        norm, scale = loss_norm(template, window, precision)
        source = "the loss alone"
    except NotApplicable:
        norm, scale = unscaled_norm(template, window, precision, baseline)
        source = "the trainer's unclipped step"
    if not math.isfinite(norm) or norm == 0:
        return ProbeResult(name=name, status=Status.WARN, measured=norm, tolerance=CLIP_TOL,
                           meaning="no finite gradient at init under fp16: clipping not probed")
    max_norm = norm / 2
    scales = [scale] + ([scale / SECOND] if scale / SECOND >= 1.0 else [])
    got = [_clipped(template, step, window, precision, max_norm, s) for s in scales]
    errors = [abs(g / max_norm - 1) for g in got]
    measured = max(errors)
    status = verdict(measured, CLIP_TOL)
    meaning = ("fp16: " + ", ".join(f"scale 2^{int(math.log2(s))} post-clip norm {g:.4g}"
                                    for s, g in zip(scales, got, strict=True))
               + f" vs max_norm {max_norm:.4g} (half the norm of {source})")
    if status is not Status.PASS:
        tied = len(errors) == 2 and min(errors) <= CLIP_TOL
        meaning += ("; FAIL: clipping did not act on unscaled gradients: "
                    + ("it clips right at one loss scale only: the threshold is tied to a "
                       "fixed scale (the scaled gradients clipped at max_norm x scale); clip "
                       "after scaler.unscale_ at max_norm" if tied else
                       "clip before scaler.unscale_ (or in a hook that sees the scaled "
                       "gradients, such as on_after_backward), or no clip"))
    return ProbeResult(name=name, status=status, measured=measured, tolerance=CLIP_TOL,
                       meaning=meaning)


def _state(opt: torch.optim.Optimizer) -> torch.Tensor:
    parts = [v.reshape(-1).double() for s in opt.state.values() for v in s.values()
             if isinstance(v, torch.Tensor)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def probe_skip(template: Template, step: StepFn, window: Sequence[MicroBatch],
               precision: str = "fp16") -> ProbeResult:
    """One healthy step (AdamW state, warmup schedule), then one with an inf gradient.

    Measured: the number of broken invariants among: parameters unchanged, optimizer state
    unchanged, LR schedule not advanced, scale halved, exactly one step counted skipped.
    """
    rig = template.rig(precision=precision, optimizer="adamw", scheduler=True,
                       accum_steps=len(window), init_scale=SCALE)
    step(rig, window)
    params, state = params_of(rig.model), _state(rig.optimizer).clone()
    lr, epoch = rig.optimizer.param_groups[0]["lr"], rig.scheduler.last_epoch
    scale = rig.scaler.get_scale()
    first = next(p for p in rig.model.parameters() if p.requires_grad)
    handle = first.register_hook(lambda g: torch.full_like(g, math.inf))
    try:
        taken = step(rig, copy.deepcopy(list(window)))
    finally:
        handle.remove()
    broken = []
    if not torch.equal(params_of(rig.model), params):
        broken.append("parameters changed")
    new_state = _state(rig.optimizer)
    if new_state.shape != state.shape or not torch.equal(new_state, state):
        broken.append("optimizer state changed")
    if rig.scheduler.last_epoch != epoch or rig.optimizer.param_groups[0]["lr"] != lr:
        broken.append(f"LR schedule advanced (last_epoch {epoch} -> "
                      f"{rig.scheduler.last_epoch}: the scheduler stepped on the skipped step, "
                      "as Lightning #5558/#16228)")
    if rig.scaler.get_scale() != scale * rig.scaler.get_backoff_factor():
        broken.append(f"scale {scale:g} -> {rig.scaler.get_scale():g}, not halved")
    if taken:
        broken.append("the step was not counted skipped")
    status = verdict(float(len(broken)), 0.0)
    meaning = ("inf gradient: params, optimizer state, schedule unchanged; scale halved; "
               "1 skip" if not broken else "FAIL: " + "; ".join(broken))
    return ProbeResult(name="skip.is_skip", status=status, measured=float(len(broken)),
                       tolerance=0.0, meaning=meaning)
