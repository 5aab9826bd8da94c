"""The answer as a decision: what each factor does, with its CI, verdict and cost.

Sentences are built from ``factors.FactorAnalysis`` only; every number in them is an estimate
from the study's runs. "No significant difference" never ends a sentence: a contrast is
helps / hurts (with its size and CI), equivalent (within the margin, TOST), or undecided (with
the seeds that would decide it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from stability.report.factors import ACCUM, CLIP, PRECISION, Effect, FactorAnalysis
from stability.stats.effects import EQUIVALENT, HELPS, HURTS, UNDECIDED

TITLES = {CLIP: "Clipping", ACCUM: "Accumulation", PRECISION: "Precision",
          "train.lr": "Learning rate"}


def num(x: float) -> str:
    """A signed loss difference with enough digits for small effects."""
    if not math.isfinite(x):
        return "—"
    return f"{x:+.2e}" if 0 < abs(x) < 5e-4 else f"{x:+.4f}"


def size(x: float) -> str:
    """An unsigned size (a margin, a detectable difference)."""
    if not math.isfinite(x):
        return "—"
    return f"{x:.2e}" if 0 < abs(x) < 5e-4 else f"{x:.4f}"


def level_name(factor: str, level: str) -> str:
    """``accum 8``, ``max_norm 5``, ``bf16``, ``train.lr=0.01``."""
    if factor == ACCUM:
        return f"accum {level}"
    if factor == CLIP:
        return "clip off" if level == "off" else level
    if factor == PRECISION:
        return level
    return f"{factor}={level}"


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

    @property
    def word(self) -> str:
        """``hurts (look 1)``, ``undecided (after the last look)``."""
        return (f"{self.verdict} (look {self.look})" if self.look
                else f"{self.verdict} (after the last look)")


@dataclass(frozen=True)
class Sequential:
    """An adaptive sweep's verdicts: its rule's final look, replayed (report/spending.py).

    ``verdicts`` maps a contrast's name (``contrast_name``) to the rule's verdict.
    ``replayed=False``: the rule could not be replayed, so no verdict is valid for the sweep;
    the fixed-design ones are withheld, not shown.
    """

    verdicts: Mapping[str, Replayed] = field(default_factory=dict)
    replayed: bool = True

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


def _seeds(n: float) -> str:
    if math.isnan(n):
        return "more seeds (no spread to size them by)"
    return "more than 10000 seeds" if math.isinf(n) else f"{int(n)} seeds"


def phrase(e: Effect, margin: float, confidence: float) -> str:
    """``helps: −0.0098 (95% CI −0.017 to −0.003, Holm p 0.04)``, and the other three words."""
    ci = f"{confidence:.0%} CI {num(e.low)} to {num(e.high)}"
    if e.verdict == EQUIVALENT:
        real = "" if e.p_holm >= 0.05 else f"; a real but negligible {num(e.mean)}"
        return (f"**equivalent** within ±{size(margin)} ({num(e.mean)}, {ci}, TOST Holm p "
                f"{e.p_equiv_holm:.2g}{real})")
    if e.verdict in (HELPS, HURTS):
        word = "lowers" if e.verdict == HELPS else "raises"
        return (f"**{e.verdict}**: {word} the loss by {size(abs(e.mean))} ({ci}, Holm p "
                f"{e.p_holm:.2g})")
    why = " (unfinished runs: never called equivalent)" if e.unfinished != (0, 0) else ""
    return (f"**undecided**: {num(e.mean)} ({ci}, Holm p {e.p_holm:.2g}); "
            f"{_seeds(e.seeds_to_decide)} would decide it{why}")


def _adaptive_phrase(e: Effect, seq: Sequential, confidence: float) -> str:
    """The adaptive rule's verdict; the final runs' fixed-design numbers only as description."""
    return (f"**{seq.word(e)}** (final runs: {num(e.mean)}, {confidence:.0%} CI {num(e.low)} "
            f"to {num(e.high)}, descriptive, unadjusted)")


def _early(name: str, r: Replayed) -> str:
    """A contrast only the rule's looks saw: its verdict and the estimate it was decided on."""
    return (f"{name.split(' vs ')[0]} **{r.word}** (at that look: {num(r.mean)}, 95% CI "
            f"{num(r.low)} to {num(r.high)}, descriptive)")


