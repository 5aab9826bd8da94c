"""What a strategy is: the ``Strategy`` base, a round's ``PointResult``, the grid strategy.

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

A strategy carries its own settings type (``settings_type``, a frozen dataclass): the sweeper
reads ``hydra.sweeper.<name>`` into it (``settings_of``) before anything runs, and calls the
class as ``Class(points, make, settings)``. Strategies are chosen by name from
``strategy_registry``; the sweeper names none of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from stability.core.config import ConfigError
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


@dataclass(frozen=True)
class NoSettings:
    """The settings of a strategy that takes none."""


@runtime_checkable
class Strategy(Protocol):
    """Plans a sweep round by round (see the module docstring).

    Built as ``Class(points, make, settings)``: the de-duplicated grid in grid order, the
    ``PointMaker`` for points it adds, and an instance of its ``settings_type``.

    Attributes:
        settings_type: a frozen dataclass whose fields are the keys of ``hydra.sweeper.<name>``
            (``settings_of`` builds it; its ``__post_init__`` may refuse a value with a
            ``ConfigError`` naming the key).
        reads_losses: whether ``next`` reads the results' losses and run times (the sweeper
            then reads the store each round); False: only their statuses.
    """

    settings_type: ClassVar[type]
    reads_losses: ClassVar[bool]

    def initial(self) -> list[SweepPoint]:
        """The first round's points."""
        ...

    def next(self, results: Sequence[PointResult]) -> list[SweepPoint] | None:
        """The next round's points given the last round's results; None when done."""
        ...

    def tags(self) -> dict[str, str]:
        """What the sweep's parent run records about the strategy (the report may read it)."""
        ...

    def lines(self) -> list[str]:
        """What the strategy has to say since it was last asked (the sweeper says it)."""
        ...


# What the sweeper uses of a strategy class: checked when it is looked up.
MEMBERS = ("settings_type", "reads_losses", "initial", "next", "tags", "lines")


def settings_of(settings_type: type, values: Mapping[str, Any] | None, key: str) -> Any:
    """``values`` (the mapping at ``key``, e.g. ``hydra.sweeper.adaptive``) as ``settings_type``.

    Raises:
        ConfigError: a key the type does not have, or a value its constructor refuses; one
            line naming the key and the allowed keys or values.
    """
    if values is not None and not isinstance(values, Mapping):
        raise ConfigError(f"{key}={values!r} is invalid: allowed values are a mapping of "
                          f"{_keys(settings_type)}")
    values = dict(values or {})
    known = {f.name for f in dataclasses.fields(settings_type)}
    for k in values:
        if k not in known:
            raise ConfigError(f"{key}.{k} is unknown: allowed keys are {_keys(settings_type)}")
    try:
        return settings_type(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{key} is invalid: {' '.join(str(err).split())}") from None


def _keys(settings_type: type) -> str:
    names = sorted(f.name for f in dataclasses.fields(settings_type))
    return ", ".join(names) if names else "none (this strategy takes no settings)"


class GridStrategy:
    """The full grid in one round (the default study).

    Args:
        points: the de-duplicated grid, in grid order.
        make: composes overrides into a point (unused: the grid is known up front).
        settings: none (``NoSettings``).
    """

    settings_type: ClassVar[type] = NoSettings
    reads_losses: ClassVar[bool] = False  # the grid plans nothing from the results

    def __init__(self, points: Sequence[SweepPoint], make: PointMaker | None = None,
                 settings: NoSettings | None = None) -> None:
        self.points = list(points)
        self.make = make
        self.settings = settings or NoSettings()

    def initial(self) -> list[SweepPoint]:
        """Every grid point."""
        return list(self.points)

    def next(self, results: Sequence[PointResult]) -> list[SweepPoint] | None:
        """Nothing after the grid."""
        return None

    def tags(self) -> dict[str, str]:
        """Nothing: a parent run without a strategy tag is the grid's."""
        return {}

    def lines(self) -> list[str]:
        """Nothing to say."""
        return []


def with_override(overrides: Sequence[str], key: str, value: object) -> list[str]:
    """``overrides`` with ``key`` set to ``value`` (replaced if present, else appended).

    E.g. a new seed of a point: ``make(with_override(p.overrides, "seed", 7))``.
    """
    kept = [o for o in overrides if override_key(o) != key]
    return [*kept, f"{key}={value}"]
