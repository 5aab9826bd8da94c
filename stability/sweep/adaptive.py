"""The adaptive study: seeds only where a factor's verdict is still open (``strategy=adaptive``).

``python experiments/sweep.py -m hydra.sweeper.strategy=adaptive`` runs the grid's configs
(the grid without its seed axis) in rounds. Round 1 gives every config ``n0`` seeds; after each
round the main-effect verdicts are recomputed on every recorded run of the study
(``stability.stats.looks`` replays ``stats.sequential``'s looks: alpha spending over looks,
Holm over contrasts at each look), and the next round adds seeds only to the configs an
undecided contrast reads. A level decided **hurts** leaves as a whole. The study stops when
every contrast is decided (or given up for futility), at ``max_seeds``, or when the next round
would overrun ``budget_runs`` or ``budget_cpu_s``.

The plan is a pure function of the recorded results (``looks.replay``): a killed study re-run
with the same command gets its finished runs back as ``skipped`` results with their recorded
losses, replays the same looks and plans the same runs.

Seeds: config ``c`` gets seeds ``base, base + 1, ...`` with ``base`` the grid's smallest seed;
the grid's other seed values are not used. ``design`` is the adapter between sweep points
and the arrays the statistics read: ``stability.design.Design`` of the points' configs, the
same design the report replays from their runs (``report.decide.factors.design``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from stability.core.config import ConfigError
from stability.core.identity import flatten
from stability.design.design import NEVER, Design
from stability.design.margin import Margin
from stability.stats import looks
from stability.stats import sequential as sq
from stability.sweep.grid import SweepPoint, override_key
from stability.sweep.strategy_base import NOT_STARTED, PointMaker, PointResult, with_override
from stability.tracking.contract import Tag

KEY = "hydra.sweeper.adaptive"


@dataclass(frozen=True)
class Settings:
    """``hydra.sweeper.adaptive.*`` (conf/hydra/sweeper/study.yaml documents each key);
    ``strategy_base.settings_of`` builds it from the sweeper's config."""

    n0: int = 3
    step: int = 2
    max_seeds: int = 9
    alpha: float = 0.05
    power: float = 0.8
    margin: str | float = "5%"
    budget_runs: int | None = None
    budget_cpu_s: float | None = None

    def __post_init__(self) -> None:
        """Refuse a bad value (``strategy_base.settings_of`` refuses an unknown key).

        Raises:
            ConfigError: one line naming the key and the allowed values.
        """
        validate(self, KEY)

    @property
    def plan(self) -> sq.Plan:
        """The rounds and error spending of ``stats.sequential``."""
        return sq.Plan(n0=self.n0, step=self.step, max_seeds=self.max_seeds, alpha=self.alpha,
                       power=self.power)

    def to_json(self, base_seed: int) -> str:
        """What the parent run records (``contract.Tag.ADAPTIVE_PLAN``): the report replays it."""
        return json.dumps(asdict(self) | {"base_seed": base_seed}, sort_keys=True)


def validate(settings: Any, key: str) -> None:
    """Refuse a bad value of the settings a seeded study shares (``n0``, ``step``,
    ``max_seeds``, ``alpha``, ``power`` where it has one, ``margin``, the budgets).

    Raises:
        ConfigError: one line naming the key and the allowed values.
    """
    def whole(k: str, low: int, none: bool = False) -> None:
        v = getattr(settings, k)
        if v is None and none:
            return
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ConfigError(f"{key}.{k}={v!r} is invalid: allowed values are an integer "
                              f">= {low}" + (" or null" if none else ""))

    whole("n0", 2)
    whole("step", 1)
    whole("max_seeds", 2)
    whole("budget_runs", 1, none=True)
    for k, low, high in (("alpha", 0, 1), ("power", 0, 1)):
        if not hasattr(settings, k):
            continue
        v = getattr(settings, k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not low < v < high:
            raise ConfigError(f"{key}.{k}={v!r} is invalid: allowed values are "
                              f"{low} < {k} < {high}")
    cpu = settings.budget_cpu_s
    if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, int | float)
                            or not cpu > 0):
        raise ConfigError(f"{key}.budget_cpu_s={cpu!r} is invalid: allowed values are "
                          "seconds > 0 or null")
    Margin.parse(settings.margin, f"{key}.margin")
    n0, most = settings.n0, settings.max_seeds
    if most < n0:
        raise ConfigError(f"{key}.max_seeds={most} is invalid: allowed values are "
                          f"an integer >= n0 ({n0})")


def configs(points: Sequence[SweepPoint]) -> dict[str, SweepPoint]:
    """The grid's configs: each fingerprint's first point, in grid order."""
    out: dict[str, SweepPoint] = {}
    for p in points:
        out.setdefault(p.fingerprint, p)
    return out


