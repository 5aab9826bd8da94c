"""The study that runs until its answer is shown (``strategy=decide``).

``python experiments/sweep.py -m hydra.sweeper.strategy=decide`` runs the grid's configs (the
grid without its seed axis) in rounds until the report's decision can *show* its answer: for
every factor, the chosen level within the margin of the factor's best by multiple comparisons
with the best (``stats.best``), at the error the looks have left. Round 1 gives every config
``n0`` seeds; after each round every factor's choice is recomputed on every recorded run
(``stats.shown``: the report's rule, ``stats.choice.level_choice``, at the look's share of
alpha); the next round gives ``step`` more seeds to every config none of whose levels is shown
worse, while some factor is not settled. It stops when every factor is settled at one look,
at ``max_seeds``, or before a round that would overrun ``budget_runs`` / ``budget_cpu_s``,
and its last line says which.

The plan is a pure function of the recorded runs (``shown.replay``): a killed study re-run
with the same command gets its finished runs back as ``skipped`` results, replays the same
looks and plans the same runs. Seeds, design and budgets are the adaptive study's
(``adaptive.Seeded``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np

from stability.core.config import ConfigError
from stability.design.factors import simplicity
from stability.stats import cost as costs
from stability.stats import sequential as sq
from stability.stats import shown
from stability.sweep.adaptive import Seeded, validate
from stability.sweep.grid import SweepPoint
from stability.sweep.strategy_base import PointMaker, PointResult
from stability.tracking.contract import Tag

KEY = "hydra.sweeper.decide"


@dataclass(frozen=True)
class Settings:
    """``hydra.sweeper.decide.*`` (conf/hydra/sweeper/study.yaml documents each key).

    The defaults, by principle (docs/sweeps.md gives the simulated runs they cost): round 1 is
    the default study (``n0`` = its 5 seeds), so a decide study starts as the fixed one does and
    resumes from its runs; each round adds as many again (``step`` = ``n0``), and with ``rho``
    = 1 every look spends the same share of alpha, so a factor settled on evidence that no
    longer changes stays settled; ``max_seeds`` = 20, the fixed design that shows the default
    study's answer for all three factors in 99% of simulated studies (10 seeds: 57%).
    """

    n0: int = 5
    step: int = 5
    max_seeds: int = 20
    alpha: float = 0.05
    rho: float = 1.0
    margin: str | float = "5%"
    cost_tolerance: float = costs.FLOOR
    budget_runs: int | None = None
    budget_cpu_s: float | None = None

    def __post_init__(self) -> None:
        """Refuse a bad value (``strategy_base.settings_of`` refuses an unknown key).

        Raises:
            ConfigError: one line naming the key and the allowed values.
        """
        validate(self, KEY)
        for k, v in (("rho", self.rho), ("cost_tolerance", self.cost_tolerance)):
            low_ok = v > 0 if k == "rho" else v >= 0
            if isinstance(v, bool) or not isinstance(v, int | float) or not low_ok:
                raise ConfigError(f"{KEY}.{k}={v!r} is invalid: allowed values are a number "
                                  f"{'> 0' if k == 'rho' else '>= 0'}")

    @property
    def plan(self) -> sq.Plan:
        """The rounds and error spending (``stats.sequential.Plan``)."""
        return sq.Plan(n0=self.n0, step=self.step, max_seeds=self.max_seeds, alpha=self.alpha,
                       rho=float(self.rho))

    def to_json(self, base_seed: int) -> str:
        """What the parent run records (``contract.Tag.DECIDE_PLAN``): the report reads it."""
        return json.dumps(asdict(self) | {"base_seed": base_seed}, sort_keys=True)


class DecideStrategy(Seeded):
    """Seeds until every factor's choice is shown (see the module docstring).

    Args:
        points: the de-duplicated grid.
        make: composes overrides into a point (new seeds of a config).
        settings: ``hydra.sweeper.decide`` (``Settings``).

    Raises:
        ConfigError: the grid is not a full factorial, or ``budget_runs`` cannot pay round 1.
    """

    settings_type: ClassVar[type] = Settings
    name: ClassVar[str] = "decide"
    key: ClassVar[str] = KEY

    def __init__(self, points: Sequence[SweepPoint], make: PointMaker | None = None,
                 settings: Settings | None = None) -> None:
        super().__init__(points, make, settings)
        self.simple = tuple(np.array([simplicity(f.name, lv, i) for i, lv in enumerate(f.levels)])
                            for f in self.design.factors)
        self.replay: shown.Replay | None = None

    def tags(self) -> dict[str, str]:
        """What the sweep's parent run records about this strategy (the report reads it)."""
        return {Tag.STRATEGY: self.name, Tag.DECIDE_PLAN: self.settings.to_json(self.base_seed)}

    def initial(self) -> list[SweepPoint]:
        """Round 1: every config, seeds ``base .. base + n0 - 1``."""
        self._lines.append(f"decide: {len(self.configs)} configs over "
                           f"{' x '.join(map(str, self.design.shape))} "
                           f"({', '.join(self.design.names)}); round 1 gives each "
                           f"{self.settings.n0} seeds, looks at {self.plan.looks} seeds, until "
                           "every factor's choice is shown within the margin")
        return self._points(np.ones(self.design.shape + (self.settings.n0,), dtype=bool))

    def next(self, results: Sequence[PointResult]) -> list[SweepPoint] | None:
        """Record the round, replay the looks, and plan the runs the next look needs."""
        self.record(results)
        loss, ran = self.arrays()
        self.replay = shown.replay(loss, ran, self.plan, np.vectorize(self.margin.of,
                                                                       otypes=[float]),
                                   self.simple, self.seconds_array(),
                                   float(self.settings.cost_tolerance))
        self._lines += self._said()
        if self.replay.done:
            self._lines.append(self.outcome())
            return None
        if self.over_budget(self.replay.missing):
            self._lines.append(self.outcome())
            return None
        return self._points(self.replay.missing)

    def outcome(self) -> str:
        """The final line: shown for all factors after N runs, or what stopped the study."""
        rep = self.replay
        runs = len(self.loss)
        if rep is None or not rep.looks:
            return f"decide: no look taken after {runs} runs"
        last = rep.looks[-1]
        if rep.settled:
            return (f"decide: shown for all {len(self.design.names)} factors after {runs} runs "
                    f"(look {last.index}, {last.seeds} seeds): {self._choices(last)}")
        why = self.stopped or f"max_seeds ({self.plan.max_seeds}) reached"
        open_ = [n for n, ok in zip(self.design.names, last.settled, strict=True) if not ok]
        return (f"decide: not shown, stopped by {why} after {runs} runs (look {last.index}); "
                f"open: {', '.join(open_)}; best guess: {self._choices(last)}")

    def _choices(self, lk: shown.Look) -> str:
        return ", ".join(f"{f.name} {f.levels[int(p)]}" + ("" if ok else " (not shown)")
                         for f, p, ok in zip(self.design.factors, lk.pick, lk.settled,
                                             strict=True))

    def _said(self) -> list[str]:
        rep = self.replay
        if rep is None or not rep.looks:
            return []
        lk = rep.looks[-1]
        done = [n for n, ok in zip(self.design.names, lk.settled, strict=True) if ok]
        todo = [n for n, ok in zip(self.design.names, lk.settled, strict=True) if not ok]
        nxt = int(rep.missing.sum())
        return [f"decide: look {lk.index} ({lk.seeds} seeds, margin {float(lk.margin):.4g}, "
                f"alpha share {lk.alpha:.4g}): shown {', '.join(done) or 'none'}; open "
                f"{', '.join(todo) or 'none'}; {len(self.loss)} runs so far"
                + (f"; the next round asks {nxt} runs" if nxt else "")]
