"""The "Answer" section: the decision on its first screen, then everything behind it.

The same Markdown opens report.md and is noted on the sweep's parent run (``answer_markdown``).
"""

from __future__ import annotations

import math

from stability.core.precision import Precision
from stability.design import factors as vocabulary
from stability.report.decide import memory, steady, winner
from stability.report.examine.health import summary_sentence
from stability.report.format import ACC_DIGITS, ci, fmt, pm, signed, size
from stability.report.present import answer_table
from stability.report.present.sections import decision_text
from stability.report.present.sections.section import Part, lines
from stability.report.present.study import Study
from stability.stats.best import SD_CONFIDENCE


def _margin_words(st: Study) -> str:
    rule = st.evidence.rule
    share = (f"{rule.spec} of the lowest config mean, report.margin" if rule.relative
             else "report.margin, in loss units")
    return f"margin {size(st.evidence.margin, 'nonfinite')} ({share})"


def first_screen(st: Study, plain: bool = False) -> list[str]:
    """The answer: the config, the table, what is guaranteed, the sealed test, the stability.

    The same lines open report.md, the HTML and the sweep's MLflow note (``plain=False``:
    Markdown) and end ``stability report`` in the terminal (``plain=True``: aligned text).
    """
    w, t, dec, an = st.findings.configs.winner, st.test, st.decided.decision, st.evidence.analysis
    tested = [s for s in t.seeds if math.isfinite(s.test_loss)]
    how = (f"chosen factor by factor from all {len(st.fetched.runs)} runs (best validation "
           f"loss, seeds as blocks, {_margin_words(st)})" if dec is not None and dec.choices
           else "the study's only finished config" if dec is not None
           else "the lowest mean best validation loss")
    name = f"`{w.label}`" if plain else f"**Train with `{w.label}`**"
    out = [f"{'Train with ' if plain else ''}{name} (config fingerprint `{w.fingerprint}`), "
           f"{how}.", ""]
    seq, steadied = st.evidence.sequential, st.decided.steadied
    if dec is not None and an is not None and dec.choices:
        out += [answer_table.text(dec, an, seq, steadied) if plain
                else answer_table.markdown(dec, an, seq, steadied), "",
                *([] if plain else [answer_table.LEGEND, ""]),
                *([] if plain else decision_text.adaptive_line(seq)),
                decision_text.guarantee(dec), *_seeds_line(st)]
    out.append(
        f"Sealed test (split of {t.test_size} sequences, opened once, for this config only): "
        f"loss {pm(t.loss.mean, t.loss.std)}, accuracy "
        f"{pm(t.acc.mean, t.acc.std, ACC_DIGITS)} over "
        f"{len(tested)} seeds (mean ± std).")
    out.append(f"Stability: {summary_sentence(st.findings.configs)}")
    swap = steady.sentence(steadied, signed(steadied.diff) if steadied else "")
    if swap:
        out.append(swap)
    if dec is not None and dec.note:
        out.append(f"Note: {dec.note}.")
    return out


def _seeds_line(st: Study) -> list[str]:
    """How many seeds would show each open choice within the margin, at the report's power."""
    dec = st.decided.decision
    parts = []
    for c in dec.choices if dec is not None else ():
        if c.basis == winner.CHOSEN_WITHIN or math.isnan(c.seeds_needed):
            continue
        title = " × ".join(vocabulary.title(f) for f in c.factors)
        level = ", ".join(vocabulary.level_name(f, lv)
                          for f, lv in zip(c.factors, c.levels[c.chosen], strict=True))
        parts.append(f"{title.lower()}: {int(c.seeds_needed)} seeds would show {level} within "
                     "the margin (MCB)" if math.isfinite(c.seeds_needed) else
                     f"{title.lower()}: no number of seeds would show {level} within the "
                     "margin (its estimate is past it)")
    return [f"Seeds that would decide the open choices, with {st.options.power:.0%} power (each "
            f"pair sized from this study's estimates, its SD at the upper {SD_CONFIDENCE:.0%} "
            f"confidence limit, Browne 1995): {'; '.join(parts)}."] if parts else []


