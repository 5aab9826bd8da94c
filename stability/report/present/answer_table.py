"""The answer as one table, printed the same in the terminal, report.md, report.html and MLflow.

One row per level of each decided factor: the chosen level first (marked ``→``), then the
others. Every column names its procedure, so no number reads as another's:

- ``gap to best (estimate)``: the point estimate of ``level − best level`` (MCB's centre);
- ``at most (MCB 95%)``: its simultaneous upper bound, the one the guarantee is about;
- ``vs <reference> [95% t CI]``: the level's main effect against the factor's reference with
  its per-contrast t interval (unadjusted), and ``verdict (Holm)``, the factor table's verdict;
- ``time × reference``: training seconds over the reference level's, the factor table's number
  (``time_ratio``); ``≈`` where the level's cost cannot be told from the chosen level's (not
  shown beyond the run-to-run spread and ``report.cost_tolerance`` past it, ``stats.cost``);
- ``why``: the rule's step that decided the chosen level, or what kept a level out
  (``reasons.why``).
"""

from __future__ import annotations

import math

from stability.design.factors import level_name, title
from stability.report.decide.factors import Effect, FactorAnalysis
from stability.report.decide.spending import Sequential
from stability.report.decide.steady import Steadied
from stability.report.decide.winner import Choice, Decision
from stability.report.format import DASH, signed, size, table
from stability.report.present.reasons import first_levels, why
from stability.stats import cost as costs

HEADER = ["factor", "level", "gap to best (estimate)", "at most (MCB 95%)",
          "vs reference [95% t CI]", "verdict (Holm)", "time × reference", "why"]
# What the columns mean, under the table wherever it is printed (one text for all four).
LEGEND = ("`verdict (Holm)` is the factor table's (two-sided t-test against the reference, Holm "
          "over every main effect); the `[95% t CI]` beside it is per contrast, unadjusted, so it "
          "can exclude 0 while the Holm verdict stays undecided. `time × reference`: training "
          "time over the reference level's (geometric mean over runs), `≈` where it cannot be told "
          "from the chosen level's (not shown beyond the run-to-run spread and the cost floor, "
          "report.cost_tolerance). `why`: the rule's step that "
          "decided the chosen level (validation, cost, simplicity, stability), or what kept a "
          "level out.")


def _level(c: Choice, i: int) -> str:
    return ", ".join(level_name(f, lv) for f, lv in zip(c.factors, c.levels[i], strict=True))


def _effect(an: FactorAnalysis | None, c: Choice, i: int) -> Effect | None:
    if an is None or len(c.factors) != 1:
        return None
    return next((e for e in an.main if e.factor == c.factors[0] and e.level == c.levels[i][0]),
                None)


def _reference(an: FactorAnalysis | None, c: Choice) -> int | None:
    """Index in ``c.levels`` of the group's reference level (every factor at its reference)."""
    refs = {f.name: f.reference for f in (an.factors if an else ())}
    want = tuple(refs.get(f) for f in c.factors)
    return c.levels.index(want) if want in c.levels else None


def _versus(an: FactorAnalysis | None, c: Choice, i: int, seq: Sequential | None) -> list[str]:
    e = _effect(an, c, i)
    if e is None:
        return ["reference" if i == _reference(an, c) else DASH, DASH]
    word = e.verdict if seq is None else seq.word(e)
    return [f"{signed(e.mean)} [{signed(e.low)}, {signed(e.high)}]", word]


def time_ratio(an: FactorAnalysis | None, c: Choice, i: int) -> float:
    """Level ``i``'s training time over its reference's: the factor table's number (one value).

    A level of a factor decided alone prints its main effect's ``cost_ratio`` (the factor
    table's and the sentences' number); a joint level (interacting factors) its group's cost
    over the group's reference level; NaN where neither is measured.
    """
    ref = _reference(an, c)
    if ref is not None and i == ref:
        return 1.0
    e = _effect(an, c, i)
    if e is not None:
        return e.cost_ratio
    return float(c.cost.ratio(ref)[i]) if ref is not None else math.nan


def same_cost(c: Choice, i: int, tolerance: float) -> bool:
    """Level ``i``'s cost cannot be told from the chosen level's (not beyond the spread and
    the floor)."""
    pair = costs.Cost(c.cost.log_mean[[c.chosen, i]], c.cost.spread,
                      c.cost.runs[[c.chosen, i]])
    return bool(costs.equally_cheap(pair, [True, True], tolerance).all())


def _time(an: FactorAnalysis | None, c: Choice, i: int, tolerance: float) -> str:
    ratio = time_ratio(an, c, i)
    if not math.isfinite(ratio):
        return DASH
    return f"{'≈' if i != c.chosen and same_cost(c, i, tolerance) else ''}{ratio:.2f}×"


def rows(dec: Decision, an: FactorAnalysis | None, seq: Sequential | None = None,
         steadied: Steadied | None = None) -> list[list[str]]:
    """The answer table's rows (``HEADER``), chosen level first within each factor."""
    out = []
    firsts = first_levels(dec, steadied)
    for k, c in enumerate(dec.choices):
        heading = " × ".join(title(f) for f in c.factors)
        order = [c.chosen] + [i for i in range(len(c.levels)) if i != c.chosen
                              and c.status[i] != "absent"]
        for n, i in enumerate(order):
            name = f"→ {_level(c, i)}" if i == c.chosen else _level(c, i)
            upper = c.upper[i]
            out.append([heading if n == 0 else "", name, signed(c.gap[i]) if c.gap[i] else "0",
                        size(upper) if math.isfinite(upper) else DASH,
                        *_versus(an, c, i, seq), _time(an, c, i, dec.cost_tolerance),
                        why(dec, c, i, firsts[k], steadied)])
    return out


def markdown(dec: Decision, an: FactorAnalysis | None, seq: Sequential | None = None,
             steadied: Steadied | None = None) -> str:
    """The table as Markdown."""
    return table(HEADER, rows(dec, an, seq, steadied))


def text(dec: Decision, an: FactorAnalysis | None, seq: Sequential | None = None,
         steadied: Steadied | None = None) -> str:
    """The table as aligned plain text, for the terminal."""
    body = [HEADER, *rows(dec, an, seq, steadied)]
    widths = [max(len(r[k]) for r in body) for k in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in body]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])
