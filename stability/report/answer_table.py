"""The answer as one table, printed the same in the terminal, report.md, report.html and MLflow.

One row per level of each decided factor: the chosen level first (marked ``→``), then the
others. Every column names its procedure, so no number reads as another's:

- ``gap to best (estimate)``: the point estimate of ``level − best level`` (MCB's centre);
- ``at most (MCB 95%)``: its simultaneous upper bound, the one the guarantee is about;
- ``vs <reference> [95% t CI]``: the level's main effect against the factor's reference with
  its per-contrast t interval (unadjusted), and ``verdict (Holm)``, the factor table's verdict;
- ``time ×``: training seconds over the chosen level's; ``≈`` where the difference is not
  shown beyond the run-to-run spread and ``report.cost_tolerance`` past it (``stats.cost``):
  the same cost.
"""

from __future__ import annotations

import math

from stability.design.factors import level_name, title
from stability.report.factors import Effect, FactorAnalysis
from stability.report.format import DASH, signed, size, table
from stability.report.spending import Sequential
from stability.report.winner import Choice, Decision
from stability.stats import cost as costs

HEADER = ["factor", "level", "gap to best (estimate)", "at most (MCB 95%)",
          "vs reference [95% t CI]", "verdict (Holm)", "time ×"]


def _level(c: Choice, i: int) -> str:
    return ", ".join(level_name(f, lv) for f, lv in zip(c.factors, c.levels[i], strict=True))


def _effect(an: FactorAnalysis | None, c: Choice, i: int) -> Effect | None:
    if an is None or len(c.factors) != 1:
        return None
    return next((e for e in an.main if e.factor == c.factors[0] and e.level == c.levels[i][0]),
                None)


def _versus(an: FactorAnalysis | None, c: Choice, i: int, seq: Sequential | None) -> list[str]:
    e = _effect(an, c, i)
    ref = next((f.reference for f in (an.factors if an else ()) if f.name == c.factors[0]), None)
    if e is None:
        is_ref = len(c.factors) == 1 and ref == c.levels[i][0]
        return ["reference" if is_ref else DASH, DASH]
    word = e.verdict if seq is None else seq.word(e)
    return [f"{signed(e.mean)} [{signed(e.low)}, {signed(e.high)}]", word]


def _time(c: Choice, i: int, tolerance: float) -> str:
    ratio = float(c.cost.ratio(c.chosen)[i])
    if not math.isfinite(ratio):
        return DASH
    pair = costs.Cost(c.cost.log_mean[[c.chosen, i]], c.cost.spread,
                      c.cost.runs[[c.chosen, i]])
    same = bool(costs.equally_cheap(pair, [True, True], tolerance).all())
    return f"{'≈' if same and i != c.chosen else ''}{ratio:.2f}×"


def rows(dec: Decision, an: FactorAnalysis | None, seq: Sequential | None = None
         ) -> list[list[str]]:
    """The answer table's rows (``HEADER``), chosen level first within each factor."""
    out = []
    for c in dec.choices:
        heading = " × ".join(title(f) for f in c.factors)
        order = [c.chosen] + [i for i in range(len(c.levels)) if i != c.chosen
                              and c.status[i] != "absent"]
        for n, i in enumerate(order):
            name = f"→ {_level(c, i)}" if i == c.chosen else _level(c, i)
            upper = c.upper[i]
            out.append([heading if n == 0 else "", name, signed(c.gap[i]) if c.gap[i] else "0",
                        size(upper) if math.isfinite(upper) else DASH,
                        *_versus(an, c, i, seq), _time(c, i, dec.cost_tolerance)])
    return out


def markdown(dec: Decision, an: FactorAnalysis | None, seq: Sequential | None = None) -> str:
    """The table as Markdown."""
    return table(HEADER, rows(dec, an, seq))


def text(dec: Decision, an: FactorAnalysis | None, seq: Sequential | None = None) -> str:
    """The table as aligned plain text, for the terminal."""
    body = [HEADER, *rows(dec, an, seq)]
    widths = [max(len(r[k]) for r in body) for k in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in body]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])
