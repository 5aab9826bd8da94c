"""The adaptive replay stage: an adaptive study's rounds, what each look decided, what it cost.

An adaptive sweep (``hydra.sweeper.strategy=adaptive``, ``stability.sweep.adaptive``) records
its settings on its parent run (``Tag.ADAPTIVE_PLAN``). The report replays the very looks the
sweep took (``stability.stats.looks.replay`` on the sweep's runs): a run's round is the look
whose seeds it added (seed index in ``[n_{k-1}, n_k)``), so nothing per run needs recording and
a tag a teammate's run got wrong cannot change the story. Everything read back is data: the
plan is parsed into numbers and bounded, labels go through the report's escaping.

Costs: a run's training CPU-seconds are its ``wall_time_s`` (one core per run, the sweep's
default ``train.threads=1``). The fixed grid the study is set against gives every config
``max_seeds`` seeds; its cost is each config's mean run times ``max_seeds``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from stability.design.design import Factor
from stability.design.factors import level_name
from stability.design.margin import Margin
from stability.report.decide import factors as fa
from stability.report.decide.factors import Effect, FactorAnalysis
from stability.stats import looks
from stability.stats import sequential as sq
from stability.tracking.contract import Tag

WITHHELD = "withheld (not valid after adaptive seeding)"


@dataclass(frozen=True)
class Replayed:
    """One contrast's verdict by the adaptive rule, and its estimate at the deciding look."""

    factor: str
    verdict: str
    look: int  # the look that decided it; 0: none did
    mean: float
    low: float  # plain 95% t interval at that look
    high: float
    left: str = ""  # the other factors' levels that had left by that look (not averaged over)

    @property
    def word(self) -> str:
        """``hurts (look 1)``, ``helps (look 2, averaged without accum 8)``."""
        without = f", averaged without {self.left}" if self.left else ""
        return (f"{self.verdict} (look {self.look}{without})" if self.look
                else f"{self.verdict} (after the last look{without})")


@dataclass(frozen=True)
class Sequential:
    """An adaptive sweep's verdicts: its rule's final look, replayed (``analyse`` below).

    ``verdicts`` maps a contrast's name (``contrast_name``) to the rule's verdict.
    ``replayed=False``: the rule could not be replayed, so no verdict is valid for the sweep;
    the fixed-design ones are withheld, not shown. ``decide=True``: a decide sweep
    (``report.decide.decided``), whose seeds follow its open choices and whose rule gives no
    verdicts: every verdict is withheld.
    """

    verdicts: Mapping[str, Replayed] = field(default_factory=dict)
    replayed: bool = True
    decide: bool = False

    def word(self, e: Effect) -> str:
        """The rule's verdict on ``e`` with its look, or ``WITHHELD``."""
        got = self.verdicts.get(contrast_name(e)) if self.replayed else None
        return WITHHELD if got is None else got.word

    def unpaired(self, an: FactorAnalysis) -> dict[str, Replayed]:
        """The rule's contrasts the final runs cannot pair (a level that left early)."""
        shown = {contrast_name(e) for e in an.main}
        return {k: r for k, r in self.verdicts.items() if k not in shown}


def contrast_name(e: Effect) -> str:
    """``max_norm 5 vs clip off``: how a main effect is named in tables and in the replay."""
    return f"{level_name(e.factor, e.level)} vs {level_name(e.factor, e.reference)}"


MAX_SEEDS_READ = 1000  # a recorded plan beyond this is not believed (arrays are sized by it)


@dataclass(frozen=True)
class ContrastVerdict:
    """One contrast's verdict: when, and on what evidence (a plain 95% t interval)."""

    contrast: str
    verdict: str
    look: int  # 0: never decided (undecided at the end)
    seeds: int
    mean: float
    low: float
    high: float
    futile_at: int = 0  # the look that gave it up (0: never)
    factor: str = ""
    left: str = ""  # levels of the other factors no longer averaged over at that look


@dataclass(frozen=True)
class RoundSpent:
    """One round: the seeds it brought its configs to, its runs and their CPU-seconds."""

    round: int
    seeds: int
    configs: int
    runs: int
    cpu_s: float
    looked: bool  # the look after it was taken (every needed config had its seeds)
    decided: tuple[ContrastVerdict, ...] = ()