def design_of(points: Sequence[SweepPoint]) -> Design:
    """The design of the grid's points (seeds ignored): ``Design.of`` their configs' params
    (``core.identity.flatten``), the grid's override keys as the swept keys. The report builds
    the same ``Design`` from these configs' runs (``report.decide.factors.design_of``)."""
    by_fp = configs(points)
    return Design.of({fp: flatten(p.cfg) for fp, p in by_fp.items()}, swept_keys(points))


def swept_keys(points: Sequence[SweepPoint]) -> set[str]:
    """The override keys whose value differs between the grid's points (the seed included)."""
    values: dict[str, set[str]] = {}
    for p in points:
        for o in p.overrides:
            values.setdefault(override_key(o), set()).add(o.split("=", 1)[1])
    return {k for k, v in values.items() if len(v) > 1}


def design(points: Sequence[SweepPoint], strategy: str = "adaptive") -> Design:
    """The factorial design of the grid's points (``design_of``), checked.

    Raises:
        ConfigError: the configs are not a full factorial, or no factor has two levels (a
            swept key that is never a factor, e.g. ``train.threads``, names itself).
    """
    d = design_of(points)
    if not d.full:
        never = sorted(k for k in swept_keys(points) if k.startswith(NEVER) and k != "seed")
        why = (f"; {', '.join(never)} {'is' if len(never) == 1 else 'are'} swept but never a "
               "factor (not a setting of training)") if never else ""
        raise ConfigError(
            f"hydra.sweeper.strategy={strategy} is invalid for this grid: allowed grids are a full "
            f"factorial of at least one factor with two levels (got {len(d.cells)} configs over "
            f"{' x '.join(map(str, d.shape)) or 'no factor'}{why})")
    return d


class Seeded:
    """What a study that adds seeds round by round keeps: the grid's configs as a factorial,
    the recorded runs, the budgets, and the points of a round (``AdaptiveStrategy``,
    ``decide.DecideStrategy``).

    Args:
        points: the de-duplicated grid.
        make: composes overrides into a point (new seeds of a config).
        settings: the strategy's settings (its ``settings_type``).

    Raises:
        ConfigError: the grid is not a full factorial, or ``budget_runs`` cannot pay round 1.
    """

    settings_type: ClassVar[type] = Settings
    reads_losses: ClassVar[bool] = True
    name: ClassVar[str] = "adaptive"  # hydra.sweeper.strategy=<name>; its lines start with it
    key: ClassVar[str] = KEY  # its settings' block

    def __init__(self, points: Sequence[SweepPoint], make: PointMaker | None = None,
                 settings: Any = None) -> None:
        self.settings = settings or self.settings_type()
        self.plan = self.settings.plan
        self.design = design(points, self.name)
        self.margin = Margin.parse(self.settings.margin, f"{self.key}.margin")
        self.configs = tuple(configs(points).values())  # grid order
        self.cells = tuple(self.design.cell(p.fingerprint) for p in self.configs)
        self.make = make
        self.base_seed = min(p.cfg.seed for p in points)
        self.fingerprints = {p.fingerprint: i for i, p in enumerate(self.configs)}
        first = len(self.configs) * self.settings.n0
        budget = self.settings.budget_runs
        if budget is not None and budget < first:
            raise ConfigError(f"{self.key}.budget_runs={budget} is invalid: allowed values are "
                              f"at least the first round, {len(self.configs)} configs x "
                              f"n0={self.settings.n0} = {first} runs")
        self.loss: dict[tuple[int, int], float] = {}  # (config, seed index) -> loss or NaN
        self.seconds: dict[tuple[int, int], float] = {}
        self.stopped = ""  # why the study ended before its rule did ("" when it did)
        self._lines: list[str] = []

    def lines(self) -> list[str]:
        """What the strategy has to say since last asked (the sweeper says it)."""
        out, self._lines = self._lines, []
        return out

    def record(self, results: Sequence[PointResult]) -> None:
        """Keep each result's loss (NaN: did not finish) and seconds by (config, seed index)."""
        for r in results:
            c = self.fingerprints.get(r.fingerprint)
            i = r.seed - self.base_seed
            if c is None or not 0 <= i < self.plan.max_seeds or r.status == NOT_STARTED:
                continue  # not started: not recorded, the next look asks for it again
            ok = r.best_val_loss is not None and math.isfinite(r.best_val_loss)
            self.loss[(c, i)] = float(r.best_val_loss) if ok else math.nan
            if r.seconds is not None and math.isfinite(r.seconds):
                self.seconds[(c, i)] = float(r.seconds)

    def over_budget(self, todo: np.ndarray) -> str:
        """Why the runs ``todo`` would overrun a budget ("" when they would not); kept in
        ``stopped`` and said."""
        spent, cost = len(self.loss), int(todo.sum())
        budget = self.settings.budget_runs
        if budget is not None and spent + cost > budget:
            self.stopped = f"budget_runs: the next round needs {cost} runs, {budget - spent} left"
        elif self.settings.budget_cpu_s is not None:
            used, more = self.cpu_seconds(todo)
            if used + more > self.settings.budget_cpu_s:
                self.stopped = (f"budget_cpu_s: the next round needs ~{more:.0f} CPU-s, "
                                f"{self.settings.budget_cpu_s - used:.0f} left")
        if self.stopped:
            self._lines.append(f"{self.name}: stopped, {self.stopped}")
        return self.stopped

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(loss, ran)`` as ``[levels..., seed index]`` (NaN loss: unfinished or not run)."""
        shape = self.design.shape + (self.plan.max_seeds,)
        loss, ran = np.full(shape, np.nan), np.zeros(shape, dtype=bool)
        for (c, i), v in self.loss.items():
            loss[self.cells[c] + (i,)] = v
            ran[self.cells[c] + (i,)] = True
        return loss, ran

    def seconds_array(self) -> np.ndarray:
        """Each recorded run's seconds as ``[levels..., seed index]`` (NaN: unknown)."""
        out = np.full(self.design.shape + (self.plan.max_seeds,), np.nan)
        for (c, i), v in self.seconds.items():
            out[self.cells[c] + (i,)] = v
        return out

    def cpu_seconds(self, todo: np.ndarray) -> tuple[float, float]:
        """Seconds the recorded runs took, and an estimate for ``todo`` (each config's mean
        run, else the study's; a run without a recorded time counts at its config's mean)."""
        known = list(self.seconds.values())
        overall = float(np.mean(known)) if known else 0.0
        mean = {}
        for c in range(len(self.configs)):
            mine = [s for (cc, _), s in self.seconds.items() if cc == c]
            mean[c] = float(np.mean(mine)) if mine else overall
        used = sum(self.seconds.get(k, mean[k[0]]) for k in self.loss)
        more = sum(mean[c] * int(todo[cell].sum()) for c, cell in enumerate(self.cells))
        return used, more

    def _points(self, want: np.ndarray) -> list[SweepPoint]:
        assert self.make is not None or not want.any()
        out = []
        for p, cell in zip(self.configs, self.cells, strict=True):
            for i in np.flatnonzero(want[cell]):
                seed = self.base_seed + int(i)
                out.append(p if p.cfg.seed == seed else
                           self.make(with_override(p.overrides, "seed", seed)))  # type: ignore[misc]
        return out


