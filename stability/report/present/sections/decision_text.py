"""The decision in words: what each factor does, with its CI, verdict and cost.

Sentences are built from ``factors.FactorAnalysis`` only; every number in them is an estimate
from the study's runs. "No significant difference" never ends a sentence: a contrast is
helps / hurts (with its size and CI), equivalent (within the margin, TOST), or undecided (with
the seeds that would decide it).
"""

from __future__ import annotations

import math

from stability.design.factors import level_name, title
from stability.report import format as fm
from stability.report.decide.factors import Effect, FactorAnalysis
from stability.report.decide.spending import Replayed, Sequential, contrast_name
from stability.report.decide.winner import (
    CHOSEN_LOWEST,
    CHOSEN_NEAR,
    CHOSEN_WITHIN,
    Choice,
    Decision,
)
from stability.stats.best import POWER
from stability.stats.effects import EQUIVALENT, HELPS, HURTS


def _num(x: float) -> str:
    return fm.signed(x, "nonfinite")


def _size(x: float) -> str:
    return fm.size(x, "nonfinite")


def _seeds(n: float) -> str:
    if math.isnan(n):
        return "more seeds (no spread to size them by)"
    return "more than 10000 seeds" if math.isinf(n) else f"{int(n)} seeds"


def phrase(e: Effect, margin: float, confidence: float) -> str:
    """``helps: −0.0098 (95% CI −0.017 to −0.003, Holm p 0.04)``, and the other three words."""
    ci = f"{confidence:.0%} t CI per contrast {_num(e.low)} to {_num(e.high)}"
    if e.verdict == EQUIVALENT:
        real = "" if e.p_holm >= 0.05 else f"; a real but negligible {_num(e.mean)}"
        return (f"**equivalent** within ±{_size(margin)} ({_num(e.mean)}, {ci}, TOST Holm p "
                f"{fm.pval(e.p_equiv_holm)}{real})")
    if e.verdict in (HELPS, HURTS):
        word = "lowers" if e.verdict == HELPS else "raises"
        return (f"**{e.verdict}**: {word} the loss by {_size(abs(e.mean))} ({ci}, Holm p "
                f"{fm.pval(e.p_holm)})")
    why = " (unfinished runs: never called equivalent)" if e.unfinished != (0, 0) else ""
    holm = (" (the per-contrast CI excludes 0, the Holm-adjusted test does not)"
            if e.p < 1 - confidence else "")
    return (f"**undecided**: {_num(e.mean)} ({ci}, Holm p {fm.pval(e.p_holm)}){holm}; "
            f"{_seeds(e.seeds_to_decide)} would decide its Holm verdict{why}")


def _adaptive_phrase(e: Effect, seq: Sequential, confidence: float) -> str:
    """The adaptive rule's verdict; the final runs' fixed-design numbers only as description."""
    return (f"**{seq.word(e)}** (final runs: {_num(e.mean)}, {confidence:.0%} CI {_num(e.low)} "
            f"to {_num(e.high)}, descriptive, unadjusted)")


def _early(name: str, r: Replayed) -> str:
    """A contrast only the rule's looks saw: its verdict and the estimate it was decided on."""
    return (f"{name.split(' vs ')[0]} **{r.word}** (at that look: {_num(r.mean)}, 95% CI "
            f"{_num(r.low)} to {_num(r.high)}, descriptive)")


