"""Where a sweep stands: runs done / running / failed / skipped, elapsed, ETA, lowest mean so far.

``Progress`` is the state the sweep's status display (``stability.sweep.display``) draws:
counts, the time left (``eta.Eta``: the cost model corrected by this sweep's finished runs),
the lowest-mean config so far on validation (mean best val loss over its finished seeds) and
the last finished run's one-line result. It only counts; it prints nothing.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from stability.sweep.eta import Eta


def format_duration(seconds: float) -> str:
    """``3725`` -> ``1h02m05s``; ``65`` -> ``1m05s``; ``7.4`` -> ``7s``."""
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    return f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """Counts a sweep's runs as they start and end.

    Args:
        labels: each job's run name (``fp16 clip=1 acc=4 s=3``), in launch order.
        configs: each job's config label (its run name without the seed): seeds of one config
            are averaged for "best so far".
        eta: the sweep's ``Eta`` over the same jobs.
        skipped: points not launched because they already FINISHED (resume).
        clock: seconds (``time.time``: the pool's start marks are file times); injectable.
    """

    def __init__(self, labels: Sequence[str], configs: Sequence[str], eta: Eta,
                 skipped: int = 0, clock: Callable[[], float] = time.time) -> None:
        self.labels, self.configs = list(labels), list(configs)
        self.total = len(self.labels)
        self.eta = eta
        self.skipped = skipped
        self.clock = clock
        self.started = clock()
        self.done = 0  # finished training (a finite best validation loss)
        self.failed = 0  # ended without finishing: diverged, failed, killed, worker died
        self.last = ""
        self._values: dict[str, list[float]] = defaultdict(list)

    @classmethod
    def of(cls, points: Sequence[Any], costs: Sequence[float], workers: int,
           skipped: int = 0) -> Progress:
        """The progress of a sweep's jobs (``grid.SweepPoint``, in launch order).

        Args:
            points: the jobs to run.
            costs: their modelled costs (``schedule.order``).
            workers: jobs that run at once.
            skipped: points not launched because they already FINISHED.
        """
        from stability.core.identity import config_label, flatten
        from stability.sweep.schedule import cost_key
        from stability.tracking.uri import run_name

        eta = Eta([cost_key(p) for p in points], costs, workers)
        return cls([run_name(p.cfg) for p in points],
                   [config_label(flatten(p.cfg)) for p in points], eta, skipped)

    @property
    def running(self) -> int:
        """Jobs started and not ended yet."""
        return len(self.eta.started)

    def start(self, job: int, at: float | None = None) -> None:
        """Job ``job`` started (at ``at``, default now)."""
        self.eta.start(job, self.clock() if at is None else at)

    def end(self, job: int, value: float | None, at: float | None = None,
            duration: float | None = None) -> None:
        """Job ``job`` ended with best validation loss ``value`` (None or not finite: it did
        not finish); ``duration`` seconds (default: since ``start``)."""
        at = self.clock() if at is None else at
        self.eta.end(job, at, duration)
        ok = value is not None and math.isfinite(value)
        label = self.labels[job]
        if ok:
            self.done += 1
            self._values[self.configs[job]].append(float(value))  # type: ignore[arg-type]
            self.last = f"{label}: best val loss {value:.4f}"
        else:
            self.failed += 1
            self.last = f"{label}: not finished (its log has why)"

    def elapsed(self) -> float:
        """Seconds since the sweep started launching."""
        return self.clock() - self.started

    def eta_s(self) -> float | None:
        """Estimated seconds left (None until a run has ended)."""
        if self.done + self.failed >= self.total:
            return 0.0
        return self.eta.remaining(self.clock())

    def best(self) -> tuple[str, float, int] | None:
        """(config label, mean best val loss, seeds) of the lowest-mean config so far, or None.

        The lowest mean so far, not the report's choice (which weighs cost, simplicity and
        stability too): the live display calls it "lowest mean", never "best".
        """
        if not self._values:
            return None
        config, values = min(self._values.items(), key=lambda kv: sum(kv[1]) / len(kv[1]))
        return config, sum(values) / len(values), len(values)

    def counts(self) -> str:
        """E.g. ``12/240 done, 2 running, 1 failed, 0 skipped``."""
        return (f"{self.done}/{self.total} done, {self.running} running, "
                f"{self.failed} failed, {self.skipped} skipped")

    def timing(self) -> str:
        """E.g. ``3m10s elapsed, ETA 8m20s``."""
        eta = self.eta_s()
        eta_text = "ETA unknown" if eta is None else f"ETA {format_duration(eta)}"
        return f"{format_duration(self.elapsed())} elapsed, {eta_text}"

    def best_text(self) -> str:
        """E.g. ``bf16 clip=5 acc=1 (val loss 0.0777, 5 seeds)``, or ``none yet``."""
        best = self.best()
        if best is None:
            return "none yet"
        config, mean, n = best
        return f"{config} (val loss {mean:.4f}, {n} seed{'s' if n > 1 else ''})"

    def line(self) -> str:
        """The whole status as one line (plain output: CI, SLURM logs, ``| tee``)."""
        text = (f"runs {self.counts()}; {self.timing()}; lowest mean so far: "
                f"{self.best_text()}")
        return text + (f"; last: {self.last}" if self.last else "")

    def lines(self) -> list[str]:
        """The status as a few lines (the live display on a terminal)."""
        return [f"runs          {self.counts()}", f"time          {self.timing()}",
                f"lowest mean   {self.best_text()}", f"last          {self.last or '-'}"]
