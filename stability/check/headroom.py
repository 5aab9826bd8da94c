"""Probe 4: precision headroom on one batch, and bf16/fp16 against fp32 at initialisation.

Per module (forward hooks on every module): the largest absolute activation, and the largest
absolute gradient of its own parameters, against fp16's largest finite value (65504); and the
share of nonzero gradient elements that would flush to zero in fp16 at the current loss scale
(``|g * scale|`` below fp16's smallest subnormal). Then the loss and gradient of a bf16 and an
fp16 autocast forward against fp32, as relative errors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from stability.check.result import ProbeResult, Status, verdict
from stability.check.rig import Template, flat, rel
from stability.core.step import MicroBatch

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 6.1e-5
HEADROOM_WARN = 0.1  # an activation within 10x of fp16's max: one bad batch overflows
UNDERFLOW_WARN = 0.01  # 1% of gradient elements lost at the scale: warn
LOW_PRECISION_TOL = 0.05  # bf16 keeps 8 mantissa bits (~0.4% per op); 5% over a whole model
LOW_PRECISION_WARN = 0.5


def probe_range(template: Template, batch: MicroBatch, scale: float) -> list[ProbeResult]:
    """Largest activation / fp16 max, and the fp16 underflow share at ``scale``."""
    model = template.rig().model
    act: dict[str, float] = {}

    def hook(name: str):
        def record(_m, _i, out) -> None:
            outs = out if isinstance(out, tuple) else (out,)
            vals = [float(o.detach().abs().max()) for o in outs
                    if isinstance(o, torch.Tensor) and o.is_floating_point() and o.numel()]
            if vals:
                act[name] = max(act.get(name, 0.0), *vals)
        return record

    handles = [m.register_forward_hook(hook(n or "(model)")) for n, m in model.named_modules()]
    try:
        template.loss(model, batch).backward()
    finally:
        for h in handles:
            h.remove()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    top_act = max(act.items(), key=lambda kv: kv[1])
    top_grad = max(((n, float(g.abs().max())) for n, g in grads.items()), key=lambda kv: kv[1])
    nonzero = sum(int((g != 0).sum()) for g in grads.values())
    lost = sum(int(((g != 0) & ((g * scale).half() == 0)).sum()) for g in grads.values())
    small = sum(int(((g != 0) & ((g * scale).abs() < FP16_MIN_NORMAL)).sum())
                for g in grads.values())
    share = lost / nonzero if nonzero else 0.0
    ratio = max(top_act[1], top_grad[1]) / FP16_MAX
    status = verdict(ratio, HEADROOM_WARN, 1.0)
    return [
        ProbeResult(name="headroom.fp16_range", status=status, measured=ratio,
                    tolerance=HEADROOM_WARN,
                    meaning=f"largest |activation| {top_act[1]:.3g} ({top_act[0]}), |grad| "
                    f"{top_grad[1]:.3g} ({top_grad[0]}) vs fp16 max 65504"
                    + ("; FAIL: overflows fp16" if status is Status.FAIL else "")),
        ProbeResult(name="headroom.fp16_underflow", status=verdict(share, UNDERFLOW_WARN, 1.0),
                    measured=share, tolerance=UNDERFLOW_WARN,
                    meaning=f"share of gradient elements flushed to zero in fp16 at scale "
                    f"{scale:g} ({small / nonzero if nonzero else 0:.2%} below the smallest "
                    "normal)"),
    ]


def _loss_and_grad(template: Template, batch: MicroBatch,
                   precision: str) -> tuple[float, torch.Tensor]:
    # fp16: the scale backs off from 2**16 while the gradients overflow, as the GradScaler
    # does on its first steps (a large gradient at init is not an fp16 failure)
    scale = 2.0**16 if precision == "fp16" else 1.0
    while True:
        model = template.rig().model
        # The loss itself in fp32 (as autocast does for losses): the forward is compared
        loss = template.loss(model, batch, precision)
        (loss * scale).backward()
        grad = flat([p.grad for p in model.parameters() if p.grad is not None]) / scale
        if bool(torch.isfinite(grad).all()) or scale <= 1.0:
            return float(loss.detach()), grad
        scale /= 2


def probe_low_precision(template: Template, batch: MicroBatch,
                        precisions: Sequence[str] = ("bf16", "fp16")) -> list[ProbeResult]:
    """Loss and gradient relative error of each low precision against fp32 at init."""
    loss32, grad32 = _loss_and_grad(template, batch, "fp32")
    out = []
    for p in precisions:
        try:
            loss, grad = _loss_and_grad(template, batch, p)
        except RuntimeError as err:  # an op without a CPU kernel in this dtype
            out.append(ProbeResult(name=f"headroom.{p}_vs_fp32", status=Status.WARN,
                                   measured=math.nan, tolerance=LOW_PRECISION_TOL,
                                   meaning=f"{p} forward not runnable here: "
                                   f"{' '.join(str(err).split())[:80]}"))
            continue
        l_err = abs(loss - loss32) / abs(loss32) if loss32 else abs(loss)
        g_err = rel(grad, grad32)
        measured = max(l_err, g_err)
        status = verdict(measured, LOW_PRECISION_TOL, LOW_PRECISION_WARN)
        out.append(ProbeResult(name=f"headroom.{p}_vs_fp32", status=status, measured=measured,
                               tolerance=LOW_PRECISION_TOL,
                               meaning=f"{p} at init: loss rel err {l_err:.2e}, grad rel err "
                               f"{g_err:.2e}" + ("; FAIL: this precision breaks the "
                                                 "gradient" if status is Status.FAIL else "")))
    return out
