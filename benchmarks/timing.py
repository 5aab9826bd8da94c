"""Interleaved repetitions and robust statistics.

Other people's jobs share these cores, so a variant measured in one block would absorb
whatever load happened to fall on that block. Variants are therefore run A B C, C B A,
A B C ... (alternating direction cancels a steady drift), every figure is a median, and
ratios are paired: the median over rounds of the ratio within each round.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """Median and quartiles of a sample of seconds (or any positive quantity)."""

    median: float
    p25: float
    p75: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Summary:
        """Summarise ``values``; all-NaN with ``n == 0`` when there are none (tiny data)."""
        if not values:
            return cls(math.nan, math.nan, math.nan, 0)
        if len(values) == 1:
            return cls(values[0], values[0], values[0], 1)
        q = statistics.quantiles(values, n=4, method="inclusive")
        return cls(statistics.median(values), q[0], q[2], len(values))

    def as_dict(self) -> dict[str, float | int]:
        """For JSON."""
        return {"median": self.median, "p25": self.p25, "p75": self.p75, "n": self.n}


class StepClock:
    """Step sink timing each optimizer step in steady state: wall and process-CPU seconds.

    A sample is the time between two consecutive steps of one epoch, i.e. one full turn of the
    training loop (next window, step, telemetry, sinks). The first step of an epoch follows the
    previous validation pass and checkpoint, so it is not counted. CPU time is what a shared
    machine cannot inflate: other people's load stretches wall time, not our CPU seconds.
    """

    def __init__(self, skip_epochs: int = 0) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._skip = skip_epochs  # warm-up epochs not counted
        self._last: tuple[float, float] | None = None

    def tick(self) -> None:
        """Mark the end of one optimizer step."""
        now = (time.perf_counter(), time.process_time())
        if self._last is not None and self._skip <= 0:
            self.wall.append(now[0] - self._last[0])
            self.cpu.append(now[1] - self._last[1])
        self._last = now

    def on_step(self, log: object, epoch: int) -> None:
        """``StepSink``: one step ended."""
        self.tick()

    def on_epoch(self, log: object) -> None:
        """``StepSink``: the epoch ended; the next step starts a new steady state."""
        self._last = None
        self._skip -= 1

    def state_dict(self) -> dict[str, object]:
        """The sink interface's checkpoint state: none, timings do not survive a resume."""
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """The sink interface's restore: nothing to restore."""


Samples = dict[str, list[float]]  # metric -> values, e.g. {"epoch_s": [...], "step_cpu_s": ...}


def interleave(variants: Mapping[str, Callable[[], Samples]], reps: int,
               on_rep: Callable[[int], None] | None = None) -> dict[str, list[Samples]]:
    """Run every variant ``reps`` times, interleaved.

    Args:
        variants: name -> callable returning that repetition's samples per metric.
        reps: repetitions per variant.
        on_rep: called with the repetition index after each round (progress output).

    Returns:
        name -> one ``Samples`` per round, in the order measured.
    """
    names = list(variants)
    rounds: dict[str, list[Samples]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            rounds[name].append(variants[name]())
        if on_rep is not None:
            on_rep(rep)
    return rounds


def pooled(rounds: list[Samples], metric: str) -> list[float]:
    """Every sample of ``metric`` over all rounds."""
    return [v for r in rounds for v in r.get(metric, [])]


def paired_ratios(rounds: list[Samples], base: list[Samples], metric: str) -> list[float]:
    """Per round: this variant's median ``metric`` / the base's median in the same round.

    Load on a shared machine drifts over seconds; a variant and the base measured in the same
    round saw nearly the same load, so their ratio cancels it where a ratio of pooled medians
    does not.
    """
    return [statistics.median(r[metric]) / statistics.median(b[metric])
            for r, b in zip(rounds, base, strict=True) if r.get(metric) and b.get(metric)]


def paired_ratio(rounds: list[Samples], base: list[Samples], metric: str) -> float:
    """Median of ``paired_ratios`` (NaN when no round has samples)."""
    ratios = paired_ratios(rounds, base, metric)
    return statistics.median(ratios) if ratios else math.nan


def ratio(numerator: Summary, denominator: Summary) -> float:
    """Ratio of medians."""
    return numerator.median / denominator.median
