"""The study's design: the factors that vary, their levels in order, and each config's cell.

One function builds it, ``Design.of``, from each config's params (dotted keys): the sweep
passes its grid's points (``core.identity.flatten`` of each config, the grid's override keys
as the swept keys), the report its fetched runs' params (the sweep's recorded swept keys).
Built from the same configs either way, it is the same ``Design``: the adaptive strategy
seeds on the design the report replays.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from stability.design.factors import FIRST_CLASS, Params, first_class, kind, sort_key

# Params that differ between a study's configs without being settings: where and how runs were
# tracked, run on, monitored or faulted, and the seed (the blocks, never a factor). The one list
# of the sweep and the report (``report.evidence.grid`` sets a run aside on any other unswept
# param).
NEVER = ("seed", "hydra.", "tracking.", "telemetry.", "output_dir", "device", "world_size",
         "train.num_workers", "train.threads", "fault.", "monitor.")


def set_by(param: str, swept: Collection[str]) -> bool:
    """Whether ``param`` is set by a swept key (a config group's key sets ``<key>.*``)."""
    return any(param == k or param.startswith(k + ".") for k in swept)


def plain_factor(param: str, swept: Collection[str] | None) -> bool:
    """Whether ``param`` may be a plain factor: a setting the sweep swept (``swept`` None: any),
    not a first-class factor's and not in ``NEVER``."""
    return ("." in param and not param.startswith(NEVER) and not first_class(param)
            and (swept is None or set_by(param, swept)))


def _missing(value: object) -> bool:
    """A param a run did not record (absent, None or NaN in a fetched table)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


@dataclass(frozen=True)
class Factor:
    """A factor that varies: its levels in order, the first is the reference."""

    name: str
    levels: tuple[str, ...]

    @property
    def reference(self) -> str:
        """The level every other level is compared with."""
        return self.levels[0]

    @property
    def title(self) -> str:
        """Its heading: ``Clipping``, ``Learning rate``, ``optim.weight_decay``."""
        return kind(self.name).title

    def name_of(self, level: str) -> str:
        """``level`` as sentences name it (``accum 8``)."""
        return kind(self.name).name_of(level)


@dataclass(frozen=True)
class Design:
    """The factors that vary and each config's cell (its level index per factor).

    Attributes:
        factors: first-class factors in registry order, then plain ones by key.
        configs: the config ids (fingerprints), sorted.
        cells: each config's level index per factor, in ``configs``' order.
        constant: the first-class factors that do not vary, at their one level (a figure's
            axis still shows them).
    """

    factors: tuple[Factor, ...]
    configs: tuple[str, ...]
    cells: tuple[tuple[int, ...], ...]
    constant: tuple[Factor, ...] = ()

    @classmethod
    def of(cls, params: Mapping[str, Params], swept: Collection[str] | None = None) -> Design:
        """The design of configs given by their params.

        Args:
            params: each config's id (fingerprint) and params (dotted keys; a seed's or a run's
                bookkeeping params are ignored: ``NEVER``).
            swept: the keys the sweep swept (a plain factor is a param they set); None: any
                param that varies.
        """
        ids = sorted(params)
        levels: dict[str, dict[str, str]] = {}
        first = {k.name for k in FIRST_CLASS}
        for k in FIRST_CLASS:
            assert k.level is not None
            levels[k.name] = {c: k.level(params[c]) for c in ids}
        # A plain factor varies among the values runs recorded: a run without the param (a
        # planted run has none) is no level of it, so it cannot make every param a factor.
        plain = sorted(p for p in {p for c in ids for p in params[c] if plain_factor(p, swept)}
                       if len({str(params[c][p]) for c in ids
                               if not _missing(params[c].get(p))}) > 1)
        for p in plain:
            levels[p] = {c: str(params[c].get(p)) for c in ids}
        every = [Factor(name, tuple(sorted(set(by.values()), key=lambda v, n=name: sort_key(n, v))))
                 for name, by in levels.items()]
        factors = tuple(f for f in every if len(f.levels) > 1)
        constant = tuple(f for f in every if len(f.levels) == 1 and f.name in first)
        cells = tuple(tuple(f.levels.index(levels[f.name][c]) for f in factors) for c in ids)
        return cls(factors, tuple(ids), cells, constant)

    @property
    def names(self) -> tuple[str, ...]:
        """The factors' names."""
        return tuple(f.name for f in self.factors)

    @property
    def levels(self) -> tuple[tuple[str, ...], ...]:
        """Each factor's levels, the reference first."""
        return tuple(f.levels for f in self.factors)

    @property
    def shape(self) -> tuple[int, ...]:
        """Levels per factor."""
        return tuple(len(f.levels) for f in self.factors)

    @property
    def full(self) -> bool:
        """A full factorial of at least one factor: every cell once, no two configs share one."""
        return (bool(self.factors) and len(set(self.cells)) == len(self.cells)
                == math.prod(self.shape))

    @property
    def axes(self) -> tuple[Factor, ...]:
        """The first-class factors in registry order (varying or not), then the plain ones."""
        named = {f.name: f for f in self.factors + self.constant}
        first = tuple(named[k.name] for k in FIRST_CLASS if k.name in named)
        return first + tuple(f for f in self.factors if f not in first)

    def cell(self, config: str) -> tuple[int, ...]:
        """``config``'s level index per factor."""
        return self.cells[self.configs.index(config)]

    def level(self, config: str, factor: str) -> str:
        """``config``'s level of ``factor`` (a constant factor's one level too)."""
        if factor not in self.names:
            return next(f.reference for f in self.constant if f.name == factor)
        i = self.names.index(factor)
        return self.factors[i].levels[self.cell(config)[i]]
