"""The "Answer" section: the decision on its first screen, then everything behind it.

The same Markdown opens report.md and is noted on the sweep's parent run (``answer_markdown``).
"""

from __future__ import annotations

import math
from collections import Counter

from stability.core.precision import Precision
from stability.report import decision
from stability.report.advice import nearest_swept
from stability.report.format import ci, fmt, pm, pval, signed, size
from stability.report.health import summary_sentence
from stability.report.sections.section import Part, lines
from stability.report.study import Study
from stability.report.table import ConfigTable


def _answer(st: Study) -> list[str]:
    """The first screen (the decision, at most 10 lines), then everything behind it."""
    w, t, level = st.winner, st.test, f"{st.options.confidence:.0%}"
    others = len(st.configs) - 1
    tested = [s for s in t.seeds if math.isfinite(s.test_loss)]
    an, dec = st.analysis, st.decision
    how = (f"chosen factor by factor from all {len(st.runs)} runs (seeds as blocks; best "
           "validation loss; the cheapest level near the best, then the simplest)"
           if dec is not None and dec.choices else "the study's only finished config"
           if dec is not None else "the lowest mean best validation loss")
    out = [f"**Train with `{w.label}`** (config fingerprint `{w.fingerprint}`), {how}.", ""]
    if dec is not None and an is not None and dec.choices:
        out += [*decision.choice_lines(dec, an, st.sequential), f"- {decision.guarantee(dec)}"]
    out.append(
        f"- Sealed test (split of {t.test_size} sequences, opened once, for this config only): "
        f"loss {pm(t.loss.mean, t.loss.std)}, accuracy {pm(t.acc.mean, t.acc.std, 3)} over "
        f"{len(tested)} seeds (mean ± std).")
    out += _lowest_line(st)
    if dec is not None and dec.note:
        out.append(f"- **Note: {dec.note}.**")
    out += ["", "Behind the decision:", ""]
    out.append(
        f"- Validation (the only selection criterion): best validation loss "
        f"{pm(w.loss_mean, w.loss_std)} "
        f"({level} CI {ci(w.loss_ci_low, w.loss_ci_high)}) over {w.seeds} "
        f"seeds; validation accuracy at the best epoch {pm(w.acc_mean, w.acc_std, 3)}.")
    if an is not None and an.main:
        out += ["", "What each setting does, from all "
                f"{len(st.runs)} runs (seeds as blocks; effects on best validation loss, "
                f"margin ±{size(an.margin, 'nonfinite')}):", "",
                *decision.adaptive_line(st.sequential),
                *decision.factor_sentences(an, st.sequential), ""]
    if st.lr_curves:
        out += ["How far the learning rate can go (LR sensitivity, Wortsman et al. 2023; "
                "stable LR range from the stability verdicts; section \"Learning rate\"):", "",
                *[f"- {t}" for t in st.lr_sentences or
                  ["no other factor was swept beside the learning rate."]], ""]
    out += _warnings(st)
    out += [f"- {c.question}: {c.verdict}" for c in st.comparisons]
    for r in st.advice:
        near = nearest_swept(r)
        out.append(f"- Recommended clipping threshold (from the clip-off runs' pre-clip norms), "
                   f"{r.sentence()}" + (f"; nearest swept value {near:g}"
                                        if near == near else "") + ".")
    out.append(f"- Against the winner: {_verdict_counts(st.configs)}; "
               f"{sum(r.within_ci for r in st.configs)} of {others} other configs have a mean "
               f"inside the winner's {level} CI.")
    return out


def _warnings(st: Study) -> list[str]:
    w, out = st.winner, []
    if math.isinf(w.loss_mean):
        out.append("- **Warning: every config lost at least one seed**; the winner was chosen by "
                   "the tie-breaks (fewest unfinished seeds, then simplest).")
    if w.flag:
        out.append(f"- **Warning: the winner is flagged: {w.flag}.**")
    if w.precision == Precision.FP32 and not w.clip_enabled and w.accum_steps == 1:
        out.append("- The winner is the baseline itself (fp32, clip off, accum 1).")
    out.append(f"- Stability: {summary_sentence(st.configs)}")
    return out


def _lowest_line(st: Study) -> list[str]:
    """The config with the lowest validation mean, against the decision, selection-adjusted."""
    lowest, w = st.configs.lowest, st.winner
    if lowest.fingerprint == w.fingerprint:
        return ["- Lowest validation mean: the winner itself."]
    c = next((c for c in st.comparisons if c.other_fp == lowest.fingerprint), None)
    if c is None:
        return []
    r = c.result
    return [f"- Lowest validation mean: `{lowest.label}` ({fmt(lowest.loss_mean)} vs "
            f"{fmt(w.loss_mean)}); it − the winner {signed(r.mean_diff)} "
            f"({st.options.confidence:.0%} CI {signed(r.low)} to {signed(r.high)}, {r.n} seeds, "
            f"selection-adjusted p {pval(c.p_adj)}): **{c.word}** for the winner; the lowest of "
            f"{len(st.configs)} means is biased low by its own selection."]


def _verdict_counts(configs: ConfigTable) -> str:
    """"0 equivalent, 21 undecided, 26 worse" over the configs other than the winner."""
    counts = Counter(r.verdict_vs_winner for r in configs.others)
    words = {"equivalent": "equivalent", "undecided": "undecided", "helps": "worse (the winner "
             "helps)", "hurts": "lower on the seeds both finished"}
    parts = [f"{int(counts.get(k, 0))} {v}" for k, v in words.items() if counts.get(k, 0)
             or k in ("equivalent", "undecided")]
    return (", ".join(parts) + " (paired by seed; t-test and TOST each selection-adjusted: "
            "Bonferroni over every pair of configs)")


def _load_line(st: Study) -> list[str]:
    """The answer's last line: how to load the registered winner."""
    if not st.model_uri:
        return []
    return [f"- Load the winner: `mlflow.pyfunc.load_model(\"{st.model_uri}\")` "
            f"(registered model version {st.model_version})."]


def answer_markdown(st: Study) -> str:
    """The report's answer (Markdown), as it opens report.md; noted on the sweep's parent run."""
    return "\n".join([*_answer(st), *_load_line(st)])


SECTION = Part("answer", lambda st: st,
               markdown=lambda st: lines("## Answer", "", answer_markdown(st), ""))
