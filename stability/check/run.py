"""Run every probe on one task and one loop: ``run_check(RunConfig, CheckConfig)``.

Bad input is a ``ConfigError`` (one line naming the key); the user's code raising is
``LoopRaised`` (the probes that ran, and where it raised); a trainer's own known fault is
attributed to it and may be accepted by name (``check.upstream``).

The data are the task's first training samples in order (no shuffling): ``k`` micro-batches
(``check.subject``). The model is built once under the run's seed; every probe deepcopies it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from stability.check.accumulation import window_probes
from stability.check.amp import SCALE, probe_clip, probe_skip
from stability.check.headroom import probe_low_precision, probe_range
from stability.check.raised import (
    LoopRaised,
    NotApplicable,
    library_raised,
    load,
    one_line,
    where_raised,
)
from stability.check.result import ProbeResult, Status, not_applicable
from stability.check.rig import StepFn, ours
from stability.check.sanity import declared_init_loss, probe_determinism, probe_init_loss
from stability.check.schedule import probe_schedule
from stability.check.subject import Subject, subject
from stability.check.upstream import ACCEPTABLE, attribute
from stability.core.config import RunConfig
from stability.core.validation import ConfigError, require

OURS = "ours"
LOOPS = "ours | an import path of a step function"


@dataclass(frozen=True)
class CheckConfig:
    """The ``check`` section (conf/check.yaml).

    Attributes:
        loop: ``ours`` (core.step.TrainStep) or the import path of a step function
            (``stability.check.rig`` documents its signature).
        accum_steps: the accumulation the probes use (>= 2; a short window is half of it).
        output: where the JSON goes (a file path).
        accept: names of a trainer's own known faults to accept (``lightning.short_window``,
            ``lightning.skip_schedule``): such a failure exits 0, marked ``accepted``.
    """

    loop: str = OURS
    accum_steps: int = 4
    output: str = "check.json"
    accept: tuple[str, ...] = ()

    @classmethod
    def from_section(cls, section: dict) -> CheckConfig:
        """The config from the composed ``check`` section.

        Raises:
            ConfigError: naming the first unknown key and the allowed ones.
        """
        allowed = [f.name for f in fields(cls)]
        unknown = [key for key in section if key not in allowed]
        if unknown:
            raise ConfigError(f"check.{unknown[0]} is not a key of check: allowed keys are "
                              + " | ".join(allowed))
        accept = section.get("accept") or ()
        require(isinstance(accept, list | tuple) and all(a in ACCEPTABLE for a in accept),
                "check.accept", accept, "a list of " + " | ".join(ACCEPTABLE))
        return cls(**{**section, "accept": tuple(accept)})

    def __post_init__(self) -> None:
        require(isinstance(self.loop, str) and bool(self.loop), "check.loop", self.loop,
                "ours | an import path of a step function")
        require(isinstance(self.accum_steps, int) and not isinstance(self.accum_steps, bool)
                and self.accum_steps >= 2, "check.accum_steps", self.accum_steps,
                "an integer >= 2")

    def step_fn(self) -> StepFn:
        """The loop under check."""
        if self.loop == OURS:
            return ours
        fn = load(self.loop, "check.loop", LOOPS)
        require(callable(fn), "check.loop", self.loop, "ours | a callable step(rig, window)")
        return fn


def run_check(cfg: RunConfig, check: CheckConfig) -> tuple[list[ProbeResult], float]:
    """All probes on ``cfg``'s task with ``check``'s loop (a trainer task: its trainer).

    Returns:
        The results in order (``n/a`` where a probe cannot apply to the trainer here) and
        the seconds they took.

    Raises:
        ConfigError: bad input (a loop that does not import, too little data).
        LoopRaised: the task's or loop's code raised (the results so far are on it).
    """
    t0 = time.perf_counter()
    step = check.step_fn()
    torch.set_num_threads(cfg.train.threads)
    k = check.accum_steps
    try:
        sub = subject(cfg, check.loop, step, k)
    except ConfigError:
        raise
    except Exception as err:
        raise LoopRaised(probe="building the task", where=where_raised(err),
                         error=one_line(err), results=[]) from err
    scale = cfg.precision.init_scale if cfg.precision.name == "fp16" else SCALE
    results = run_probes(sub, k, scale)
    return attribute(results, sub.trainer, check.accept, k), time.perf_counter() - t0


def run_probes(sub: Subject, k: int, scale: float = SCALE) -> list[ProbeResult]:
    """Every probe on ``sub`` in order; ``n/a`` where ``sub.not_applicable`` says why.

    Raises:
        LoopRaised: a probe's run of the user's code raised.
    """
    template, micro, step = sub.template, sub.micro, sub.step
    one = micro[:1]
    window = window_probes(template, step, micro, k)
    # a trainer divides the loss by the accumulation itself: a loss already divided by it at
    # init is the double division (sanity.init_loss names it)
    divides = k if sub.trainer not in (OURS, "plain", "any") else None
    probes: list[tuple[tuple[str, ...], Callable[[], list[ProbeResult] | ProbeResult]]] = [
        (("accumulation.full",), window["accumulation.full"]),
        (("accumulation.short_window",), window["accumulation.short_window"]),
        (("clip.unscaled",), lambda: probe_clip(template, step, one, baseline=sub.baseline)),
        (("skip.is_skip",), lambda: probe_skip(template, step, one)),
        (("schedule.per_step",), lambda: probe_schedule(template, step, micro[:k])),
        (("headroom.fp16_range", "headroom.fp16_underflow"),
         lambda: probe_range(template, micro[0], scale)),
        (("headroom.bf16_vs_fp32", "headroom.fp16_vs_fp32"),
         lambda: probe_low_precision(template, micro[0])),
        (("sanity.init_loss",),
         lambda: probe_init_loss(template, micro[0], declared_init_loss(sub.task), divides)),
        (("sanity.same_seed",),
         lambda: probe_determinism(sub.build, template, step, [micro[:2], micro[2:k]])),
    ]
    results: list[ProbeResult] = []
    for names, probe in probes:
        na = sub.not_applicable
        if all(n in na for n in names):
            results += [not_applicable(n, na[n]) for n in names]
            continue
        try:
            got = probe()
        except NotApplicable as why:
            results += [not_applicable(n, str(why)) for n in names]
            continue
        except Exception as err:
            failed = [r.name for r in results if r.status is Status.FAIL]
            if not failed or not library_raised(err):
                raise LoopRaised(probe=names[0], where=where_raised(err), error=one_line(err),
                                 results=results) from err
            # after a failure, a library's crash on the state the bug left (a GradScaler that
            # recorded no inf check because a hook dropped the gradients; no frame of the
            # user's in the traceback) is that bug, not a new one
            results += [ProbeResult(name=n, status=Status.FAIL, measured=math.nan,
                                    tolerance=math.nan,
                                    meaning=f"FAIL: raised in {where_raised(err)}: "
                                    f"{one_line(err)} (after {', '.join(failed)} failed: the "
                                    "same bug, most likely)") for n in names]
            continue
        ran = {r.name: r for r in (got if isinstance(got, list) else [got])}
        results += [not_applicable(n, na[n]) if n in na else ran[n] for n in names]
    return results
