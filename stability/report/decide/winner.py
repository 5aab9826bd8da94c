"""The decision: a level per factor from the factor effects, by cost, then the config it makes.

For each factor (factors whose interaction is detected are one group, decided on their joint
levels) the levels are compared with the best one by multiple comparisons with the best
(``stability.stats.best``), every run a paired piece of evidence with seeds as blocks. The
candidates are the levels shown within the margin of the best (the guaranteed choice); if none
is, the levels within it one comparison at a time; if none is, the level with the lowest
estimate (both best guesses, printed with the simultaneous upper bound and the seeds that would
show the level within the margin with 80% power). Among the candidates the cheapest on the
measured device is taken (a cost difference counts only when shown beyond the run-to-run
spread of the study's own timings and 10% past it, ``stability.stats.cost``), then the
simplest, then the lowest mean. The winner is the config those choices make; a config
with an unfinished seed is never the winner (the next choice in order is taken instead). It is
the one config the sealed test is opened for. docs/report.md ("The decision") gives the method
and why.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from stability.design.design import Factor
from stability.design.factors import simplicity
from stability.report.decide.decided import Spent
from stability.report.decide.factors import Cube, Designed, FactorAnalysis, design
from stability.stats import best as mcb
from stability.stats import cost as costs
from stability.stats.choice import Terms, joint, level_choice

# What a choice rests on: shown within the margin / within it one comparison at a time / the
# lowest estimate / the next level in the rule's order (the first choice has an unfinished seed).
CHOSEN_WITHIN, CHOSEN_NEAR, CHOSEN_LOWEST = mcb.WITHIN_BASIS, mcb.NEAR_BASIS, mcb.LOWEST_BASIS
CHOSEN_NEXT = "next"


@dataclass(frozen=True)
class Settings:
    """The decision's settings (``report.margin`` in loss units, ``report.alpha``,
    ``report.cost_tolerance``, ``report.power``).

    Attributes:
        margin: the margin of "within the best" (loss units).
        alpha: the error the whole decision may spend (split over the groups).
        cost_tolerance: the share a cost difference must exceed beyond the measured spread.
        power: of the seeds that would show an open choice within the margin.
    """

    margin: float
    alpha: float = 0.05
    cost_tolerance: float = costs.FLOOR
    power: float = mcb.POWER


@dataclass(frozen=True)
class Choice:
    """One decided group: a factor, or factors decided jointly because they interact.

    Levels are tuples of one level name per factor of the group; every per-level tuple is in
    the order of ``levels``.
    """

    factors: tuple[str, ...]
    levels: tuple[tuple[str, ...], ...]
    status: tuple[str, ...]  # mcb.WITHIN / NEAR / WORSE / OPEN / ABSENT per level
    upper: tuple[float, ...]  # simultaneous upper bound of (level - best level)
    gap: tuple[float, ...]  # point estimate of (level - best level)
    mean: tuple[float, ...]  # mean loss of the level's runs (unfinished at the worst loss)
    seconds: tuple[float, ...]  # mean training seconds per run at the level
    log_cost: tuple[float, ...]  # mean log training seconds (stats.cost.level_cost)
    cost_spread: float  # run-to-run SD of log seconds within a config (NaN: unmeasured)
    cost_runs: tuple[int, ...]  # runs with a measured cost at each level
    chosen: int  # index into ``levels`` of the winner's level
    preferred: int  # the rule's choice before the unfinished-seed check (usually ``chosen``)
    basis: str  # CHOSEN_WITHIN / CHOSEN_NEAR / CHOSEN_LOWEST / CHOSEN_NEXT, of ``chosen``
    seeds_needed: float = math.nan  # seeds that would show ``chosen`` within (mcb.POWER)

    @property
    def cost(self) -> costs.Cost:
        """The levels' measured cost."""
        return costs.Cost(np.array(self.log_cost), np.array(self.cost_spread),
                          np.array(self.cost_runs))


@dataclass(frozen=True)
class Decision:
    """The winner and how each factor was decided.

    ``fingerprint`` is None when no config of the grid is fully finished.
    """

    choices: tuple[Choice, ...]
    fingerprint: str | None
    margin: float
    alpha: float
    cost_tolerance: float
    note: str = ""  # why the winner is not the rule's first choice, if it is not
    study: str = ""  # a decide study's looks (``report.decide.decided.Spent.note``); "" otherwise

    @property
    def guaranteed(self) -> bool:
        """Every chosen level is shown within the margin of its factor's best."""
        return all(c.basis == CHOSEN_WITHIN for c in self.choices)


