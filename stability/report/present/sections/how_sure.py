"""The "How sure" section: the chosen config against its named alternatives, paired by seed."""

from __future__ import annotations

from scipy import stats

from stability.report.format import pval, seeds, signed, signed_ci, size, table
from stability.report.present.sections.section import Part, lines
from stability.report.present.study import Study
from stability.stats.paired import wilcoxon_min_p


def _table(st: Study) -> str:
    rows = [[c.question, c.reference, c.other, str(c.result.n), signed(c.result.mean_diff),
             signed_ci(c.result.low, c.result.high), pval(c.result.p_t), pval(c.p_adj),
             pval(c.result.p_wilcoxon), size(c.power.mdd), seeds(c.power.seeds_for_effect),
             str(c.other_unfinished)] for c in st.decided.comparisons]
    power = st.decided.comparisons[0].power if st.decided.comparisons else None
    effect = size(power.effect) if power else "—"
    level = f"{power.power:.0%}" if power else ""
    return table(["question", "reference", "other", "paired seeds", "mean diff (other − ref)",
                  f"{st.options.confidence:.0%} CI", "paired t p", "selection-adjusted p",
                  "Wilcoxon p", f"detectable at {level} power",
                  f"seeds to detect {effect} ({_effect_words(st)})",
                  "other's unfinished seeds"], rows)


def _effect_words(st: Study) -> str:
    """What the named effect is: ``report.min_effect``, or the chosen config's seed SD."""
    if st.options.min_effect is not None:
        return "report.min_effect"
    k = st.options.min_effect_sd
    return f"{'' if k == 1 else f'{k:g} × '}the chosen config's seed SD; not the margin"


def _power_words(st: Study, seeds: int) -> str:
    """What the selection-adjusted test needs to say anything at these seeds."""
    pairs = len(st.findings.configs) * (len(st.findings.configs) - 1) // 2
    if pairs < 1 or seeds < 2:
        return ""
    need = stats.t.ppf(1 - st.options.alpha / (2 * pairs), seeds - 1)
    return (f"These are descriptive, not evidence: the config was chosen from the same runs, so "
            f"a claim about it must be adjusted for that choice (Bonferroni over the {pairs} "
            f"pairs of configs), and at {seeds} seeds that test needs |t| > {need:.1f}. The "
            "answer's MCB bounds are the adjusted statement about the choice. ")


def markdown(st: Study) -> str:
    """The comparison table and what it can and cannot say."""
    n = len(st.fetched.runs["seed"].unique())
    return lines(
        "## How sure (paired by seed, descriptive)", "", _table(st), "",
        _power_words(st, n) +
        f"Differences are `other − reference` in best validation loss over the seeds both "
        f"finished ({st.options.confidence:.0%} t interval). The Wilcoxon "
        f"signed-rank test is a distribution-free check. With {n} seeds the exact two-sided "
        f"Wilcoxon p-value cannot go below {wilcoxon_min_p(n):.4g}, which is why it is not the "
        "decision. `detectable` is the minimum detectable difference: the mean difference the "
        "paired t-test on these seeds would find with the stated power, from the observed SD of "
        "the per-seed differences (noncentral t; docs/report.md). A non-significant result says "
        "nothing about differences smaller than that.", "")


SECTION = Part("how sure", lambda st: st, markdown=markdown)
