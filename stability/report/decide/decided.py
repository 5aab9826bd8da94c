"""A decide study's looks, replayed: the share of alpha its answer may spend, and what to say.

A sweep run with ``hydra.sweeper.strategy=decide`` (``stability.sweep.decide``) records its
settings on its parent run (``Tag.DECIDE_PLAN``). Its answer's "shown" claims hold with
probability ``1 - alpha`` over all looks together only if each look spends its own share of
alpha (``stats.shown``: a union bound over the looks). So the report decides a decide study
at the share of the last round its runs reach (a run's round is the look whose seeds it added:
seed index in ``[n_{k-1}, n_k)``), with the bounds over the levels not shown worse, as the
study did; its decision is then the study's last look (the same runs, margin, costs and
rule), and the guarantee line says so. The looks are replayed from the runs
(``shown.replay``) to say whether and when the answer was shown; nothing per run is needed,
and the recorded plan is data: parsed into numbers and bounded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stability.design.factors import simplicity
from stability.design.margin import Margin
from stability.report.decide import factors as fa
from stability.report.decide.spending import MAX_SEEDS_READ
from stability.stats import sequential as sq
from stability.stats import shown
from stability.tracking.contract import Tag

STRATEGY = "decide"


@dataclass(frozen=True)
class Spent:
    """What a decide study's answer may spend and say.

    Attributes:
        alpha: the share of alpha of the last round the runs reach (the answer's MCB spends it).
        note: the guarantee line's words, e.g. ``decide study: 416 runs, shown at look 3``.
    """

    alpha: float
    note: str


def plan_of(tags: Mapping[str, str]) -> tuple[sq.Plan, Margin, float, int] | None:
    """The decide plan a sweep's parent recorded: ``(plan, margin, cost_tolerance, base_seed)``;
    None for any other sweep.

    Raises:
        ValueError: the recorded plan does not parse or is out of bounds.
    """
    if tags.get(Tag.STRATEGY) != STRATEGY:
        return None
    raw = json.loads(tags.get(Tag.DECIDE_PLAN) or "{}")
    plan = sq.Plan(n0=int(raw["n0"]), step=int(raw["step"]), max_seeds=int(raw["max_seeds"]),
                   alpha=float(raw["alpha"]), rho=float(raw["rho"]))
    if plan.max_seeds > MAX_SEEDS_READ:
        raise ValueError(f"max_seeds {plan.max_seeds} > {MAX_SEEDS_READ}")
    tolerance = float(raw.get("cost_tolerance", 0.0))
    if not 0 <= tolerance < math.inf:
        raise ValueError(f"cost_tolerance {tolerance!r}")
    return plan, Margin.parse(raw.get("margin", "5%")), tolerance, int(raw.get("base_seed", 0))


def analyse(runs: pd.DataFrame, configs: pd.DataFrame, plan: sq.Plan, margin: Margin,
            tolerance: float, base_seed: int, *, designed: fa.Designed | None = None) -> Spent:
    """Replay the study's looks on its runs: the share its answer spends, and the words."""
    d = designed if designed is not None else fa.design(runs, configs)
    table, factors = d.table, d.factors
    shape = tuple(len(f.levels) for f in factors) + (plan.max_seeds,)
    loss, ran, secs = np.full(shape, np.nan), np.zeros(shape, bool), np.full(shape, np.nan)
    wall = pd.to_numeric(runs.get("wall_time_s", pd.Series(math.nan, index=runs.index)),
                         errors="coerce").reindex(table.index)
    for i, row in table.iterrows():
        k = int(row["seed"]) - base_seed
        if not 0 <= k < plan.max_seeds:
            continue  # outside the plan: not read
        at = tuple(f.levels.index(row[f.name]) for f in factors) + (k,)
        ran[at] = True
        loss[at] = row["loss"] if row["finished"] else np.nan
        secs[at] = wall[i]  # the strategy's cost: each run's wall_time_s (PointResult.seconds)
    simple = tuple(np.array([simplicity(f.name, lv, j) for j, lv in enumerate(f.levels)])
                   for f in factors)
    rep = shown.replay(loss, ran, plan, np.vectorize(margin.of, otypes=[float]), simple, secs,
                       tolerance)
    seeds = np.flatnonzero(ran.any(axis=tuple(range(len(factors)))))
    last = int(np.searchsorted(plan.looks, int(seeds.max()), side="right")) + 1 if len(
        seeds) else 1
    last = min(last, len(plan.looks))
    runs_n = int(ran.sum())
    if rep.settled and len(rep.looks) == last:
        note = (f"decide study: {runs_n} runs, shown at look {last} of {len(plan.looks)} "
                f"({plan.looks[last - 1]} seeds); each look spends its share of α, so the "
                "bounds hold over all looks together")
    else:
        open_ = ([f.title for f, ok in zip(factors, rep.looks[-1].settled, strict=True) if not ok]
                 if rep.looks else [f.title for f in factors])
        note = (f"decide study: {runs_n} runs, stopped at look {last} "
                f"({plan.looks[last - 1]} seeds) before its answer was shown"
                + (f" (open: {', '.join(open_).lower()})" if open_ else ""))
    return Spent(alpha=float(plan.spend[last - 1]), note=note)


def of_sweep(c: object, parent_run_id: str | None, runs: pd.DataFrame, configs: pd.DataFrame,
             notes: list[str], designed: fa.Designed | None = None) -> Spent | None:
    """A decide sweep's ``Spent`` (None for any other sweep). A decide plan that cannot be read
    or replayed adds a line to ``notes`` and spends nothing: no claim is shown."""
    if not parent_run_id:
        return None
    tags: Mapping[str, str] = {}
    try:
        tags = c.get_run(parent_run_id).data.tags  # type: ignore[attr-defined]
        found = plan_of(tags)
        return analyse(runs, configs, *found, designed=designed) if found else None
    except Exception as err:  # data a teammate's sweep wrote: the report stands without it
        if tags.get(Tag.STRATEGY) != STRATEGY:
            return None  # not a decide sweep (an unreadable parent: spending says so)
        notes.append(f"the decide study's looks: not replayed ({type(err).__name__}: {err}); "
                     "no choice is shown")
        return Spent(alpha=0.0, note="decide study whose looks could not be replayed: no "
                                     "choice is shown")
