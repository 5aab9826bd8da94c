"""Probe 5: the loss at initialisation against the task's declared value; determinism.

A task declares ``expected_init_loss`` (a class attribute or a method returning a float), e.g.
``log(2)`` for a balanced binary classifier on logits near zero, ``log(classes)`` for a uniform
classifier. A loss far from it at init means a wrong loss, reduction or output layer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from stability.check.result import ProbeResult, Status, verdict
from stability.check.rig import StepFn, Template, params_of
from stability.core.step import MicroBatch

INIT_LOSS_TOL = 0.25  # relative: random init moves the loss by a few percent, not by 25%
INIT_LOSS_WARN = 1.0


def declared_init_loss(task: object) -> float | None:
    """The task's ``expected_init_loss`` (attribute or method), or None."""
    value = getattr(task, "expected_init_loss", None)
    if callable(value):
        value = value()
    return float(value) if isinstance(value, int | float) else None


def probe_init_loss(template: Template, batch: MicroBatch, expected: float | None,
                    divided_by: int | None = None) -> ProbeResult:
    """Relative difference of the fp32 loss at init from ``expected``.

    ``divided_by``: the accumulation a trainer divides the loss by itself (Lightning's
    ``accumulate_grad_batches``, the HF Trainer's): a loss at init near ``expected /
    divided_by`` is that division written once more in the user's code (double division),
    which no gradient comparison can see (the reference takes the same loss).
    """
    with torch.no_grad():
        loss = float(template.loss(template.rig().model, batch))
    if expected is None:
        if not math.isfinite(loss):
            return ProbeResult(name="sanity.init_loss", status=Status.FAIL, measured=loss,
                               tolerance=math.nan, meaning=f"FAIL: loss at init is {loss}")
        return ProbeResult(name="sanity.init_loss", status=Status.NA, measured=math.nan,
                           tolerance=math.nan,
                           meaning=f"n/a: the task declares no expected_init_loss (loss at init "
                           f"{loss:.4g}); declare it to check the loss and its reduction")
    measured = abs(loss - expected) / abs(expected)
    status = verdict(measured, INIT_LOSS_TOL, INIT_LOSS_WARN)
    if (divided_by and status is not Status.PASS
            and abs(loss * divided_by - expected) / abs(expected) <= INIT_LOSS_TOL):
        return ProbeResult(name="sanity.init_loss", status=Status.FAIL, measured=measured,
                           tolerance=INIT_LOSS_TOL,
                           meaning=f"loss at init {loss:.4g} vs expected {expected:.4g}: FAIL: "
                           f"about expected / {divided_by}: the loss is divided by the "
                           f"accumulation ({divided_by}) and the trainer divides it again "
                           "(double division): return the plain mean loss")
    return ProbeResult(name="sanity.init_loss", status=status, measured=measured,
                       tolerance=INIT_LOSS_TOL,
                       meaning=f"loss at init {loss:.4g} vs expected {expected:.4g}"
                       + ("" if status is Status.PASS else
                          "; the loss, its reduction or the output layer is not what it says"))


def probe_determinism(build: Callable[[], nn.Module], template: Template, step: StepFn,
                      windows: Sequence[Sequence[MicroBatch]]) -> ProbeResult:
    """Build the model twice under the same seed and take the same steps: bitwise equal.

    ``build`` makes the task's model (the caller seeds torch before each call).
    """
    def run() -> torch.Tensor:
        torch.manual_seed(template.seed)
        rig = dataclasses.replace(template, model=build()).rig(accum_steps=len(windows[0]))
        for w in windows:
            step(rig, w)
        return params_of(rig.model)

    with torch.random.fork_rng(devices=[]):
        a, b = run(), run()
    diff = float((a - b).abs().max())
    status = verdict(diff, 0.0)
    return ProbeResult(name="sanity.same_seed", status=status, measured=diff, tolerance=0.0,
                       meaning=f"same seed twice, {len(windows)} steps: max |param diff| {diff:.3g}"
                       + ("" if status is Status.PASS else
                          "; FAIL: runs are not reproducible (unseeded init or data order)"))
