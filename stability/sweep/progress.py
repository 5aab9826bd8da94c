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
    """Counts completed runs; ``line()`` is what the sweep prints after each batch.

    The ETA assumes the remaining runs take as long on average as the ones done so far. The
    first batch also pays for starting the workers (importing torch and MLflow), so once a
    second batch is in, the rate is measured from the end of the first one.
    """

    total: int
    done: int = 0
    failed: int = 0
    clock: Callable[[], float] = time.monotonic  # seconds; injectable for tests
    started: float = field(default=math.nan)  # clock() at creation unless given
    _first: tuple[float, int] | None = field(default=None, repr=False)  # end of the first batch

    def __post_init__(self) -> None:
        if math.isnan(self.started):
            self.started = self.clock()

    def update(self, done: int, failed: int = 0) -> None:
        """Record ``done`` more completed runs, ``failed`` of which did not finish."""
        self.done += done
        self.failed += failed
        if self._first is None:
            self._first = (self.clock(), self.done)

    def elapsed(self) -> float:
        """Seconds since the sweep started launching."""
        return self.clock() - self.started

    def eta(self) -> float | None:
        """Estimated seconds left (None before the first run completes)."""
        if self.done == 0 or self._first is None:
            return None
        t_first, done_first = self._first
        if self.done > done_first:
            return (self.clock() - t_first) / (self.done - done_first) * (
                self.total - self.done)
        return self.elapsed() / self.done * (self.total - self.done)

    def line(self) -> str:
        """E.g. ``runs 12/240 done (1 not finished), 3m10s elapsed, ETA 58m20s``."""
        eta = self.eta()
        failed = f" ({self.failed} not finished)" if self.failed else ""
        eta_text = "ETA unknown" if eta is None else f"ETA {format_duration(eta)}"
        return (f"runs {self.done}/{self.total} done{failed}, "
                f"{format_duration(self.elapsed())} elapsed, {eta_text}")