def _answer(st: Study) -> list[str]:
    """The first screen, then everything behind it."""
    w, level, an = st.findings.configs.winner, f"{st.options.confidence:.0%}", st.evidence.analysis
    out = [*first_screen(st), *_lowest_line(st), "", "Behind the decision:", ""]
    out.append(
        f"- Validation (the rule's first criterion; then cost, simplicity and stability: "
        f"section \"Selection rule\"): the chosen config's best validation loss "
        f"{pm(w.loss_mean, w.loss_std)} "
        f"({level} CI {ci(w.loss_ci_low, w.loss_ci_high)}) over {w.seeds} "
        f"seeds; validation accuracy at the best epoch {pm(w.acc_mean, w.acc_std, ACC_DIGITS)}.")
    if an is not None and an.main:
        out += ["", "What each setting does, from all "
                f"{len(st.fetched.runs)} runs (seeds as blocks; effects on best validation loss, "
                f"margin {size(an.margin, 'nonfinite')}):", "",
                *decision_text.adaptive_line(st.evidence.sequential),
                *decision_text.factor_sentences(an, st.evidence.sequential), ""]
    if st.findings.lr_curves:
        out += ["How far the learning rate can go (LR sensitivity, Wortsman et al. 2023; "
                "stable LR range from the stability verdicts; section \"Learning rate\"):", "",
                *[f"- {t}" for t in st.findings.lr_sentences or
                  ["no other factor was swept beside the learning rate."]], ""]
    out += _warnings(st)
    frame = st.findings.configs.frame()
    out += [f"- {line}" for line in (memory.accumulation_memory(frame),
                                     memory.precision_memory(frame)) if line]
    return out


def _warnings(st: Study) -> list[str]:
    w, out = st.findings.configs.winner, []
    if math.isinf(w.loss_mean):
        out.append("- **Warning: every config lost at least one seed**; the config was chosen by "
                   "the tie-breaks (fewest unfinished seeds, then simplest).")
    if w.flag:
        out.append(f"- **Warning: the chosen config is flagged: {w.flag}.**")
    if w.precision == Precision.FP32 and not w.clip_enabled and w.accum_steps == 1:
        out.append("- The chosen config is the baseline itself (fp32, clip off, accum 1).")
    return out


def _lowest_line(st: Study) -> list[str]:
    """The config with the lowest validation mean, beside the decision: descriptive only."""
    lowest, w = st.findings.configs.lowest, st.findings.configs.winner
    if lowest.fingerprint == w.fingerprint:
        return ["", "Lowest validation mean: the chosen config itself."]
    return ["", f"Lowest validation mean: `{lowest.label}` ({fmt(lowest.loss_mean)} vs "
            f"{fmt(w.loss_mean)} for the chosen config). Descriptive, not a test: the lowest of "
            f"{len(st.findings.configs)} means is biased low by its own selection, and a test of "
            "it against the choice, adjusted for that selection, has no power at these seeds; the "
            "table's MCB bounds are the adjusted statement about every level."]


def _load_line(st: Study) -> list[str]:
    """The answer's last line: how to load the chosen config's registered model."""
    reg = st.registered
    if not reg.uri:
        return []
    return [f"- Load the chosen config's model: `mlflow.pyfunc.load_model(\"{reg.uri}\")` "
            f"(registered model version {reg.version})."]


def answer_markdown(st: Study) -> str:
    """The report's answer (Markdown), as it opens report.md; noted on the sweep's parent run."""
    return "\n".join([*_answer(st), *_load_line(st)])


SECTION = Part("answer", lambda st: st,
               markdown=lambda st: lines("## Answer", "", answer_markdown(st), ""))
