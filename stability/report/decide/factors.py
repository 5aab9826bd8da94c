"""Factor effects of the whole study: every run is evidence, seeds are blocks.

Each config is a point of the design (``stability.design``): a level of every swept factor
(clipping: off or a threshold; accumulation; precision; any other key the sweep varied, e.g.
``train.lr``). For a factor's level against its reference (clip off, accum 1, fp32, the
smallest value otherwise) every cell of the other factors and every seed gives one paired
difference of best validation loss; ``stability.stats.effects`` turns the cells x seeds table
into an effect, a CI, Holm-adjusted p-values and a verdict (helps / hurts / equivalent /
undecided). Two-way interactions are the same analysis on 2 x 2 differences of differences.

A run that did not finish (diverged, failed, killed) has no best validation loss. It is not
dropped: it counts as the worst finished loss of the study (a floor on how bad it was), its
level's divergence count is shown beside the effect, and a contrast with unfinished runs can
never be called equivalent.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from stability.design.design import Design, Factor
from stability.design.factors import CLIP
from stability.report.decide.select import effective_loss, train_seconds
from stability.report.evidence.fetch import SWEPT
from stability.stats import effects as fx
from stability.stats.paired import min_detectable


@dataclass(frozen=True)
class Effect:
    """One contrast (``level`` vs the factor's reference), or an interaction or simple effect."""

    factor: str
    level: str
    reference: str
    mean: float
    low: float
    high: float
    p: float
    p_equiv: float
    df: float
    sd_seed: float
    cells: int
    seeds: int
    unfinished: tuple[int, int] = (0, 0)  # runs of (level, reference) that did not finish
    runs: int = 0
    p_holm: float = math.nan
    p_equiv_holm: float = math.nan
    verdict: str = ""
    seeds_to_decide: float = math.nan
    detectable: float = math.nan
    cost_ratio: float = math.nan  # training seconds per run, level / reference
    clipped: float = math.nan  # mean share of steps clipped at this level (clipping levels)
    at: str = ""  # for a simple effect or an interaction: "accumulation 8"


@dataclass(frozen=True)
class FactorAnalysis:
    """The study's factors, main effects, interactions and the simple effects behind them."""

    factors: tuple[Factor, ...]
    margin: float
    alpha: float
    confidence: float
    main: tuple[Effect, ...] = ()
    interactions: tuple[Effect, ...] = ()
    simple: dict[tuple[str, str, str], tuple[Effect, ...]] = field(default_factory=dict)
    dropped_cells: int = 0


def design_of(runs: pd.DataFrame, configs: pd.Series | None = None) -> Design:
    """The study's ``Design``: ``Design.of`` each config's params (its first run's), the
    sweep's swept keys (``runs.attrs["swept"]``, set by ``fetch.fetch_runs``; None: unknown)
    as the keys a plain factor may be, never a param that only a planted run varies.

    Args:
        runs: one row per training run.
        configs: the config ids (fingerprints) to place; None: every config of ``runs``.
    """
    first = runs.drop_duplicates("fingerprint").set_index("fingerprint")
    ids = first.index if configs is None else configs
    return Design.of({fp: first.loc[fp].to_dict() for fp in ids}, runs.attrs.get(SWEPT))


@dataclass(frozen=True, eq=False)
class Designed:
    """A study's design and its runs placed in it (``design``), made once per report.

    Attributes:
        of: the ``Design`` of the configs (``design_of``).
        table: one row per run with its factor levels (strings), seed, loss and training
            seconds.
        factors: the design's factors; factors with a single level are not factors.
    """

    of: Design
    table: pd.DataFrame
    factors: list[Factor]


def design(runs: pd.DataFrame, configs: pd.DataFrame) -> Designed:
    """One row per run with its factor levels (strings), seed, loss and training seconds.

    The factors are ``design_of``'s for ``configs``' fingerprints: clipping, accumulation and
    precision (``stability.design.factors``), and the params that vary and that the sweep swept.
    The design depends on the set of ``configs``' fingerprints, not on their order (``Design.of``
    sorts them), so one ``Designed`` serves every step of a report.
    """
    d = design_of(runs, configs["fingerprint"])
    loss = effective_loss(runs)
    finite = loss[np.isfinite(loss)]
    worst = float(finite.max()) if len(finite) else math.nan
    table = pd.DataFrame({
        "fingerprint": runs["fingerprint"], "seed": runs["seed"].astype(int),
        "loss": loss.where(np.isfinite(loss), worst), "finished": np.isfinite(loss),
        "seconds": train_seconds(runs),
        "clip_fraction": pd.to_numeric(runs.get("clip_fraction", math.nan), errors="coerce"),
    })
    for f in d.factors:
        table[f.name] = table["fingerprint"].map({fp: d.level(fp, f.name) for fp in d.configs})
    return Designed(of=d, table=table, factors=list(d.factors))


@dataclass(frozen=True)
class Cube:
    """Loss, unfinished runs and run counts as arrays ``[level of factor 1, ..., seed]``.

    A point the study did not run is NaN in ``loss`` and 0 in ``ran``.
    """

    loss: np.ndarray
    unfinished: np.ndarray
    ran: np.ndarray

    @classmethod
    def of(cls, table: pd.DataFrame, factors: list[Factor]) -> Cube:
        """Place every run of ``design``'s table in the cube (the mean, if a point repeats)."""
        seeds = sorted(table["seed"].unique())
        shape = [len(f.levels) for f in factors] + [len(seeds)]
        idx = tuple(table[f.name].map({lv: i for i, lv in enumerate(f.levels)}).to_numpy(int)
                    for f in factors)
        idx += (table["seed"].map({s: i for i, s in enumerate(seeds)}).to_numpy(int),)
        total, count, bad = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        np.add.at(total, idx, table["loss"].to_numpy(float))
        np.add.at(count, idx, 1)
        np.add.at(bad, idx, (~table["finished"].to_numpy(bool)).astype(float))
        with np.errstate(invalid="ignore", divide="ignore"):
            return cls(total / count, bad, count)

    def contrast(self, axis: int, a: int, r: int) -> Cube:
        """Level ``a`` minus level ``r`` along ``axis`` (that axis removed; counts of ``a``)."""
        def pick(x: np.ndarray, i: int) -> np.ndarray:
            return np.take(x, i, axis=axis)
        return Cube(pick(self.loss, a) - pick(self.loss, r), pick(self.unfinished, a),
                    pick(self.ran, a) + pick(self.ran, r))

    def at(self, axis: int, i: int) -> Cube:
        """The slice at level ``i`` of ``axis``."""
        return Cube(*(np.take(x, i, axis=axis) for x in (self.loss, self.unfinished, self.ran)))

    def cells_by_seeds(self) -> tuple[np.ndarray, int]:
        """The cells x seeds table (NaN where a run is missing on either side) and how many of
        its cells lack a seed that others have.

        Cells that never ran are left out; a missing point drops only itself
        (``effects.estimate``), so one extra or missing seed never costs a whole cell.
        """
        d = self.loss.reshape(-1, self.loss.shape[-1])
        ran = np.isfinite(d).any(axis=1)
        complete = np.isfinite(d).all(axis=1)
        return d[ran], int((ran & ~complete).sum())


def _effect(c: Cube, f: Factor, a: int, margin: float, confidence: float,
            ref_unfinished: int = 0, at: str = "") -> tuple[Effect | None, int]:
    """Level ``a`` of ``f`` against its reference from the contrast cube ``c``, and the cells
    that lacked a seed (None: fewer than two seeds, or no finite mean)."""
    d, lost = c.cells_by_seeds()
    if d.size == 0 or d.shape[1] < 2:
        return None, lost
    e = fx.estimate(d)
    if e.seeds < 2 or not np.isfinite(e.mean):
        return None, lost
    low, high = fx.interval(e, confidence)
    return Effect(factor=f.name, level=f.levels[a], reference=f.reference, mean=float(e.mean),
                  low=float(low), high=float(high), p=float(fx.p_two_sided(e)),
                  p_equiv=float(fx.p_equivalent(e, margin)), df=float(e.df),
                  sd_seed=float(e.sd_seed), cells=e.cells, seeds=e.seeds,
                  unfinished=(int(c.unfinished.sum()), ref_unfinished), runs=int(c.ran.sum()),
                  at=at), lost


def _decide(effects: list[Effect], alpha: float, power: float, margin: float,
            equivalence: bool = True) -> list[Effect]:
    """Holm over the family, then the verdicts and what an undecided one would need."""
    if not effects:
        return []
    p_holm = fx.holm(np.array([e.p for e in effects]))
    p_eq = np.array([e.p_equiv if equivalence and e.unfinished == (0, 0) else math.nan
                     for e in effects])
    p_eq_holm = fx.holm(p_eq)
    verdicts = fx.decide(np.array([e.mean for e in effects]), p_holm,
                         np.nan_to_num(p_eq_holm, nan=1.0), alpha)
    first = alpha / len(effects)  # the level Holm's first step tests at: what power is quoted at
    out = []
    for e, ph, pq, v in zip(effects, p_holm, p_eq_holm, verdicts, strict=True):
        need = fx.seeds_to_decide(e.mean, e.sd_seed, margin, first, power) \
            if v == fx.UNDECIDED and equivalence else math.nan
        out.append(replace(e, p_holm=float(ph), p_equiv_holm=float(pq), verdict=str(v),
                           seeds_to_decide=need,
                           detectable=min_detectable(e.sd_seed, e.seeds, first, power)))
    return out


def analyse(runs: pd.DataFrame, configs: pd.DataFrame, margin: float, alpha: float = 0.05,
            confidence: float = 0.95, power: float = 0.8, *,
            designed: Designed | None = None) -> FactorAnalysis:
    """Main effects, two-way interactions and simple effects of every swept factor.

    Args:
        runs: one row per training run (``fetch.fetch_runs``).
        configs: ``select.aggregate(runs)``.
        margin: the equivalence margin (loss units).
        alpha: family-wise error of each family (main effects; interactions).
        confidence: level of the intervals.
        power: power at which undecided contrasts quote the seeds that would decide them.
        designed: ``design(runs, configs)``, made once by the report (None: made here).
    """
    d = designed if designed is not None else design(runs, configs)
    table, factors = d.table, d.factors
    cube = Cube.of(table, factors)
    seconds = table[[f.name for f in factors] + ["seconds"]] if factors else None
    main: list[Effect] = []
    dropped = 0
    for i, f in enumerate(factors):
        ref_bad = int(cube.at(i, 0).unfinished.sum())
        for a in range(1, len(f.levels)):
            e, lost = _effect(cube.contrast(i, a, 0), f, a, margin, confidence, ref_bad)
            dropped += lost
            if e is not None:
                clipped = table.loc[table[f.name] == f.levels[a], "clip_fraction"].mean()
                main.append(_with_cost(e, seconds, clipped if f.name == CLIP else math.nan))
    inter: list[Effect] = []
    simple: dict[tuple[str, str, str], tuple[Effect, ...]] = {}
    for (i, fa), (j, fb) in itertools.permutations(enumerate(factors), 2):
        jj = j - (j > i)  # fb's axis once fa's axis is contrasted away
        for a in range(1, len(fa.levels)):
            diff = cube.contrast(i, a, 0)
            by_b = [_effect(diff.at(jj, b), fa, a, margin, confidence,
                            int(cube.at(i, 0).at(jj, b).unfinished.sum()),
                            at=f"{fb.name} {fb.levels[b]}")[0] for b in range(len(fb.levels))]
            simple[(fa.name, fa.levels[a], fb.name)] = tuple(e for e in by_b if e is not None)
            if i > j:  # each 2 x 2 interaction once
                continue
            for b in range(1, len(fb.levels)):
                twice = Cube(diff.at(jj, b).loss - diff.at(jj, 0).loss, np.zeros(1), np.zeros(1))
                e, _ = _effect(twice, fa, a, margin, confidence,
                               at=f"{fb.name} {fb.levels[b]} vs {fb.reference}")
                if e is not None:
                    inter.append(e)
    return FactorAnalysis(factors=tuple(factors), margin=margin, alpha=alpha,
                          confidence=confidence, main=tuple(_decide(main, alpha, power, margin)),
                          interactions=tuple(_decide(inter, alpha, power, margin,
                                                     equivalence=False)),
                          simple=simple, dropped_cells=dropped)


def _log_mean(seconds: pd.Series) -> float:
    s = seconds[seconds > 0].dropna()
    return float(np.log(s).mean()) if len(s) else math.nan


def _with_cost(e: Effect, seconds: pd.DataFrame | None, clipped: float = math.nan) -> Effect:
    """Training seconds per run at this level over the reference's: the geometric means over
    their runs, the decision's own measure (``stats.cost.level_cost``), so the answer, the
    factor table and the sentences print one number."""
    if seconds is None:
        return replace(e, clipped=float(clipped))
    lvl = _log_mean(seconds.loc[seconds[e.factor] == e.level, "seconds"])
    ref = _log_mean(seconds.loc[seconds[e.factor] == e.reference, "seconds"])
    ratio = float(np.exp(lvl - ref)) if math.isfinite(lvl) and math.isfinite(ref) else math.nan
    return replace(e, cost_ratio=ratio, clipped=float(clipped))
