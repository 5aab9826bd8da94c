"""The equivalence margin: one parse of its syntax (``"5%"`` or a loss difference).

``report.margin`` and ``hydra.sweeper.adaptive.margin`` share the syntax: a share of the best
config's mean loss written with ``%`` (``"5%"``, surrounding whitespace ignored, strictly
between 0 and 100) or a loss difference > 0 (a number, not a string). ``Margin.of`` turns it
into loss units; the statistics take that number (or ``Margin.of`` itself, where the best
mean is known only at the first look). ``Margin.lowest`` is the report's margin: the share of the
lowest config mean (the one place that rule lives; the decision's simulations call it too).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from stability.core.validation import ConfigError

ALLOWED = "a share of the best config's mean loss (\"5%\") or a loss difference > 0"


def _parse(spec: object) -> tuple[float, bool] | None:
    """``(value, relative)``, or None when ``spec`` is not a margin."""
    if isinstance(spec, str):
        text = spec.strip()
        if not text.endswith("%"):
            return None
        try:
            share = float(text[:-1])
        except ValueError:
            return None
        return (share, True) if 0 < share < 100 else None
    if isinstance(spec, bool) or not isinstance(spec, int | float):
        return None
    return (float(spec), False) if 0 < spec < math.inf else None


@dataclass(frozen=True)
class Margin:
    """A margin: a share (percent) of the best config's mean loss, or loss units."""

    value: float
    relative: bool = False

    @staticmethod
    def ok(spec: object) -> bool:
        """Whether ``spec`` is a margin (``ALLOWED``)."""
        return _parse(spec) is not None

    @classmethod
    def parse(cls, spec: object, key: str = "margin") -> Margin:
        """The margin ``spec`` writes.

        Args:
            spec: ``"5%"`` or a number > 0.
            key: the setting's name for the error.

        Raises:
            ConfigError: one line naming ``key`` and the allowed values.
        """
        got = _parse(spec)
        if got is None:
            raise ConfigError(f"{key}={spec!r} is invalid: allowed values are {ALLOWED}")
        return cls(*got)

    def of(self, loss: float) -> float:
        """In loss units: the share of ``|loss|`` (NaN when ``loss`` is not finite: no finite
        best, so nothing is equivalent), or the absolute value."""
        if not self.relative:
            return self.value
        return self.value / 100 * abs(loss) if math.isfinite(loss) else math.nan

    def lowest(self, means: Iterable[float]) -> float:
        """In loss units, for a study whose configs have these mean losses: the share of the
        lowest mean (NaN means ignored; +inf, a config with an unfinished seed, is never the
        lowest unless all are: then NaN, as ``of``)."""
        return self.of(min((float(m) for m in means if not math.isnan(m)), default=math.inf))

    @property
    def spec(self) -> str | float:
        """As written in a config: ``"5%"`` or the number."""
        return f"{self.value:g}%" if self.relative else self.value
