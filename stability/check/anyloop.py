"""Any loop, no rewrite: ``stability.check.loop(train_step, model, loss_fn, batches, ...)``.

The user's own step (their loop's body, one optimizer step over a window of micro-batches) is
driven by the probes on batches the check supplies. Its parameters are matched by name; the
check passes each probe's fresh objects:

===================================  ======================================================
parameter name                       what the check passes
===================================  ======================================================
``model``                            a deepcopy of the initial model
``optimizer``                        a fresh plain SGD (AdamW for the skip probe)
``scaler``                           a ``torch.amp.GradScaler`` at the probe's scale
``scheduler`` / ``lr_scheduler``     a warmup ``LambdaLR`` in the skip probe, else None
``window`` / ``batches``             the micro-batches of this step (a list; the short
                                     window probe passes fewer than ``accum_steps``)
``accum_steps`` /                    the configured window size
``gradient_accumulation_steps``
``max_norm``                         the clip threshold (None: do not clip)
``grad_clip``                        the same, 0.0 for no clipping (nanoGPT's convention)
``ctx`` / ``autocast``               the autocast context of the probe's precision
``precision``                        ``fp32`` | ``fp16``
===================================  ======================================================

The step returns whether it stepped, or nothing (then: whether ``optimizer.step`` ran; a
GradScaler skip does not call it). ``loss_fn(model, batch)`` is the loss the step minimises,
a mean over the batch: the accumulation probe's reference is one backward of it over the
window's samples as one batch.
"""

from __future__ import annotations

import copy
import inspect
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from torch import nn

from stability.check.raised import LoopRaised
from stability.check.result import BAD_INPUT, RAISED, ProbeResult, exit_status, table, write_json
from stability.check.rig import Rig, StepFn, Template
from stability.check.run import run_probes
from stability.check.subject import Subject, no_dropout
from stability.check.upstream import attribute
from stability.core.precision import autocast
from stability.core.validation import ConfigError, require

SUPPLIED: dict[str, Callable[[Rig, Sequence[Any]], Any]] = {
    "model": lambda r, w: r.model,
    "optimizer": lambda r, w: r.optimizer,
    "scaler": lambda r, w: r.scaler,
    "scheduler": lambda r, w: r.scheduler,
    "lr_scheduler": lambda r, w: r.scheduler,
    "window": lambda r, w: list(w),
    "batches": lambda r, w: list(w),
    "accum_steps": lambda r, w: r.accum_steps,
    "gradient_accumulation_steps": lambda r, w: r.accum_steps,
    "max_norm": lambda r, w: r.max_norm,
    "grad_clip": lambda r, w: 0.0 if r.max_norm is None else r.max_norm,
    "ctx": lambda r, w: autocast(r.precision, "cpu"),
    "autocast": lambda r, w: autocast(r.precision, "cpu"),
    "precision": lambda r, w: r.precision,
}


def step_of(train_step: Callable[..., Any]) -> StepFn:
    """The user's ``train_step`` as a probe's step function (parameters matched by name).

    Raises:
        ConfigError: a required parameter the check cannot supply.
    """
    params = inspect.signature(train_step).parameters
    names = [n for n, p in params.items() if n in SUPPLIED]
    for n, p in params.items():
        require(n in SUPPLIED or p.default is not inspect.Parameter.empty
                or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD), f"train_step parameter {n}",
                n, " | ".join(SUPPLIED))

    def step(rig: Rig, window: Sequence[Any]) -> bool:
        fired: list[int] = []
        handle = rig.optimizer.register_step_post_hook(lambda *_: fired.append(1))
        try:
            out = train_step(**{n: SUPPLIED[n](rig, window) for n in names})
        finally:
            handle.remove()
        return out if isinstance(out, bool) else bool(fired)

    return step


def loop(train_step: Callable[..., Any], model: nn.Module,
         loss_fn: Callable[[nn.Module, Any], Any], batches: Iterable[Any], *,
         accum_steps: int = 4, scaler: object = None, short_window: bool = True,
         expected_init_loss: float | None = None, accept: Sequence[str] = (),
         output: str | Path | None = "check.json", seed: int = 0,
         quiet: bool = False) -> int:
    """Every probe on the user's own ``train_step``; prints the table, writes the JSON.

    Args:
        train_step: one optimizer step over a window of micro-batches (module docstring).
        model: the initial model (not modified: the probes deepcopy it).
        loss_fn: ``loss_fn(model, batch)``, the mean loss of a batch.
        batches: at least ``accum_steps`` micro-batches (the first ``accum_steps`` are used).
        accum_steps: the loop's accumulation (>= 2).
        scaler: the loop's GradScaler (or True) when it has one; None: no fp16 skip to probe.
        short_window: False when the loop always takes ``accum_steps`` micro-batches (sampled
            batches, as nanoGPT): no short last window to probe.
        expected_init_loss: the loss at init (e.g. ``log(vocab)``); None: that probe is n/a.
        accept: the trainer's own known faults to accept (``check.upstream``).
        output: the JSON file (None: not written).
        seed: the seed of the probes' torch state.
        quiet: print nothing but an error line.

    Returns:
        The exit status: 0 pass, 1 a probe failed, 2 bad input, 3 the user's code raised.
    """
    try:
        step = step_of(train_step)
        require(isinstance(accum_steps, int) and accum_steps >= 2, "accum_steps",
                accum_steps, "an integer >= 2")
        micro = _first(batches, accum_steps)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return BAD_INPUT
    start = no_dropout(copy.deepcopy(model))
    na = {}
    if not short_window:
        na["accumulation.short_window"] = ("the loop always takes accum_steps micro-batches "
                                           "(short_window=False): no short last window")
    if scaler is None:
        na["skip.is_skip"] = "the loop has no GradScaler (scaler=None): no fp16 skip to probe"
    sub = Subject(template=Template(model=start, loss_fn=_unused, seed=seed, loss_of=loss_fn),
                  build=lambda: copy.deepcopy(start), micro=micro, step=step, baseline=step,
                  trainer="any", task=SimpleNamespace(expected_init_loss=expected_init_loss),
                  not_applicable=na)
    raised = None
    try:
        results = attribute(run_probes(sub, accum_steps), "any", accept, accum_steps)
    except LoopRaised as err:
        results, raised = err.results, err
    return _report(results, raised, output, quiet)


def _report(results: list[ProbeResult], raised: LoopRaised | None,
            output: str | Path | None, quiet: bool) -> int:
    status = RAISED if raised is not None else exit_status(results)
    path = None
    if output is not None:
        meta: dict[str, Any] = {"loop": "any", "exit_status": status}
        if raised is not None:
            meta["error"] = str(raised)
        path = write_json(results, Path(output), **meta)
    if not quiet and results:
        print(table(results))
    if raised is not None:
        print(f"error: {raised}", file=sys.stderr)
    elif not quiet:
        failed = sum(r.status.value == "fail" for r in results)
        print(f"check: {'FAIL' if status else 'ok'} ({failed} failed of {len(results)})"
              + (f"; results: {path}" if path else ""))
    return status


def _first(batches: Iterable[Any], k: int) -> list[Any]:
    out = []
    for b in batches:
        out.append(b)
        if len(out) == k:
            return out
    raise ConfigError(f"batches holds {len(out)} micro-batches: allowed values are at least "
                      f"accum_steps={k}")


def _unused(out: Any, y: Any) -> Any:
    # the loss is the user's loss_fn(model, batch) (Template.loss_of)
    return math.nan