class AdaptiveStrategy(Seeded):
    """Seeds where a verdict is open (see the module docstring).

    Args:
        points: the de-duplicated grid.
        make: composes overrides into a point (new seeds of a config).
        settings: ``hydra.sweeper.adaptive`` (``Settings``).

    Raises:
        ConfigError: the grid is not a full factorial, or ``budget_runs`` cannot pay round 1.
    """

    settings_type: ClassVar[type] = Settings

    def __init__(self, points: Sequence[SweepPoint], make: PointMaker | None = None,
                 settings: Settings | None = None) -> None:
        super().__init__(points, make, settings)
        self.replay: looks.Replay | None = None

    def tags(self) -> dict[str, str]:
        """What the sweep's parent run records about this strategy (the report reads it)."""
        return {Tag.STRATEGY: "adaptive", Tag.ADAPTIVE_PLAN: self.settings.to_json(self.base_seed)}

    def initial(self) -> list[SweepPoint]:
        """Round 1: every config, seeds ``base .. base + n0 - 1``."""
        self._lines.append(f"adaptive: {len(self.configs)} configs over "
                           f"{' x '.join(map(str, self.design.shape))} "
                           f"({', '.join(self.design.names)}); round 1 gives each "
                           f"{self.settings.n0} seeds, looks at {self.plan.looks} seeds")
        return self._points(np.ones(self.design.shape + (self.settings.n0,), dtype=bool))

    def next(self, results: Sequence[PointResult]) -> list[SweepPoint] | None:
        """Record the round, replay the looks, and plan the runs the next look needs."""
        self.record(results)
        loss, ran = self.arrays()
        self.replay = looks.replay(loss, ran, self.plan, self.margin.of)
        self._lines += self._said()
        if self.replay.done or self.over_budget(self.replay.missing):
            return None
        return self._points(self.replay.missing)

    def _said(self) -> list[str]:
        rep = self.replay
        if rep is None or not rep.states:
            return []
        s = rep.states[-1]
        words = [sq.VERDICTS[v] for v in s.verdict]
        count = {w: words.count(w) for w in dict.fromkeys(words)}
        line = (f"adaptive: look {s.looks} ({self.plan.looks[s.looks - 1]} seeds), margin "
                f"{rep.margin:.4g}: " + ", ".join(f"{n} {w}" for w, n in count.items())
                + f"; {int(s.futile.sum())} given up; {int(s.needed.sum())} configs need "
                "more seeds")
        return [line]
