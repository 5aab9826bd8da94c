"""Why each level was chosen or left out, in the rule's own terms (the answer table's ``why``).

The rule (``select.DECISION_RULE``) decides in order: validation (the candidates of
``stats.best.candidates``: levels shown within the margin of the best, else within it one
comparison at a time, else the lowest estimate), cost (the cheapest candidates, a difference not
shown beyond the run-to-run spread and the cost floor counting as none), simplicity, then the
lowest mean; a config with an unfinished seed is never chosen, and stability (``steady``) may
swap a marginal or unstable choice for a stable twin. ``why`` names the step that decided a
group's chosen level and, for every other level, the step that kept it out, from the same
numbers the decision used (``stats.best.candidates``, ``stats.cost.equally_cheap``), so a
cheaper level beside a costlier choice is never unexplained.
"""

from __future__ import annotations

import math

import numpy as np

from stability.design.factors import simplicity
from stability.report.decide.steady import Steadied
from stability.report.decide.winner import Choice, Decision
from stability.stats import best as mcb
from stability.stats import cost as costs


def first_levels(dec: Decision, steadied: Steadied | None) -> tuple[int, ...]:
    """Each group's level in the rule's choice before stability swapped it (else the chosen)."""
    if steadied is not None and steadied.swapped and len(steadied.first_levels) == len(
            dec.choices):
        return steadied.first_levels
    return tuple(c.chosen for c in dec.choices)


def _simple(c: Choice) -> np.ndarray:
    """Each level's simplicity rank in the group (as the decision ranks it)."""
    order = [list(dict.fromkeys(lv[j] for lv in c.levels)) for j in range(len(c.factors))]
    return np.array([sum(simplicity(f, lv[j], order[j].index(lv[j]))
                         for j, f in enumerate(c.factors)) for lv in c.levels])


def _spread(c: Choice) -> str:
    return f"±{math.expm1(c.cost_spread):.0%} a run" if math.isfinite(c.cost_spread) else \
        "no spread measured"


def why(dec: Decision, c: Choice, i: int, first: int, steadied: Steadied | None) -> str:
    """The rule's reason for level ``i`` of group ``c``: chosen by which step, or kept out how.

    Args:
        dec: the decision (its margin and cost tolerance).
        c: the group.
        i: the level.
        first: the group's level in the rule's choice before stability swapped it.
        steadied: what stability did (None: the choice was stable).
    """
    delta = dec.margin if math.isfinite(dec.margin) else -math.inf
    status, gap = np.array(c.status), np.array(c.gap)
    pool = mcb.candidates(status, gap, delta)
    cheap = costs.equally_cheap(c.cost, pool, dec.cost_tolerance)
    simple = _simple(c)
    swapped = steadied is not None and steadied.swapped and first != c.chosen
    if i == c.chosen:
        if swapped:
            return (f"stability: the first choice's config `{steadied.first}` is "
                    f"{steadied.verdict.stability}; this level's is stable")
        if i != c.preferred:
            return "the next in order: the first choice's config has an unfinished seed"
        if pool.sum() == 1:
            if status[i] == mcb.WITHIN:
                return "validation: the only level shown within the margin"
            if status[i] == mcb.NEAR:
                return "validation: the only level within the margin of each other one"
            return "validation: none shown within the margin; the lowest estimate"
        if cheap.sum() == 1:
            return "cost: the cheapest level within the margin"
        tied = cheap & (simple == simple[i])
        if tied.sum() == 1:
            return f"simplicity: the simplest of the equally cheap ({_spread(c)})"
        return "lowest mean of the equally cheap and simple"
    if swapped and i == first:
        return (f"stability: its config `{steadied.first}` is {steadied.verdict.stability}, "
                "and a stable twin passes validation")
    if i == c.preferred:
        return "first choice, but its config has an unfinished seed"
    if not pool[i]:
        if status[i] == mcb.WORSE:
            return "validation: shown worse by more than the margin"
        if gap[i] > delta:
            return "validation: estimate past the margin"
        if not (status[pool] == mcb.WITHIN).any() and not (status[pool] == mcb.NEAR).any():
            return "validation: a higher estimate (none is shown within the margin)"
        return "validation: not shown within the margin (others are)"
    if not cheap[i]:
        return (f"cost: shown costlier, beyond the run-to-run spread ({_spread(c)}) and "
                f"{dec.cost_tolerance:.0%}")
    if simple[i] > simple[c.chosen]:
        return f"simplicity: same cost ({_spread(c)}), less simple"
    return f"same cost ({_spread(c)}) and simplicity, higher mean"
