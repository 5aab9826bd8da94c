"""Probe: the LR schedule advances once per optimizer step, not once per micro-batch.

From the initial weights the loop takes one optimizer step over a full window of ``k``
micro-batches in fp32 (no GradScaler, so nothing can skip) with a warmup schedule attached.
Measured: the scheduler's steps (``last_epoch``) per optimizer step taken. A loop that steps its
scheduler after every micro-batch runs the schedule ``k`` times too fast (a warmup ``k`` times
shorter, a decay that ends ``k`` times early); the skip probe sees the schedule only on a skipped
fp16 step, never this.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stability.check.result import ProbeResult, Status, verdict
from stability.check.rig import StepFn, Template


def probe_schedule(template: Template, step: StepFn, window: Sequence[Any]) -> ProbeResult:
    """One optimizer step over ``window`` (its length is the configured accumulation)."""
    k = len(window)
    rig = template.rig(accum_steps=k, scheduler=True)
    taken: list[int] = []
    rig.optimizer.register_step_post_hook(lambda *_: taken.append(1))
    before = rig.scheduler.last_epoch
    step(rig, window)
    advanced = rig.scheduler.last_epoch - before
    name = "schedule.per_step"
    what = f"fp32, a window of {k} micro-batches: "
    if not taken:
        return ProbeResult(name=name, status=Status.FAIL, measured=float("inf"), tolerance=0.0,
                           meaning=what + "FAIL: the loop took no optimizer step")
    measured = advanced / len(taken)
    if advanced == 0:
        return ProbeResult(name=name, status=Status.WARN, measured=0.0, tolerance=0.0,
                           meaning=what + f"{len(taken)} optimizer step(s), the scheduler it "
                           "was given never stepped")
    status = verdict(abs(measured - 1), 0.0)
    return ProbeResult(name=name, status=status, measured=measured, tolerance=1.0,
                       meaning=what + f"{advanced} scheduler step(s) for {len(taken)} optimizer "
                       "step(s)" + ("" if status is Status.PASS else
                                    f"; FAIL: the schedule runs {measured:.3g}x too fast: the "
                                    "scheduler steps per micro-batch (step it once per "
                                    "optimizer step, after scaler.step / optimizer.step)"))