def _cost(e: Effect) -> str:
    clips = f"; clips {e.clipped:.0%} of steps" if math.isfinite(e.clipped) else ""
    if not math.isfinite(e.cost_ratio):
        return clips
    return (f"{clips}; {e.cost_ratio:.2f}× the training time of "
            f"{level_name(e.factor, e.reference)}")


def _depends(an: FactorAnalysis, factor: str) -> list[str]:
    """"its effect depends on accumulation: ..." for each significant interaction."""
    out = []
    for i in an.interactions:
        if i.p_holm >= an.alpha:
            continue
        other, b = i.at.split(" vs ")[0].rsplit(" ", 1)
        if i.factor == factor:
            lvl, by = i.level, other
        elif other == factor:
            lvl, by = b, i.factor
        else:
            continue
        simple = an.simple.get((factor, lvl, by), ())
        parts = ", ".join(f"{num(s.mean)} at {level_name(by, s.at.rsplit(' ', 1)[1])}"
                          for s in simple)
        out.append(f"the effect of {level_name(factor, lvl)} depends on {by} "
                   f"(interaction {num(i.mean)}, Holm p {i.p_holm:.2g}): {parts}")
    return list(dict.fromkeys(out))


def factor_sentences(an: FactorAnalysis, seq: Sequential | None = None) -> list[str]:
    """One bullet per factor: every level against the reference, then its interactions.

    With ``seq`` (an adaptive sweep) the verdicts are the adaptive rule's, not the
    fixed-design ones (those are not valid after data-dependent seeding).
    """
    lines = []
    early = seq.unpaired(an) if seq is not None else {}
    for f in an.factors:
        effects = [e for e in an.main if e.factor == f.name]
        extra = [_early(k, r) for k, r in early.items() if r.factor == f.name]
        if not effects and not extra:
            continue
        said = [phrase(e, an.margin, an.confidence) if seq is None
                else _adaptive_phrase(e, seq, an.confidence) for e in effects]
        parts = "; ".join([f"{level_name(f.name, e.level)} {s}{_cost(e)}"
                           for e, s in zip(effects, said, strict=True)] + extra)
        text = (f"- **{TITLES.get(f.name, f.name)}** vs {level_name(f.name, f.reference)}, "
                f"pooled over every other setting and seed: {parts}.")
        lost = [e for e in effects if e.unfinished != (0, 0)]
        for e in lost:
            text += (f" {level_name(f.name, e.level)}: {e.unfinished[0]} unfinished run(s), "
                     f"{level_name(f.name, e.reference)}: {e.unfinished[1]} (counted at the "
                     "study's worst finished loss).")
        depends = _depends(an, f.name)
        if depends:
            text += " " + "; ".join(d[0].upper() + d[1:] for d in depends) + "."
        lines.append(text)
    return lines


def factor_table(an: FactorAnalysis, seq: Sequential | None = None) -> list[list[str]]:
    """Rows of the factor-effects table (header: ``FACTOR_HEADER``).

    With ``seq`` (an adaptive sweep) the verdict column is the adaptive rule's.
    """
    rows = []
    for e in an.main:
        rows.append([TITLES.get(e.factor, e.factor), contrast_name(e), num(e.mean),
                     f"[{num(e.low)}, {num(e.high)}]", f"{e.p:.2g}", f"{e.p_holm:.2g}",
                     "—" if math.isnan(e.p_equiv_holm) else f"{e.p_equiv_holm:.2g}",
                     e.verdict if seq is None else seq.word(e), f"{e.cells} × {e.seeds}",
                     f"{e.df:g}",
                     f"{e.unfinished[0]} / {e.unfinished[1]}", size(e.detectable),
                     "—" if math.isnan(e.cost_ratio) else f"{e.cost_ratio:.2f}×"])
    for name, r in (seq.unpaired(an) if seq is not None else {}).items():
        rows.append([TITLES.get(r.factor, r.factor), name, num(r.mean),
                     f"[{num(r.low)}, {num(r.high)}]", *["—"] * 3, r.word, *["—"] * 5])
    return rows