def _cost(e: Effect) -> str:
    clips = (f"; its runs clipped {e.clipped:.0%} of steps (mean)" if math.isfinite(e.clipped)
             else "")
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
        parts = ", ".join(f"{_num(s.mean)} at {level_name(by, s.at.rsplit(' ', 1)[1])}"
                          for s in simple)
        out.append(f"the effect of {level_name(factor, lvl)} depends on {by} "
                   f"(interaction {_num(i.mean)}, Holm p {fm.pval(i.p_holm)}): {parts}")
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
        pooled = ("pooled over every other setting and seed" if seq is None or seq.decide else
                  "pooled over the other settings still in play at the deciding look (named "
                  "where a level had left)")
        text = (f"- **{title(f.name)}** vs {level_name(f.name, f.reference)}, "
                f"{pooled}: {parts}.")
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
        rows.append([title(e.factor), contrast_name(e), _num(e.mean),
                     f"[{_num(e.low)}, {_num(e.high)}]", fm.pval(e.p), fm.pval(e.p_holm),
                     fm.pval(e.p_equiv_holm),
                     e.verdict if seq is None else seq.word(e), f"{e.cells} × {e.seeds}",
                     f"{e.df:g}",
                     f"{e.unfinished[0]} / {e.unfinished[1]}", _size(e.detectable),
                     "—" if math.isnan(e.cost_ratio) else f"{e.cost_ratio:.2f}×"])
    for name, r in (seq.unpaired(an) if seq is not None else {}).items():
        rows.append([title(r.factor), name, _num(r.mean),
                     f"[{_num(r.low)}, {_num(r.high)}]", *["—"] * 3, r.word, *["—"] * 5])
    return rows


FACTOR_HEADER = ["factor", "contrast", "effect", "95% t CI (per contrast)", "p", "Holm p",
                 "TOST Holm p", "verdict (Holm)",
                 "cells × seeds", "df", "unfinished (level / ref)", "detectable",
                 "training time ×"]


def interaction_rows(an: FactorAnalysis) -> list[list[str]]:
    """Rows of the interaction table: the 2 x 2 differences of differences."""
    return [[f"{level_name(i.factor, i.level)} vs {level_name(i.factor, i.reference)}", i.at,
             _num(i.mean), f"[{_num(i.low)}, {_num(i.high)}]", fm.pval(i.p_holm),
             "depends" if i.p_holm < an.alpha else "no evidence"] for i in an.interactions]


INTERACTION_HEADER = ["contrast", "at (vs its reference)", "difference of effects", "CI",
                      "Holm p", "reading"]


def _level_word(choice: Choice, i: int) -> str:
    return ", ".join(level_name(f, lv) for f, lv in zip(choice.factors, choice.levels[i],
                                                          strict=True))


def _basis(choice: Choice, margin: float, single: float) -> str:
    m = _size(margin)
    bound = _size(choice.upper[choice.chosen])
    if choice.basis == CHOSEN_WITHIN:
        return (f"shown within {m} of the best level: at most {bound} worse (MCB, "
                "simultaneous)")
    seeds = choice.seeds_needed
    more = ("" if math.isnan(seeds) else
            "; more seeds cannot show it within" if math.isinf(seeds) else
            f"; {int(seeds)} seeds would show it within with {POWER:.0%} power")
    if choice.basis == CHOSEN_NEAR:
        return (f"best guess: within {m} of every other level one comparison at a time "
                f"(one-sided {1 - single:.1%} each, not simultaneous); shown only to be at most "
                f"{bound} worse (MCB, simultaneous){more}")
    if choice.basis == CHOSEN_LOWEST:
        return (f"best guess: the lowest estimate, nothing within {m} of the best level even one "
                f"comparison at a time; shown only to be at most {bound} worse (MCB, "
                f"simultaneous){more}")
    return (f"the next level in the rule's order (its first choice has an unfinished seed); "
            f"shown only to be at most {bound} worse (MCB, simultaneous)")


def _effects_of(an: FactorAnalysis, factor: str, seq: Sequential | None) -> str:
    """``max_norm 5 −0.0098 [−0.017, −0.003] helps, 1.01×``, for each level vs the reference."""
    parts = []
    for e in an.main:
        if e.factor != factor:
            continue
        word = e.verdict if seq is None else seq.word(e)
        cost = "" if not math.isfinite(e.cost_ratio) else f", {e.cost_ratio:.2f}× the time"
        parts.append(f"{level_name(factor, e.level)} {_num(e.mean)} [{_num(e.low)}, "
                     f"{_num(e.high)}] {word}{cost}")
    ref = next((f.reference for f in an.factors if f.name == factor), "")
    return (f"vs {level_name(factor, ref)} (effect [95% t CI per contrast], verdict Holm over "
            "the main effects): " + "; ".join(parts) if parts else "no paired effect")


