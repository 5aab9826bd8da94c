"""Stability in the decision: a marginal or unstable choice gives way to a stable twin.

The decision (``winner.decide``) reads validation, then cost, then simplicity; the stability
verdicts (``health``) read each run's steps. This step runs after both, as the rule's fourth
criterion: when the chosen config is not stable, the next config in the decision's own order
(``winner._settle`` over the stable configs) is taken if it is stable, fully finished, and every
one of its levels passes the validation step (a candidate of its factor: shown within the margin
of the best level, or, where no level is shown, its estimate within it: ``stats.best.candidates``).
So stability never buys a level the validation loss did not accept, and a choice that stays
unstable or marginal says why: no config passed. Either way ``Steadied`` records what happened,
and the answer names both configs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from stability.report.decide import winner as rule
from stability.report.decide.factors import Designed, design
from stability.report.decide.table import StabilityVerdict
from stability.stats import best as mcb

STABLE = "stable"


@dataclass(frozen=True)
class Steadied:
    """What the stability step did to a choice that was not stable.

    Attributes:
        first: the label of the config the rule chose on validation, cost and simplicity.
        first_fingerprint: its fingerprint.
        verdict: its stability verdict (marginal / unstable) and reason.
        twin: the label of the stable config chosen instead ("" when none passed).
        twin_fingerprint: its fingerprint ("" when none).
        diff: the twin's mean best validation loss minus the first choice's (NaN: no twin).
        first_levels: each decided group's level (index) in the first choice.
    """

    first: str
    first_fingerprint: str
    verdict: StabilityVerdict
    twin: str = ""
    twin_fingerprint: str = ""
    diff: float = math.nan
    first_levels: tuple[int, ...] = ()

    @property
    def swapped(self) -> bool:
        """A stable twin was chosen instead of the first choice."""
        return bool(self.twin_fingerprint)


def _candidates_only(c: rule.Choice, delta: float) -> rule.Choice:
    """``c`` with every level that fails the validation step marked absent (never taken)."""
    pool = mcb.candidates(np.array(c.status), np.array(c.gap), delta)
    return replace(c, status=tuple(s if pool[i] else mcb.ABSENT
                                   for i, s in enumerate(c.status)))


def _passes(choices: tuple[rule.Choice, ...], delta: float) -> bool:
    """Every chosen level is a candidate of its group (passes the validation step)."""
    return all(bool(mcb.candidates(np.array(c.status), np.array(c.gap), delta)[c.chosen])
               for c in choices)


def prefer_stable(runs: pd.DataFrame, configs: pd.DataFrame, decision: rule.Decision,
                  verdicts: Mapping[str, StabilityVerdict], *, designed: Designed | None = None
                  ) -> tuple[rule.Decision, Steadied | None]:
    """The decision with a stable twin in place of a marginal or unstable choice, if one passes.

    Args:
        runs: one row per training run.
        configs: ``select.aggregate(runs)`` (every config, ranked).
        decision: the rule's decision on validation, cost and simplicity.
        verdicts: each config's stability verdict, by fingerprint.
        designed: ``design(runs, configs)``, made once by the report (None: made here).

    Returns:
        ``(decision, steadied)``: ``steadied`` is None when the choice is stable (or not judged,
        or there is none); else it names the first choice, its verdict and the twin (if any).
    """
    fp = decision.fingerprint
    mine = verdicts.get(fp) if fp is not None else None
    if mine is None or mine.stability not in ("marginal", "unstable"):
        return decision, None
    label = dict(zip(configs["fingerprint"], configs["label"], strict=True))
    mean = dict(zip(configs["fingerprint"], configs["loss_mean"], strict=True))
    first = Steadied(first=str(label[fp]), first_fingerprint=str(fp), verdict=mine)
    if not decision.choices:
        return decision, first
    stable = configs[[verdicts.get(str(f), None) is not None
                      and verdicts[str(f)].stability == STABLE for f in configs["fingerprint"]]]
    if stable.empty:
        return decision, first
    d = designed if designed is not None else design(runs, configs)
    table, factors = d.table, d.factors
    delta = decision.margin if math.isfinite(decision.margin) else -math.inf
    # the rule's order over the stable configs, each group's levels narrowed to its candidates
    narrowed = [_candidates_only(c, delta) for c in decision.choices]
    settings = rule.Settings(margin=decision.margin, alpha=decision.alpha,
                             cost_tolerance=decision.cost_tolerance)
    other = rule._settle(table, stable, narrowed, factors, settings)
    if other.fingerprint is None:
        return decision, first
    choices = tuple(c if o.chosen == c.chosen else rule._moved(c, o.chosen)
                    for c, o in zip(decision.choices, other.choices, strict=True))
    if not _passes(choices, delta):
        return decision, first
    twin = str(other.fingerprint)
    steadied = Steadied(first=first.first, first_fingerprint=first.first_fingerprint,
                        verdict=mine, twin=str(label[twin]), twin_fingerprint=twin,
                        diff=float(mean[twin] - mean[fp]),
                        first_levels=tuple(c.chosen for c in decision.choices))
    kept = rule.Decision(choices=choices, fingerprint=twin, margin=decision.margin,
                         alpha=decision.alpha, cost_tolerance=decision.cost_tolerance,
                         note=decision.note)
    return kept, steadied


def sentence(s: Steadied | None, signed: str = "") -> str:
    """The answer's line on what stability did to the choice ("" when the choice was stable).

    Args:
        s: the step's record.
        signed: the twin's mean difference, formatted by the caller (``format.signed``).
    """
    if s is None:
        return ""
    why = f"{s.verdict.stability}" + (f" ({s.verdict.stability_reason})"
                                      if s.verdict.stability_reason else "")
    if s.swapped:
        return (f"Stability decided: the rule's first choice on validation, cost and simplicity, "
                f"`{s.first}`, is {why}; `{s.twin}`, the next config in the rule's order, is "
                f"stable and every level of it passes the validation step (mean {signed} vs "
                f"`{s.first}`), so it is chosen instead.")
    return (f"Stability did not decide: the chosen config is {why}, and no stable, fully "
            "finished config has every level within the margin of its factor's best, so it "
            "stays; train it watching for the signs named.")
