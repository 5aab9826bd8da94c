"""Probe 1: accumulation over k micro-batches of b is one step over the same k*b samples.

From the same weights, the loop steps once over a window (plain SGD, fp32, no clipping); the
reference is one backward of the task's loss over the concatenated samples. Measured: the
relative error of the gradient the optimizer saw, and of the one-step parameter change. Done for
a full window and for a short last window (fewer micro-batches than configured).

Tolerance: floating point, measured on the spot. The reference gradient is computed in fp32
and again in float64; that fp32 rounding (summation-order) error times ``ORDER_FACTOR`` (floor
``FLOOR``) bounds the gradient's error. The one-step parameter change is held to the same bound
plus the fp32 rounding of ``theta + delta`` (half an ulp of each parameter, relative to the
update). A normalisation bug is an O(1) error (a short window divided by the configured size
gives j/k of the gradient; a per-micro-batch mean over varying valid counts weights items
unequally), orders of magnitude above it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from stability.check.result import ProbeResult, Status, verdict
from stability.check.rig import (
    StepFn,
    Template,
    concat,
    flat,
    gradients_at_step,
    params_of,
    rel,
    size,
    to_dtype,
)
from stability.core.step import MicroBatch

ORDER_FACTOR = 100.0  # headroom over the measured summation-order error
FLOOR = 1e-5  # fp32 has ~7 digits; a bound below 1e-5 would flag reordering alone
LR = 0.05


def reference_gradient(template: Template, window: Sequence[MicroBatch],
                       dtype: torch.dtype = torch.float32,
                       precision: str = "fp32") -> list[torch.Tensor]:
    """The gradient of the task's loss over the window's samples as one batch (the trainer's
    own when the template says how: ``Template.grad_of``, fp32 only)."""
    batch = (template.join or concat)(window)
    if template.grad_of is not None:
        if dtype != torch.float32:
            raise TypeError("the trainer computes its gradient in fp32")
        return template.grad_of(template, batch)
    model = template.rig().model.to(dtype)
    template.loss(model, to_dtype(batch, dtype), precision).backward()
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p in model.parameters()]


def summation_order_error(template: Template, window: Sequence[MicroBatch]) -> float:
    """The fp32 rounding error of the reference gradient itself (against float64).

    0 (the floor applies) when the model or loss cannot run in float64.
    """
    full = flat(reference_gradient(template, window))
    try:
        exact = flat(reference_gradient(template, window, torch.float64))
    except (RuntimeError, TypeError):
        return 0.0
    return rel(full, exact)


def _one(template: Template, step: StepFn, window: Sequence[MicroBatch], k: int,
         name: str, tol: float, what: str) -> ProbeResult:
    ref = flat(reference_gradient(template, window))
    if float(ref.norm()) == 0:
        # a reference of zero makes every loop look right (0 vs 0): the trainer's own
        # one-batch step zeroed it (a hook's zero_grad); never a pass
        return ProbeResult(name=name, status=Status.FAIL, measured=float("inf"), tolerance=tol,
                           meaning=f"{what}: FAIL: the reference gradient (one step over the "
                           "window's samples as one batch) is zero at the optimizer step: "
                           "something zeroes the gradients after backward (zero_grad() or "
                           "grad.zero_() in a hook such as on_after_backward)")
    rig = template.rig(accum_steps=k, lr=LR)
    seen = gradients_at_step(rig)
    before = params_of(rig.model)
    step(rig, window)
    if not seen:
        return ProbeResult(name=name, status=verdict(float("inf"), tol), measured=float("inf"),
                           tolerance=tol, meaning=f"{what}: FAIL: the loop took no optimizer "
                           "step" + ("" if len(window) >= k else
                                     " on a short last window: its gradients stay in .grad and "
                                     "are added to the next window's (step on the epoch's last "
                                     "batch too, or make the batch count a multiple of the "
                                     "accumulation and say short_window=False)"))
    got = flat(seen[-1])
    g_err = rel(got, ref)
    update = LR * ref
    p_err = rel(params_of(rig.model) - before, -update)
    # theta + delta is rounded to fp32: up to half an ulp of each parameter, relative to the
    # update; the parameter change is held to the gradient's bound plus that rounding.
    rounding = float((before.abs() * torch.finfo(torch.float32).eps).norm() / update.norm())
    status = verdict(max(g_err, p_err - rounding), tol)
    meaning = f"{what}: grad rel err {g_err:.2e}, 1-step param rel diff {p_err:.2e}"
    own = own_autocast(template, window, got, g_err) if status is not Status.PASS else None
    if own is not None:
        precision, err, moved = own
        return ProbeResult(name=name, status=Status.WARN, measured=err, tolerance=moved,
                           meaning=f"{what}: the loop runs its own {precision} autocast (the "
                           f"probe asked for fp32): grad rel err {err:.2e} against a "
                           f"{precision} reference, within the {moved:.2e} a {precision} "
                           f"forward moves it from fp32 ({g_err:.2e} against fp32); "
                           "normalisation checked at that precision only")
    if status.value != "pass":
        meaning += "; FAIL: " + diagnose(template, window, k, got, ref, g_err, tol)
    return ProbeResult(name=name, status=status, measured=g_err, tolerance=tol, meaning=meaning)


def own_autocast(template: Template, window: Sequence[MicroBatch], got: torch.Tensor,
                 g_err: float) -> tuple[str, float, float] | None:
    """Whether the loop autocasts by itself (a hard-coded ``autocast(dtype=torch.float16)``):
    ``(precision, error against that precision's reference, how far that precision's forward
    moves the reference from fp32)``, or None.

    It does when the gradient it stepped on is off the fp32 reference by no more than twice
    what that precision's forward moves the reference (``moved``: the same samples as one
    batch under the same autocast, against fp32), and closer to that low-precision reference
    than to the fp32 one, within ``moved``. Measured on a small MLP: the recipe's loop under
    its own fp16 autocast is 4.9e-4 from fp32 and 3.0e-4 from the fp16 reference, which is
    5.2e-4 from fp32 (per-micro-batch fp16 rounding differs from one batch's by that order).
    A normalisation bug is O(0.1-1) and stays a failure.
    """
    if template.grad_of is not None:  # a trainer's own gradient: its precision is the rig's
        return None
    ref32 = flat(reference_gradient(template, window))
    for precision in ("fp16", "bf16"):
        try:
            low = flat(reference_gradient(template, window, precision=precision))
        except RuntimeError:  # an op without a CPU kernel in this dtype
            continue
        moved, err = rel(low, ref32), rel(got, low)
        if err <= moved and err < g_err <= 2 * moved:
            return precision, err, moved
    return None


def _fit(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    # the best scale c of ref to got, and the relative residual of got against c * ref
    den = float(ref.dot(ref))
    c = float(got.dot(ref)) / den if den > 0 else 0.0
    return c, rel(got, c * ref)


def diagnose(template: Template, window: Sequence[MicroBatch], k: int, got: torch.Tensor,
             ref: torch.Tensor, g_err: float, tol: float) -> str:
    """The failed window's cause, with the number that failed.

    A pure scale of the reference (the same direction): the loss is divided by the wrong
    count. The last micro-batch's gradient alone: the gradients were zeroed inside the window.
    Otherwise the micro-batches are weighted unequally (a per-micro-batch mean over varying
    item counts).
    """
    j = len(window)
    c, off = _fit(got, ref)
    if float(got.norm()) == 0:
        return ("the optimizer stepped on a zero gradient (|g| = 0): something zeroes the "
                "gradients between backward and the step (zero_grad() or grad.zero_() in a "
                "hook such as on_after_backward or on_before_optimizer_step)")
    if template.grad_of is not None and not getattr(template.model, "automatic_optimization",
                                                    True):
        # a manual-optimization module: the reference is its own step over one batch, so
        # only the disagreement is known, not which side normalises wrongly
        return (f"the module's own accumulation over {j} micro-batches is not its step over "
                f"the same samples as one batch (|g|/|g_ref| = {c:.4g}, direction off by "
                f"{off:.3g}): training_step must divide by the window's own count, also on an "
                "epoch's last, shorter window (and on a one-batch epoch)")
    pure, note = off <= max(tol, 1e-4), ""
    if not pure and c > 0:  # a pure scale under the loop's own autocast: its rounding aside
        own = own_autocast(template, window, got / c, rel(got / c, ref))
        if own is not None:
            pure, note = True, f" (under the loop's own {own[0]} autocast)"
    if pure:
        known = template.known(template.model, window) if template.known else {}
        for name, scale in known.items():
            if abs(c - scale) <= 1e-3 * max(1.0, scale):
                return (f"not a larger batch: |g|/|g_ref| = {c:.4g}, the trainer's own count "
                        f"(signature {name})")
        cause = ("the loss is not divided by the window's micro-batch count" if
                 abs(c - j) < 1e-3 * j else
                 f"the loss is divided by the configured accum_steps={k} on a window of {j} "
                 "(divide by the window's own count)" if abs(c - j / k) < 1e-3 else
                 f"the loss is divided by the accumulation twice (|g|/|g_ref| = 1/{j}: the "
                 "loss divided by the window's count, e.g. by accumulate_grad_batches in "
                 "training_step, and again by the trainer)" if abs(c * j - 1) < 1e-3 else
                 "the loss is normalised by the wrong count")
        return f"not a larger batch: |g|/|g_ref| = {c:.4g}{note}, {cause}"
    if j > 1:
        last = flat(reference_gradient(template, window[-1:]))
        c_last, off_last = _fit(got, last)
        if off_last <= max(tol, 1e-4):
            return (f"grad rel err {g_err:.3g}: only the last of {j} micro-batches reached the "
                    f"step (|g|/|g_last| = {c_last:.4g}): zero_grad (or grad = None) runs inside "
                    "the accumulation window; call it once per optimizer step")
    size = ("" if abs(c - 1) < 0.25 else
            f"the gradient is {c:.3g}x the larger batch's (not divided by the window's "
            f"{j} micro-batches) and " if abs(c / j - 1) < 0.25 else
            f"the gradient is {c:.3g}x the larger batch's and ")
    return (f"grad rel err {g_err:.3g} (|g|/|g_ref| = {float(got.norm() / ref.norm()):.4g}, "
            f"direction off by {off:.3g}): {size}the micro-batches are weighted unequally, "
            "e.g. a mean per micro-batch over varying item counts (padded tokens); sum the "
            "loss and divide by the window's item count")


def window_probes(template: Template, step: StepFn, micro: Sequence[MicroBatch],
                  k: int) -> dict[str, Callable[[], ProbeResult]]:
    """The two accumulation probes, each runnable on its own (so an exception names the one
    that ran): a full window of ``k`` micro-batches and a short last window of
    ``max(1, k // 2)``; the tolerance is measured once, on the full window."""
    full, short = list(micro[:k]), list(micro[: max(1, k // 2)])
    tols: list[float] = []

    def tol() -> float:
        if not tols:
            tols.append(max(FLOOR, ORDER_FACTOR * summation_order_error(template, full)))
        return tols[0]

    return {
        "accumulation.full": lambda: _one(
            template, step, full, k, "accumulation.full", tol(),
            f"accum {k} x {size(full[0])} vs one batch of {sum(size(m) for m in full)}"),
        "accumulation.short_window": lambda: _one(
            template, step, short, k, "accumulation.short_window", tol(),
            f"short last window of {len(short)}/{k} micro-batches vs one batch"),
    }


def probe_accumulation(template: Template, step: StepFn, micro: Sequence[MicroBatch],
                       k: int, short_window: bool = True) -> list[ProbeResult]:
    """A full window of ``k`` micro-batches and a short last window of ``max(1, k // 2)``.

    Args:
        template: the initial weights and the task's loss.
        step: the loop under check.
        micro: at least ``k`` micro-batches (their sizes are what the task's data gives).
        k: the configured accumulation (micro-batches per optimizer step), >= 2.
        short_window: False when the loop never sees a short window (only the full is run).
    """
    probes = window_probes(template, step, micro, k)
    names = ["accumulation.full"] + (["accumulation.short_window"] if short_window else [])
    return [probes[n]() for n in names]