def choice_lines(dec: Decision, an: FactorAnalysis, seq: Sequential | None = None) -> list[str]:
    """One line per decided factor (or interacting group): the level, why, what each does."""
    lines = []
    for c in dec.choices:
        heading = " × ".join(title(f) for f in c.factors)
        joint = " (decided jointly: they interact)" if len(c.factors) > 1 else ""
        effects = "; ".join(_effects_of(an, f, seq) for f in c.factors)
        lines.append(f"- **{heading} → {_level_word(c, c.chosen)}**{joint} "
                     f"({_basis(c, dec.margin, dec.alpha / len(dec.choices))}): {effects}.")
    return lines


def _names(choices: list[Choice]) -> str:
    return ", ".join(" × ".join(title(f).lower() for f in c.factors) for c in choices)


def guarantee(dec: Decision) -> str:
    """What the decision guarantees and what is a best guess, in plain words."""
    level = 1 - dec.alpha
    if not dec.choices:
        return "Guarantee: one config, nothing to choose."
    shown = [c for c in dec.choices if c.basis == CHOSEN_WITHIN]
    guessed = [c for c in dec.choices if c.basis != CHOSEN_WITHIN]
    m = _size(dec.margin)
    out = []
    if shown:
        out.append(f"Shown: with probability ≥ {level:.0%}, the chosen {_names(shown)} "
                   f"{'is' if len(shown) == 1 else 'are each'} within {m} of the best level "
                   "of its factor (multiple comparisons with the best, seeds as blocks, one "
                   f"guarantee for all {len(dec.choices)} choices together).")
    if guessed:
        bounds = ", ".join(f"{_size(c.upper[c.chosen])}" for c in guessed)
        single = 1 - dec.alpha / len(dec.choices)
        why = {CHOSEN_NEAR: f"is within it of every other level one comparison at a time "
                            f"(one-sided {single:.1%} each)",
               CHOSEN_LOWEST: "has the lowest estimate"}
        reasons = [why.get(c.basis, "is the next in the rule's order (Note)") for c in guessed]
        each = "the chosen level" if len(guessed) == 1 else "each chosen level"
        said = (f"{each} {reasons[0]}" if len(set(reasons)) == 1 else
                "; ".join(f"the chosen {_names([c])} level {r}"
                          for c, r in zip(guessed, reasons, strict=True)))
        out.append(f"Best guess, not shown: for {_names(guessed)} no level is shown within "
                   f"{m} of the best; {said}; the data show only that "
                   f"{'it is' if len(guessed) == 1 else 'they are'} at most {bounds} worse "
                   f"(same {level:.0%} simultaneous bounds). More seeds would tell.")
    study = f" ({dec.study})." if dec.study else ""
    return "Guarantee: " + " ".join(out) + study


def adaptive_line(seq: Sequential | None) -> list[str]:
    """For an adaptive sweep: whose verdicts these are, and what the numbers beside them are."""
    if seq is None:
        return []
    if seq.decide:
        return ["**Decide sweep: the factor verdicts are withheld.** Its seeds were added "
                "where a choice was still open, so re-testing the final runs as if the seeds "
                "had been fixed in advance is not valid; the effects, CIs and p-values below "
                "are descriptive (unadjusted), not tests. The answer's claims are the study's "
                "last look (its guarantee line).", ""]
    if not seq.replayed:
        return ["**Adaptive sweep whose looks could not be replayed (see Problems): the "
                "verdicts are withheld.** Re-testing the final runs at the full α as if the "
                "seeds had been fixed in advance is not valid after adaptive seeding; the "
                "numbers below are descriptive (unadjusted).", ""]
    return ["**Adaptive sweep: the verdicts are the adaptive rule's** (its final look, "
            "replayed; error held across the looks; section \"How the study spent its "
            "runs\"), with the look that decided each. The effects, CIs and p-values beside "
            "them re-test the final runs as if the seeds had been fixed in advance: "
            "descriptive (unadjusted), not tests; so are the interactions. A contrast the "
            "final runs cannot pair (its level left early) shows the estimate and plain 95% t "
            "interval at its deciding look.", ""]
