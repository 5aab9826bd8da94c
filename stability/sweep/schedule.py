"""Which job to start first: a run's expected cost, and the grid ordered longest first.

A pool of workers that takes the next job whenever one finishes (``stability.sweep.pool``)
ends soonest when the long jobs go first (Graham's LPT rule: within 4/3 of the optimum, and
near it when there are many jobs per worker); the short ones then fill the gaps at the end.
Only the order matters here, so costs are relative:

- epochs: a run's cost is proportional to the epochs it trains;
- precision, on a CPU: autocast to fp16 / bf16 has no fast kernels for these small models
  (docs/performance.md, "Per precision": bf16 epochs 2.6-2.9x and fp16 5.6-6.5x fp32 over
  four benchmark runs). On a GPU the ratios differ and are not measured here, so every
  precision counts the same there and the grid order is kept;
- accum_steps: of the 2.6 ms a default-task micro-batch costs at accum 1, ~0.5 ms is the
  optimizer step's share (docs/performance.md, "Gradient accumulation"), paid once a window.

Durations that the same experiment already measured beat this model: ``observed_costs``
reads the finished runs' wall time per epoch, and ``order`` uses them when they cover
every kind of job in the sweep. When they do not, ``with_probes`` moves the first job of each
kind to the front, so the sweep's ETA (``stability.sweep.eta``) measures every kind early.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from stability.core.precision import Precision
from stability.sweep.grid import SweepPoint

# Relative s/epoch on one CPU core (midpoints of the measured ranges quoted above).
CPU_PRECISION_COST = {Precision.FP32: 1.0, Precision.BF16: 2.7, Precision.FP16: 6.0}
STEP_SHARE = 0.5 / 2.6  # the optimizer step's share of a micro-batch at accum_steps=1

CostKey = tuple[str, str, int]  # task target, precision, accum_steps


def cost_key(point: SweepPoint) -> CostKey:
    """What a run's cost per epoch depends on, as far as a sweep varies it."""
    cfg = point.cfg
    return cfg.task.target, cfg.precision.name, cfg.train.accum_steps


def modelled_cost(point: SweepPoint, on_cpu: bool = True) -> float:
    """Relative cost of ``point``: epochs x precision factor x accumulation factor."""
    cfg = point.cfg
    precision = CPU_PRECISION_COST.get(cfg.precision.name, 1.0) if on_cpu else 1.0
    accum = (1 - STEP_SHARE) + STEP_SHARE / cfg.train.accum_steps
    return cfg.train.epochs * precision * accum


def observed_costs(runs: Iterable[Any]) -> dict[CostKey, float]:
    """Median training seconds per epoch per ``cost_key``, from finished MLflow runs.

    Args:
        runs: MLflow ``Run`` objects of training runs (their params and ``wall_time_s``).
    """
    seen: dict[CostKey, list[float]] = defaultdict(list)
    for run in runs:
        params, metrics = run.data.params, run.data.metrics
        try:
            key = (params["task._target_"], params["precision.name"],
                   int(params["train.accum_steps"]))
            per_epoch = metrics["wall_time_s"] / int(params["train.epochs"])
        except (KeyError, ValueError, ZeroDivisionError):
            continue  # an older run without these records says nothing about cost
        seen[key].append(per_epoch)
    return {k: statistics.median(v) for k, v in seen.items()}


def measured(points: Sequence[SweepPoint], observed: Mapping[CostKey, float] | None) -> bool:
    """Whether ``observed`` covers every point's ``cost_key`` (then ``order`` uses it)."""
    return observed is not None and bool(observed) and {
        cost_key(p) for p in points} <= observed.keys()


def order(points: Sequence[SweepPoint], observed: Mapping[CostKey, float] | None = None,
          on_cpu: bool = True) -> list[tuple[SweepPoint, float]]:
    """``points`` with their expected cost, longest first (ties keep the grid order).

    Args:
        points: the jobs to run.
        observed: measured seconds per epoch (``observed_costs``); used only when it covers
            every point's ``cost_key`` (mixing measured seconds with modelled ratios would
            compare different units).
        on_cpu: the jobs train on a CPU (where low precision is slower).
    """
    if measured(points, observed):
        assert observed is not None
        costed = [(p, p.cfg.train.epochs * observed[cost_key(p)]) for p in points]
    else:
        costed = [(p, modelled_cost(p, on_cpu)) for p in points]
    return sorted(costed, key=lambda pc: -pc[1])  # sorted() is stable


def with_probes(costed: Sequence[tuple[SweepPoint, float]]) -> list[tuple[SweepPoint, float]]:
    """``costed`` (longest first) with the first job of each ``cost_key`` moved to the front.

    A modelled cost is only a ratio; the ETA learns each kind's seconds from its first runs.
    Longest first alone runs every fp16 job before the first fp32 one, so the fp32 jobs' time
    would stay a guess until late. Moving one job of each kind (12 of the default study's 240)
    ahead barely changes when the sweep ends: the queue after them is still longest first, and
    its short jobs still fill the gaps at the end.
    """
    seen: set[CostKey] = set()
    probes, rest = [], []
    for pc in costed:
        key = cost_key(pc[0])
        (rest if key in seen else probes).append(pc)
        seen.add(key)
    return probes + rest
