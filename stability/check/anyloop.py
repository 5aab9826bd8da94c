"""Any loop, no rewrite: ``stability.check.loop(train_step, model, loss_fn, batches, ...)``.

The user's own step (their loop's body, one optimizer step over a window of micro-batches) is
driven by the probes on batches the check supplies. Its parameters are matched by name, or
named by ``names={"data": "batches", "iters_to_accumulate": "accum_steps"}`` (its own name ->
one below); the check passes each probe's fresh objects:

===================================  ======================================================
parameter name                       what the check passes
===================================  ======================================================
``model``                            a deepcopy of the initial model
``optimizer``                        a fresh plain SGD (AdamW for the skip probe)
``scaler``                           a ``torch.amp.GradScaler`` at the probe's scale
``scheduler`` / ``lr_scheduler``     a warmup ``LambdaLR`` (skip and schedule probes), else
                                     a constant one (LR x 1): never None
``window`` / ``batches``             the micro-batches of this step (a list; the short
                                     window probe passes fewer than ``accum_steps``)
``accum_steps`` /                    the configured window size
``gradient_accumulation_steps``
``max_norm``                         the clip threshold (``inf`` when the probe does not
                                     clip: ``clip_grad_norm_(p, inf)`` changes nothing)
``grad_clip``                        the same, 0.0 for no clipping (nanoGPT's convention)
``ctx``                              the autocast context of the probe's precision
``precision``                        ``fp32`` | ``fp16``
``epochs``                           ``range(1)``: one pass over the window (a top-level
                                     loop over epochs: ``check.body``)
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from stability.check.body import lines_of, step_of_lines
from stability.check.raised import LoopRaised, load
from stability.check.result import BAD_INPUT, RAISED, ProbeResult, exit_status, table, write_json
from stability.check.rig import Rig, StepFn, Template
from stability.check.run import run_probes
from stability.check.subject import Subject, no_dropout
from stability.check.upstream import ACCEPTABLE, attribute
from stability.core.precision import autocast
from stability.core.validation import ConfigError, require


def _schedule(rig: Rig) -> Any:
    # a loop that steps its scheduler unconditionally gets one: the probe's, or a constant
    # schedule (LR x 1) that changes nothing the probe measures
    if rig.scheduler is None:
        rig.scheduler = torch.optim.lr_scheduler.LambdaLR(rig.optimizer, lambda _: 1.0)
    return rig.scheduler


SUPPLIED: dict[str, Callable[[Rig, Sequence[Any]], Any]] = {
    "model": lambda r, w: r.model,
    "optimizer": lambda r, w: r.optimizer,
    "scaler": lambda r, w: r.scaler,
    "scheduler": lambda r, w: _schedule(r),
    "lr_scheduler": lambda r, w: _schedule(r),
    "window": lambda r, w: list(w),
    "batches": lambda r, w: list(w),
    "accum_steps": lambda r, w: r.accum_steps,
    "gradient_accumulation_steps": lambda r, w: r.accum_steps,
    "max_norm": lambda r, w: math.inf if r.max_norm is None else r.max_norm,
    "grad_clip": lambda r, w: 0.0 if r.max_norm is None else r.max_norm,
    "ctx": lambda r, w: autocast(r.precision, "cpu"),
    "precision": lambda r, w: r.precision,
    "epochs": lambda r, w: range(1),
}
SCHEDULERS = ("scheduler", "lr_scheduler")
WHERE = "an import path, file.py:name of a function or file.py:START-END of its loop"


def wiring(train_step: Callable[..., Any],
           names: Mapping[str, str] | None = None) -> dict[str, str]:
    """``train_step``'s parameter -> the supplied name it receives: its own name, or the one
    ``names`` maps it to (``{"data": "batches", "iters_to_accumulate": "accum_steps"}``).

    Raises:
        ConfigError: a mapping to a name the check does not supply, a mapped parameter the
            function does not have, or a required parameter the check cannot supply.
    """
    names = dict(names or {})
    params = inspect.signature(train_step).parameters
    allowed = " | ".join(SUPPLIED)
    for user, ours in names.items():
        require(ours in SUPPLIED, f"names[{user!r}]", ours, allowed)
        require(user in params, "names", user,
                f"parameters of {getattr(train_step, '__name__', 'train_step')}: "
                + " | ".join(params))
    wired = {n: names.get(n, n) for n in params if names.get(n, n) in SUPPLIED}
    for n, p in params.items():
        require(n in wired or p.default is not inspect.Parameter.empty
                or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD), f"train_step parameter {n}",
                n, allowed + f' (or name it: names={{"{n}": "batches"}})')
    return wired


def step_of(train_step: Callable[..., Any], names: Mapping[str, str] | None = None) -> StepFn:
    """The user's ``train_step`` as a probe's step function (parameters matched by name, or
    by ``names``: ``wiring``).

    Raises:
        ConfigError: a required parameter the check cannot supply.
    """
    wired = wiring(train_step, names)

    def step(rig: Rig, window: Sequence[Any]) -> bool:
        fired: list[int] = []
        handle = rig.optimizer.register_step_post_hook(lambda *_: fired.append(1))
        try:
            out = train_step(**{n: SUPPLIED[s](rig, window) for n, s in wired.items()})
        finally:
            handle.remove()
        return out if isinstance(out, bool) else bool(fired)

    return step


def loop(train_step: Callable[..., Any] | str, model: nn.Module,
         loss_fn: Callable[[nn.Module, Any], Any], batches: Iterable[Any], *,
         accum_steps: int = 4, scaler: object = None, short_window: bool = True,
         expected_init_loss: float | None = None, accept: Sequence[str] = (),
         names: Mapping[str, str] | None = None, scope: Mapping[str, Any] | None = None,
         output: str | Path | None = "check.json", seed: int = 0, quiet: bool = False) -> int:
    """Every probe on the user's own ``train_step``; prints the table, writes the JSON.

    Args:
        train_step: one optimizer step over a window of micro-batches (module docstring), or
            where it is (``"my_loop.train_step"``, ``"my_loop.py:train_step"``: imported
            here, so a syntax or import error in its file is one line, exit 2), or the lines
            of top-level code that are the loop (``"train.py:120-140"``: ``check.body``).
        model: the initial model (not modified: the probes deepcopy it).
        loss_fn: ``loss_fn(model, batch)``, the mean loss of a batch.
        batches: at least ``accum_steps`` micro-batches (the first ``accum_steps`` are used).
        accum_steps: the loop's accumulation (>= 2).
        scaler: the loop's GradScaler (or True) when it has one; None: no fp16 skip to probe.
        short_window: False when the loop always takes ``accum_steps`` micro-batches (sampled
            batches, as nanoGPT): no short last window to probe.
        expected_init_loss: the loss at init (e.g. ``log(vocab)``); None: that probe is n/a.
        accept: the trainer's own known faults to accept (``check.upstream``).
        names: ``train_step``'s own parameter names -> the names above
            (``{"data": "batches", "iters_to_accumulate": "accum_steps"}``).
        scope: the user's own objects the loop's lines read (``{"loss_fn": loss_fn}``).
        output: the JSON file (None: not written).
        seed: the seed of the probes' torch state.
        quiet: print nothing but an error line.

    Returns:
        The exit status: 0 pass, 1 a probe failed, 2 bad input, 3 the user's code raised.
    """
    try:
        span = lines_of(train_step) if isinstance(train_step, str) else None
        if span is not None:  # top-level code, as published (check.body)
            step, received = step_of_lines(*span, SUPPLIED, names, scope)
        else:
            fn = load(train_step, "train_step", WHERE) if isinstance(train_step, str) \
                else train_step
            require(callable(fn), "train_step", train_step, "a function (or " + WHERE + ")")
            received = set(wiring(fn, names).values())
            step = step_of(fn, names)
        require(isinstance(accum_steps, int) and accum_steps >= 2, "accum_steps",
                accum_steps, "an integer >= 2")
        require(isinstance(accept, list | tuple) and all(a in ACCEPTABLE for a in accept),
                "accept", accept, "a list of " + " | ".join(ACCEPTABLE))
        micro = _first(batches, accum_steps)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return BAD_INPUT
    except LoopRaised as err:
        return _report([], err, output, quiet)
    start = no_dropout(copy.deepcopy(model))
    na = {}
    if not short_window:
        na["accumulation.short_window"] = ("the loop always takes accum_steps micro-batches "
                                           "(short_window=False): no short last window")
    if scaler is None:
        na["skip.is_skip"] = "the loop has no GradScaler (scaler=None): no fp16 skip to probe"
    if not received & set(SCHEDULERS):
        na["schedule.per_step"] = ("the loop takes no scheduler (it reads none by the names "
                                   "scheduler, lr_scheduler)")
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
    require(isinstance(batches, Iterable), "batches", batches,
            f"an iterable (a list) of at least accum_steps={k} micro-batches")
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