def groups(an: FactorAnalysis | None, factors: list[Factor]) -> list[list[int]]:
    """Factor indices grouped by detected interaction (Holm p < alpha): connected components."""
    parent = list(range(len(factors)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    index = {f.name: i for i, f in enumerate(factors)}
    for e in (an.interactions if an is not None else ()):
        if not e.p_holm < an.alpha or e.factor not in index:
            continue
        other = next((f.name for f in factors if e.at.startswith(f"{f.name} ")), None)
        if other is not None:
            parent[root(index[e.factor])] = root(index[other])
    out: dict[int, list[int]] = {}
    for i in range(len(factors)):
        out.setdefault(root(i), []).append(i)
    return list(out.values())


def decide(runs: pd.DataFrame, configs: pd.DataFrame, an: FactorAnalysis | None,
           settings: Settings, *, spent: Spent | None = None,
           designed: Designed | None = None) -> Decision:
    """The winner of the study, factor by factor.

    Args:
        runs: one row per training run (``fetch.fetch_runs``).
        configs: ``select.aggregate(runs)``.
        an: the factor analysis (its interactions group the factors); None: no grouping.
        settings: the margin, the alpha the whole decision may spend, the cost tolerance and
            the power of the seeds needed.
        spent: a decide study's last look (``report.decide.decided``): the decision spends its share
            of alpha only, the bounds over the levels not shown worse, as the study's looks
            did; ``settings.alpha`` stays the guarantee over all looks.
        designed: ``design(runs, configs)``, made once by the report (None: made here).
    """
    margin, alpha, cost_tolerance = settings.margin, settings.alpha, settings.cost_tolerance
    level = alpha  # the guarantee printed: 1 - alpha (a decide study's, over all its looks)
    unknown = spent is not None and not spent.alpha > 0  # looks not replayed: nothing shown
    if spent is not None and not unknown:
        alpha = spent.alpha
    constrained = spent is not None
    d = designed if designed is not None else design(runs, configs)
    table, factors = d.table, d.factors
    if not factors:  # one config: nothing to decide
        fp = _finished(configs)
        return Decision(choices=(), fingerprint=fp[0] if fp else None, margin=margin, alpha=level,
                        cost_tolerance=cost_tolerance, study=spent.note if spent else "")
    cube = Cube.of(table, factors)
    timing = Cube.of(table.assign(loss=table["seconds"], finished=True), factors).loss
    # A grid that is not fully crossed (some combination never ran) cannot be read factor by
    # factor: its configs are compared with each other, all factors as one group.
    crossed = bool(np.isfinite(cube.loss).any(axis=-1).all())
    parts = groups(an, factors) if crossed else [list(range(len(factors)))]
    # no margin, or a decide study whose share of alpha is unknown: nothing is "within"
    delta = margin if math.isfinite(margin) and not unknown else -math.inf
    choices = []
    for axes in parts:
        names = tuple(factors[a].name for a in axes)
        levels = list(itertools.product(*(factors[a].levels for a in axes)))
        seconds = table.groupby(list(names))["seconds"].mean()
        mean_s = [seconds.get(lv if len(lv) > 1 else lv[0], math.nan) for lv in levels]
        simple = np.array([sum(simplicity(factors[a].name, lv[i], factors[a].levels.index(lv[i]))
                               for i, a in enumerate(axes)) for lv in levels])
        terms = Terms(delta=delta, alpha=alpha / len(parts), tolerance=cost_tolerance,
                      constrained=constrained)
        b, mean, pick = level_choice(cube.loss, len(factors), axes, terms, timing, simple)
        cost = costs.level_cost(joint(timing, axes, len(factors)))
        choices.append(Choice(
            factors=names, levels=tuple(levels), status=tuple(str(s) for s in b.status),
            upper=tuple(float(u) for u in b.upper), gap=tuple(float(g) for g in b.gap),
            mean=tuple(float(m) for m in mean), seconds=tuple(float(x) for x in mean_s),
            log_cost=tuple(float(x) for x in cost.log_mean), cost_spread=float(cost.spread),
            cost_runs=tuple(int(x) for x in cost.runs),
            chosen=int(pick), preferred=int(pick), basis=_basis_of(b, int(pick)),
            seeds_needed=_seeds(b, int(pick), delta, settings.power)))
    dec = _settle(table, configs, choices, factors, settings)
    return replace(dec, study=spent.note) if spent else dec


def _basis_of(b: mcb.Best, i: int) -> str:
    return {mcb.WITHIN: CHOSEN_WITHIN, mcb.NEAR: CHOSEN_NEAR}.get(str(b.status[i]), CHOSEN_LOWEST)


def _seeds(b: mcb.Best, i: int, delta: float, power: float) -> float:
    """Seeds that would show level ``i`` within the margin with probability ``power`` (NaN:
    already shown, or no margin)."""
    if b.status[i] == mcb.WITHIN or not math.isfinite(delta):
        return math.nan
    return mcb.seeds_to_within(b, i, delta, power)


def _order(c: Choice, margin: float, tolerance: float) -> list[int]:
    """The group's levels from the rule's first choice down: the same rule on what is left."""
    out = [c.chosen]
    status, gap = np.array(c.status), np.array(c.gap)
    delta = margin if math.isfinite(margin) else -math.inf
    left = (status != mcb.ABSENT) & (np.arange(len(c.levels)) != c.chosen)
    while left.any():
        pool = mcb.candidates(status, gap, delta, available=left)
        cheap = costs.equally_cheap(c.cost, pool, tolerance)
        i = int(mcb.choose(pool, cheap, np.zeros(len(c.levels)), np.array(c.mean)))
        out.append(i)
        left[i] = False
    return out


def _finished(configs: pd.DataFrame) -> list[str]:
    done = configs[(configs["seeds_diverged"] + configs["seeds_failed"] == 0)
                   & (configs["seeds_finished"] > 0)]
    return [str(fp) for fp in done["fingerprint"]]


def _settle(table: pd.DataFrame, configs: pd.DataFrame, choices: list[Choice],
            factors: list[Factor], settings: Settings) -> Decision:
    """The config the choices make; if it has an unfinished seed, the next combination
    (``settings.alpha``: the guarantee printed)."""
    margin, alpha, tolerance = settings.margin, settings.alpha, settings.cost_tolerance
    ok = set(_finished(configs))
    names = [f.name for f in factors]
    # Configs that differ only in keys that are not factors (e.g. the monitor) share a cell:
    # the cell's fully finished config of best rank stands for it.
    first = table.drop_duplicates("fingerprint")
    rank = dict(zip(configs["fingerprint"], configs["rank"], strict=True))
    at: dict[tuple[str, ...], str] = {}
    rows = first[["fingerprint", *names]].to_dict("records")
    for row in sorted(rows, key=lambda r: rank.get(r["fingerprint"], 0)):
        if row["fingerprint"] in ok:
            at.setdefault(tuple(row[n] for n in names), str(row["fingerprint"]))
    orders = [_order(c, margin, tolerance) for c in choices]
    combos = sorted(itertools.product(*(range(len(o)) for o in orders)),
                    key=lambda r: (sum(r), r))
    for ranks in combos:
        picked = {n: c.levels[o[r]][i] for c, o, r in zip(choices, orders, ranks, strict=True)
                  for i, n in enumerate(c.factors)}
        fp = at.get(tuple(picked[n] for n in names))
        if fp is None:
            continue
        final = [c if not r else _moved(c, o[r])
                 for c, o, r in zip(choices, orders, ranks, strict=True)]
        note = "" if not any(ranks) else (
            "the rule's first choice is not a fully finished config of the grid (a config with "
            "an unfinished seed is never recommended): the next choice in order was taken")
        return Decision(choices=tuple(final), fingerprint=str(fp), margin=margin, alpha=alpha,
                        cost_tolerance=tolerance, note=note)
    return Decision(choices=tuple(choices), fingerprint=None, margin=margin, alpha=alpha,
                    cost_tolerance=tolerance,
                    note="no config of the grid finished every seed: nothing is recommended")


def _moved(c: Choice, i: int) -> Choice:
    """``c`` with level ``i`` chosen instead (shown within, within one comparison at a time,
    or else the next in the rule's order)."""
    basis = {mcb.WITHIN: CHOSEN_WITHIN, mcb.NEAR: CHOSEN_NEAR}.get(c.status[i], CHOSEN_NEXT)
    return Choice(**{**c.__dict__, "chosen": i, "basis": basis, "seeds_needed": math.nan})
