"""How a sweep plans: which points run first, and which run next once their results are in.

The sweeper (``stability.sweep.sweeper``) runs a loop over a ``Strategy``::

    points = strategy.initial()
    while points:
        results = <launch points, wait for them>      # one PointResult per point
        points = strategy.next(results)              # None (or []): the sweep is done

Every round lands in the same sweep: the same parent run, sweep id and folder. Today's study
is ``GridStrategy``: the whole de-duplicated grid at once, nothing after it. A strategy that
adds seeds where the comparison is not yet decided (the statistics are in ``stability.stats``)
returns those new points from ``next``; it builds them with the ``PointMaker`` it was given,
so each one is composed and validated like a grid point.

A strategy is chosen with ``hydra.sweeper.strategy=<module.Class>`` (default: the grid;
``strategies.load_strategy``). Its
class is called as ``Class(points, make)``: the grid's points and the point maker.
``hydra.sweeper.strategy=adaptive`` is ``adaptive.AdaptiveStrategy`` (seeds where a factor's
verdict is still open), called with ``hydra.sweeper.adaptive``'s settings as well.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from stability.sweep.grid import SweepPoint, override_key

# Hydra overrides -> a validated point (irrelevant settings dropped, ``grid.make_point``).
PointMaker = Callable[[Sequence[str]], SweepPoint]

FINISHED = "finished"  # trained to the end: ``best_val_loss`` is finite
NOT_FINISHED = "not_finished"  # ran and ended otherwise: diverged, failed, killed, worker died
NOT_STARTED = "not_started"  # the sweep was stopped before its job started
SKIPPED = "skipped"  # already FINISHED in the experiment before this sweep (resume)
STATUSES = (FINISHED, NOT_FINISHED, NOT_STARTED, SKIPPED)


@dataclass(frozen=True)
class PointResult:
    """What one point of a round did.

    Attributes:
        point: the point (its overrides and config).
        status: one of ``STATUSES``.
        best_val_loss: the run's best validation loss; None unless ``status`` is finished or
            skipped (then the recorded run's).
        seconds: the run's recorded ``wall_time_s`` (one core per run: its training
            CPU-seconds); None where the store does not hold it (yet).
    """

    point: SweepPoint
    status: str
    best_val_loss: float | None = None
    seconds: float | None = None

    @property
    def fingerprint(self) -> str:
        """The point's config fingerprint (``stability.core.identity.fingerprint``)."""
        return self.point.fingerprint

    @property
    def seed(self) -> int:
        """The point's training seed."""
        return self.point.cfg.seed


@runtime_checkable
class Strategy(Protocol):
    """Plans a sweep round by round (see the module docstring)."""

    def initial(self) -> list[SweepPoint]:
        """The first round's points."""
        ...

    def next(self, results: Sequence[PointResult]) -> list[SweepPoint] | None:
        """The next round's points given the last round's results; None when done."""
        ...


class GridStrategy:
    """The full grid in one round (the default study).

    Args:
        points: the de-duplicated grid, in grid order.
        make: composes overrides into a point (unused: the grid is known up front).
    """

    def __init__(self, points: Sequence[SweepPoint], make: PointMaker | None = None) -> None:
        self.points = list(points)
        self.make = make

    def initial(self) -> list[SweepPoint]:
        """Every grid point."""
        return list(self.points)

    def next(self, results: Sequence[PointResult]) -> list[SweepPoint] | None:
        """Nothing after the grid."""
        return None


def with_override(overrides: Sequence[str], key: str, value: object) -> list[str]:
    """``overrides`` with ``key`` set to ``value`` (replaced if present, else appended).

    E.g. a new seed of a point: ``make(with_override(p.overrides, "seed", 7))``.
    """
    kept = [o for o in overrides if override_key(o) != key]
    return [*kept, f"{key}={value}"]