FACTOR_HEADER = ["factor", "contrast", "effect", "CI", "p", "Holm p", "TOST Holm p", "verdict",
                 "cells × seeds", "df", "unfinished (level / ref)", "detectable",
                 "training time ×"]


def interaction_rows(an: FactorAnalysis) -> list[list[str]]:
    """Rows of the interaction table: the 2 x 2 differences of differences."""
    return [[f"{level_name(i.factor, i.level)} vs {level_name(i.factor, i.reference)}", i.at,
             num(i.mean), f"[{num(i.low)}, {num(i.high)}]", f"{i.p_holm:.2g}",
             "depends" if i.p_holm < an.alpha else "no evidence"] for i in an.interactions]


INTERACTION_HEADER = ["contrast", "at (vs its reference)", "difference of effects", "CI",
                      "Holm p", "reading"]


def cheapest(configs: pd.DataFrame, margin: float = math.inf) -> tuple[pd.Series | None, str]:
    """The cheapest config equivalent to the winner, else not distinguishable from it.

    "Not distinguishable" is an undecided comparison whose estimate is inside the margin: a
    config 0.5 worse that two seeds cannot tell apart is no recommendation. ``configs``
    carries ``verdict_vs_winner``, ``diff_vs_winner`` and ``train_seconds``
    (``compare.versus_winner``). Returns the row (None if no candidate is cheaper than the
    winner) and which kind.
    """
    w = configs.iloc[0]
    close = configs["diff_vs_winner"].abs() <= margin if math.isfinite(margin) \
        else pd.Series(True, index=configs.index)
    for kind in (EQUIVALENT, UNDECIDED):
        pool = configs[(configs["verdict_vs_winner"] == kind) & configs["train_seconds"].notna()
                       & (close if kind == UNDECIDED else True)]
        if len(pool):
            best = pool.sort_values(["train_seconds", "rank"]).iloc[0]
            if best["train_seconds"] < w["train_seconds"]:
                return best, kind
    return None, ""


def cost_sentence(configs: pd.DataFrame, margin: float, device: str) -> str:
    """Recommend the cheapest config that the data cannot tell from (or show equal to) the best."""
    w = configs.iloc[0]
    if not math.isfinite(w.get("train_seconds", math.nan)):
        return ("Cost: this study's runs did not record their training time; no cost-aware "
                "recommendation.")
    row, kind = cheapest(configs, margin)
    own = (f"the winner trains in {w['train_seconds']:.1f} s a run on {device}"
           + (f", peak memory {w['peak_memory_mb']:.0f} MiB"
              if math.isfinite(w.get("peak_memory_mb", math.nan)) else ""))
    if row is None:
        return (f"Cost: {own}; no cheaper config is shown equivalent, or undecided with its "
                f"estimate inside ±{size(margin)}.")
    how = (f"**equivalent** to the winner within ±{size(margin)} (TOST, Holm over the configs)"
           if kind == EQUIVALENT else "**not distinguishable** from the winner (undecided: "
           f"neither shown different nor shown equivalent; its estimate is inside ±{size(margin)})")
    return (f"Cost: {own}. The cheapest config {how} is `{row['label']}`: "
            f"{row['train_seconds']:.1f} s a run ({w['train_seconds'] / row['train_seconds']:.2f}× "
            f"faster on {device}), best val loss {num(row['diff_vs_winner'])} vs the winner.")


def margin_of(spec: str | float, winner_loss: float) -> float:
    """``report.margin``: ``"5%"`` of the winner's mean loss, or an absolute loss difference."""
    if isinstance(spec, str) and spec.endswith("%"):
        # No finite winner (every config lost a seed): no margin, so nothing is "equivalent".
        share = float(spec[:-1]) / 100
        return share * abs(winner_loss) if math.isfinite(winner_loss) else math.nan
    return float(spec)