@dataclass(frozen=True)
class Spending:
    """How an adaptive study spent its runs (``analyse``); ``sections.spending`` shows it."""

    plan: sq.Plan
    margin: float
    rounds: tuple[RoundSpent, ...]
    decisions: tuple[ContrastVerdict, ...]
    runs: int
    cpu_s: float
    fixed_runs: int
    fixed_cpu_s: float
    outside: int  # runs of the sweep outside the plan's seeds (not read)
    seeds: pd.DataFrame = field(default_factory=pd.DataFrame)  # config x round: seeds added


def plan_of(tags: Mapping[str, str]) -> tuple[sq.Plan, Margin, int] | None:
    """The adaptive plan a sweep's parent recorded; None for any other sweep.

    Raises:
        ValueError: the recorded plan does not parse or is out of bounds.
    """
    if tags.get(Tag.STRATEGY) != "adaptive":
        return None
    raw = json.loads(tags.get(Tag.ADAPTIVE_PLAN) or "{}")
    plan = sq.Plan(n0=int(raw["n0"]), step=int(raw["step"]), max_seeds=int(raw["max_seeds"]),
                   alpha=float(raw["alpha"]), power=float(raw["power"]))
    if plan.max_seeds > MAX_SEEDS_READ:
        raise ValueError(f"max_seeds {plan.max_seeds} > {MAX_SEEDS_READ}")
    margin = Margin.parse(raw.get("margin", "5%"))  # a ValueError (ConfigError) if it is none
    return plan, margin, int(raw.get("base_seed", 0))


def analyse(runs: pd.DataFrame, configs: pd.DataFrame, plan: sq.Plan, margin: Margin | float,
            base_seed: int, *, designed: fa.Designed | None = None) -> Spending:
    """Replay the sweep's looks on its runs and count what each round spent."""
    d = designed if designed is not None else fa.design(runs, configs)
    table, factors = d.table, d.factors
    shape = tuple(len(f.levels) for f in factors)
    width = plan.max_seeds
    loss, ran, secs = np.full(shape + (width,), np.nan), np.zeros(shape + (width,), bool), \
        np.zeros(shape + (width,))
    wall = pd.to_numeric(runs.get("wall_time_s", pd.Series(math.nan, index=runs.index)),
                         errors="coerce").reindex(table.index)
    cell = {}
    outside = 0
    for i, row in table.iterrows():
        k = int(row["seed"]) - base_seed
        if not 0 <= k < width:
            outside += 1
            continue
        at = tuple(f.levels.index(row[f.name]) for f in factors)
        cell[row["fingerprint"]] = at
        ran[at + (k,)] = True
        loss[at + (k,)] = row["loss"] if row["finished"] else np.nan
        secs[at + (k,)] = wall[i] if math.isfinite(wall[i]) else 0.0
    rep = looks.replay(loss, ran, plan, (margin if isinstance(margin, Margin)
                                         else Margin.parse(margin)).of)
    pairs = sq.contrasts(shape)
    names = [(f"{level_name(factors[i].name, factors[i].levels[a])} vs "
              f"{level_name(factors[i].name, factors[i].reference)}", factors[i].name)
             for i, a in pairs]
    decisions = _decisions(rep, plan, names, factors)
    bounds = (0, *plan.looks)
    rounds, added = [], {}
    labels = configs.set_index("fingerprint")["label"]
    for r in range(len(plan.looks)):
        lo, hi = bounds[r], bounds[r + 1]
        got = ran[..., lo:hi]
        if not got.any():
            break
        added[r + 1] = {fp: int(got[at].sum()) for fp, at in cell.items()}
        rounds.append(RoundSpent(round=r + 1, seeds=hi, configs=int(got.any(axis=-1).sum()),
                                 runs=int(got.sum()), cpu_s=float(secs[..., lo:hi][got].sum()),
                                 looked=r < len(rep.states),
                                 decided=tuple(d for d in decisions if d.look == r + 1)))
    per_config = np.where(ran.sum(-1) > 0, secs.sum(-1) / np.maximum(ran.sum(-1), 1), np.nan)
    seeds = pd.DataFrame(added).rename(index=lambda fp: str(labels.get(fp, fp))).sort_index()
    return Spending(plan=plan, margin=rep.margin, rounds=tuple(rounds),
                    decisions=tuple(decisions), runs=int(ran.sum()),
                    cpu_s=float(secs[ran].sum()), fixed_runs=int(np.prod(shape)) * width,
                    fixed_cpu_s=float(np.nansum(per_config) * width), outside=outside,
                    seeds=seeds)


