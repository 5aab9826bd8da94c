"""Sweep progress: runs done out of total, failures, elapsed time and an ETA."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def format_duration(seconds: float) -> str:
    """``3725`` -> ``1h02m05s``; ``65`` -> ``1m05s``; ``7.4`` -> ``7s``."""
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    return f"{m}m{s:02d}s" if m else f"{s}s"


@dataclass
class Progress:
    """Counts completed runs; ``line()`` is what the sweep prints as runs end.

    The ETA assumes the remaining work goes at the pace of the work done so far. Work is each
    run's expected cost (``stability.sweep.schedule``; 1 a run unless given), so a sweep that
    starts with its longest runs does not promise too much after its first ones. The first
    update also paid for starting the workers (importing torch and MLflow), so once a second
    one is in, the pace is measured from the first.
    """

    total: int
    total_cost: float = math.nan  # expected cost of all runs (default: ``total``, 1 a run)
    done: int = 0
    failed: int = 0
    done_cost: float = 0.0
    clock: Callable[[], float] = time.monotonic  # seconds; injectable for tests
    started: float = field(default=math.nan)  # clock() at creation unless given
    _first: tuple[float, float] | None = field(default=None, repr=False)  # time, cost done

    def __post_init__(self) -> None:
        if math.isnan(self.started):
            self.started = self.clock()
        if math.isnan(self.total_cost):
            self.total_cost = float(self.total)

    def update(self, done: int, failed: int = 0, cost: float | None = None) -> None:
        """Record ``done`` more completed runs (``failed`` did not finish) worth ``cost``."""
        self.done += done
        self.failed += failed
        self.done_cost += done if cost is None else cost
        if self._first is None:
            self._first = (self.clock(), self.done_cost)

    def elapsed(self) -> float:
        """Seconds since the sweep started launching."""
        return self.clock() - self.started

    def eta(self) -> float | None:
        """Estimated seconds left (None before the first run completes)."""
        if self.done == 0 or self._first is None:
            return None
        t_first, cost_first = self._first
        left = max(self.total_cost - self.done_cost, 0.0)
        if self.done_cost > cost_first:
            return (self.clock() - t_first) / (self.done_cost - cost_first) * left
        return self.elapsed() / self.done_cost * left if self.done_cost > 0 else None

    def line(self) -> str:
        """E.g. ``runs 12/240 done (1 not finished), 3m10s elapsed, ETA 58m20s``."""
        eta = self.eta()
        failed = f" ({self.failed} not finished)" if self.failed else ""
        eta_text = "ETA unknown" if eta is None else f"ETA {format_duration(eta)}"
        return (f"runs {self.done}/{self.total} done{failed}, "
                f"{format_duration(self.elapsed())} elapsed, {eta_text}")