def _left(rep: looks.Replay, at: int, factors: list[Factor], own: str) -> str:
    """``accum 8, fp16``: the other factors' levels that had left the study before look ``at``.

    A look averages each contrast over the levels still in play, so once a level has left, the
    verdict is about the design without it, and says so.
    """
    if at < 2:
        return ""
    alive = rep.states[at - 2].alive
    gone = [level_name(f.name, f.levels[i]) for f, mask in zip(factors, alive, strict=True)
            if f.name != own for i in range(len(f.levels)) if not bool(np.asarray(mask)[i])]
    return ", ".join(gone)


def _decisions(rep: looks.Replay, plan: sq.Plan, names: list[tuple[str, str]],
               factors: list[Factor]) -> list[ContrastVerdict]:
    if not rep.states:
        return []
    last = rep.states[-1]
    out = []
    for j, (name, factor) in enumerate(names):
        at = int(last.decided_at[j]) or len(rep.states)
        n = plan.looks[at - 1]
        half = stats.t.ppf(0.975, n - 1) * last.se[j]
        futile = next((k + 1 for k, s in enumerate(rep.states) if s.futile[j]), 0)
        out.append(ContrastVerdict(contrast=name, verdict=sq.VERDICTS[last.verdict[j]],
                                   look=int(last.decided_at[j]), seeds=n,
                                   mean=float(last.mean[j]), low=float(last.mean[j] - half),
                                   high=float(last.mean[j] + half), futile_at=futile,
                                   factor=factor, left=_left(rep, at, factors, factor)))
    return out


def of_sweep(c: object, parent_run_id: str | None, runs: pd.DataFrame, configs: pd.DataFrame,
             notes: list[str]) -> Spending | None:
    """The replay of an adaptive sweep (None for any other); a plan that cannot
    be read or replayed adds a line to ``notes`` instead of ending the report."""
    return replayed(c, parent_run_id, runs, configs, notes)[0]


def replayed(c: object, parent_run_id: str | None, runs: pd.DataFrame, configs: pd.DataFrame,
             notes: list[str], designed: fa.Designed | None = None
             ) -> tuple[Spending | None, Sequential | None]:
    """``of_sweep``, and the verdicts the factor table and the answer must give.

    Returns:
        ``(spending, verdicts)``: ``verdicts`` is None for a sweep that is not adaptive (the
        fixed-design verdicts hold); for an adaptive one it holds the replayed final look's
        verdict per contrast, or, when the plan cannot be read or replayed, none at all
        (``replayed=False``): fixed-design verdicts are not valid after adaptive seeding.
    """
    if not parent_run_id:
        return None, None
    adaptive = False
    try:
        tags = c.get_run(parent_run_id).data.tags  # type: ignore[attr-defined]
        adaptive = tags.get(Tag.STRATEGY) == "adaptive"
        found = plan_of(tags)
        sp = analyse(runs, configs, *found, designed=designed) if found else None
    except Exception as err:  # data a teammate's sweep wrote: the report stands without it
        notes.append(f"how the study spent its runs: not replayed ({type(err).__name__}: "
                     f"{err})" + ("; the factor verdicts are withheld" if adaptive else ""))
        return None, Sequential(replayed=False) if adaptive else None
    if sp is None:
        return None, None
    return sp, Sequential({d.contrast: Replayed(factor=d.factor, verdict=d.verdict, look=d.look,
                                                mean=d.mean, low=d.low, high=d.high,
                                                left=d.left) for d in sp.decisions})
