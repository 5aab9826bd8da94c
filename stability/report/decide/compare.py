"""How sure is the choice: the winner against its alternatives, paired by seed.

Comparisons answer the review's questions about the winner: is it better than the baseline
(fp32, clip off, accum 1), than the best config of each precision, and than the config with the
lowest validation mean? (What each *factor* does is answered from every run in ``factors``.)
Each is a paired t-test on the per-seed differences of best validation loss over the seeds both
configs finished (the Wilcoxon signed-rank p is the check) and a TOST against the equivalence
margin, and each ends as helps / hurts / equivalent / undecided
(``stability.stats.effects.decide``).

The winner and the "best of" configs are chosen from the same runs these tests read: testing
the chosen pair at face value said "the winner helps" in 21% of simulated null studies (the
winner's curse). So every p-value here is **selection-adjusted**: Bonferroni over all
``n(n - 1)/2`` pairs of the study's ``n`` configs, the family any data-driven choice of two
configs is drawn from (``selection_family``). Any claim about any pair, however it was chosen,
is then wrong with probability at most alpha (tests/report/test_decision_simulation.py).

A "no" is only as good as the test's power: every comparison carries the smallest difference
its seeds could have detected (80% power by default, noncentral t; see ``stats.min_detectable``)
and the seeds a named effect would need, so "no significant difference" says how small a
difference could still hide behind it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np
import pandas as pd

from stability.report.decide.select import baseline, best_of_each_precision, per_seed
from stability.report.decide.table import VersusWinner
from stability.report.format import pval, signed, size
from stability.stats import effects as fx
from stability.stats.paired import Paired, min_detectable, paired, seeds_needed


@dataclass(frozen=True)
class Sensitivity:
    """What a paired comparison could have detected.

    Attributes:
        power: the power the numbers below are for (e.g. 0.8).
        alpha: the significance level they assume (unadjusted).
        mdd: minimum detectable difference with the seeds both configs finished.
        effect: the named effect (``report.min_effect``, or a multiple of the winner's SD).
        seeds_for_effect: paired seeds needed to detect ``effect`` with ``power``.
    """

    power: float = 0.8
    alpha: float = 0.05
    mdd: float = math.nan
    effect: float = math.nan
    seeds_for_effect: float = math.nan


def sensitivity(result: Paired, effect: float, alpha: float, power: float) -> Sensitivity:
    """Minimum detectable difference and seeds needed, from the SD of the paired differences."""
    return Sensitivity(power, alpha, min_detectable(result.sd, result.n, alpha, power), effect,
                       seeds_needed(effect, result.sd, alpha, power))


@dataclass(frozen=True)
class Criteria:
    """How the paired comparisons are judged (the report's options, the margin resolved).

    Attributes:
        confidence: level of the intervals on the mean difference.
        alpha: significance level of the verdicts.
        power: power of the minimum detectable difference.
        min_effect: the effect whose seed count is reported (loss units); None uses
            ``min_effect_sd`` times the winner's seed SD.
        min_effect_sd: see ``min_effect``.
        margin: the equivalence margin (loss units) of the TOST.
    """

    confidence: float = 0.95
    alpha: float = 0.05
    power: float = 0.8
    min_effect: float | None = None
    min_effect_sd: float = 1.0
    margin: float = math.nan


def named_effect(configs: pd.DataFrame, min_effect: float | None, min_effect_sd: float) -> float:
    """``min_effect`` if set, else ``min_effect_sd`` times the winner's seed SD of the loss."""
    if min_effect is not None:
        return float(min_effect)
    return float(min_effect_sd * configs.iloc[0]["loss_std"])


@dataclass(frozen=True)
class Comparison:
    """``other - reference`` in best validation loss, paired by seed."""

    question: str
    kind: str  # "winner" (reference is the winner) or the factor's name ("Clipping"...)
    reference: str  # label
    other: str  # label
    reference_fp: str
    other_fp: str
    other_unfinished: int
    result: Paired
    p_adj: float = math.nan  # selection-adjusted (Bonferroni over every pair of configs)
    p_equiv_adj: float = math.nan
    word: str = ""  # helps | hurts | equivalent | undecided (the winner's setting vs other)
    verdict: str = ""
    margin: float = math.nan
    confidence: float = 0.95
    power: Sensitivity = Sensitivity()


def _label(configs: pd.DataFrame, fp: str) -> str:
    return str(configs.loc[configs["fingerprint"] == fp, "label"].iloc[0])


def _unfinished(configs: pd.DataFrame, fp: str) -> int:
    row = configs.loc[configs["fingerprint"] == fp].iloc[0]
    return int(row["seeds_diverged"] + row["seeds_failed"])


def selection_family(configs: pd.DataFrame) -> int:
    """The pairs of configs a data-driven comparison can be drawn from: ``n(n - 1)/2``."""
    n = len(configs)
    return max(n * (n - 1) // 2, 1)


def _questions(configs: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """``(question, kind, reference_fp, other_fp)``, one per distinct pair of configs."""
    win = str(configs.iloc[0]["fingerprint"])
    lowest = configs.sort_values("rank", kind="stable").iloc[0]["fingerprint"]
    wanted: list[tuple[str, str, str, str | None]] = [
        ("chosen vs baseline (fp32, clip off, accum 1)", "winner", win, baseline(configs))]
    for p, best in best_of_each_precision(configs):
        wanted.append((f"chosen vs lowest-mean {p}", "winner", win, best))
    wanted.append(("chosen vs lowest mean", "winner", win, str(lowest)))
    merged: dict[tuple[str, str, str], str] = {}
    for question, kind, ref, other in wanted:
        if ref is None or other is None or ref == other:
            continue
        key = (kind, ref, other)
        merged[key] = f"{merged[key]} / {question.split(' vs ', 1)[1]}" if key in merged \
            else question
    return [(q, kind, ref, other) for (kind, ref, other), q in merged.items()]


def as_estimate(r: Paired) -> fx.Estimate:
    """A paired comparison as an ``effects.Estimate`` (per-seed differences, ``n - 1`` df)."""
    se = r.sd / math.sqrt(r.n) if r.n >= 2 else math.nan
    return fx.Estimate(mean=np.asarray(r.mean_diff), se=np.asarray(se),
                       df=np.asarray(float(r.n - 1)), sd_seed=np.asarray(r.sd), cells=1, seeds=r.n)


def _equiv_p(r: Paired, margin: float) -> float:
    if r.n < 2 or not math.isfinite(margin):
        return math.nan
    return float(fx.p_equivalent(as_estimate(r), margin))


def comparisons(runs: pd.DataFrame, configs: pd.DataFrame,
                criteria: Criteria = Criteria()) -> list[Comparison]:
    """The review's paired comparisons with selection-adjusted p-values, power and verdicts.

    Args:
        runs: one row per training run.
        configs: ``select.aggregate(runs)`` (ranked; row 0 is the winner).
        criteria: levels, power, the named effect and the equivalence margin.
    """
    confidence, alpha, margin = criteria.confidence, criteria.alpha, criteria.margin
    out = []
    effect = named_effect(configs, criteria.min_effect, criteria.min_effect_sd)
    family = selection_family(configs)
    for question, kind, ref, other in _questions(configs):
        result = paired(per_seed(runs, ref), per_seed(runs, other), confidence)
        out.append(Comparison(question=question, kind=kind, reference=_label(configs, ref),
                              other=_label(configs, other), reference_fp=ref, other_fp=other,
                              other_unfinished=_unfinished(configs, other), result=result,
                              p_adj=selected(result.p_t, family),
                              p_equiv_adj=selected(_equiv_p(result, margin), family),
                              margin=margin, confidence=confidence,
                              power=sensitivity(result, effect, alpha / family,
                                                criteria.power)))
    worded = [replace(c, word=_word(c, alpha)) for c in out]
    return [replace(c, verdict=verdict(c, alpha)) for c in worded]


def selected(p: float | np.ndarray, family: int) -> np.ndarray | float:
    """A p-value of a pair chosen from the data, adjusted for the choice (Bonferroni)."""
    adjusted = np.minimum(np.asarray(p, dtype=float) * family, 1.0)
    return float(adjusted) if np.ndim(adjusted) == 0 else adjusted


def _word(c: Comparison, alpha: float) -> str:
    """The four-word verdict from the winner's side: ``helps`` = the winner's loss is lower."""
    if c.result.n < 2:
        return fx.UNDECIDED
    p_eq = c.p_equiv_adj if c.other_unfinished == 0 else math.nan
    # other - winner > 0 means the winner's setting lowers the loss: flip the sign for decide.
    return str(fx.decide(np.asarray(-c.result.mean_diff), np.asarray(c.p_adj),
                         np.asarray(1.0 if math.isnan(p_eq) else p_eq), alpha))


def _numbers(c: Comparison) -> str:
    r = c.result
    return (f"mean difference {signed(r.mean_diff)} ({c.confidence:.0%} CI {signed(r.low)} to "
            f"{signed(r.high)}) over {r.n} paired seeds, paired t p={pval(r.p_t)} "
            f"(selection-adjusted {pval(c.p_adj)}), Wilcoxon p={pval(r.p_wilcoxon)}")


def unseen(c: Comparison) -> str:
    """"with N seeds a difference smaller than X would go unseen", and the seeds an effect needs."""
    s, n = c.power, c.result.n
    if math.isnan(s.mdd):
        return (f"the {n} per-seed differences are all equal (e.g. identical runs), so the "
                "smallest detectable difference cannot be estimated")
    text = (f"with {n} seeds a difference smaller than {size(s.mdd, 'never')} would go unseen "
            f"({s.power:.0%} power, α = {s.alpha:.2g})")
    if math.isfinite(s.seeds_for_effect):
        text += f"; detecting {size(s.effect, 'never')} would take {int(s.seeds_for_effect)} seeds"
    elif s.seeds_for_effect == math.inf:
        text += f"; detecting {size(s.effect, 'never')} would take more than 10000 seeds"
    return text


def verdict(c: Comparison, alpha: float) -> str:
    """One plain sentence a reviewer can act on, opening with its four-word verdict."""
    r = c.result
    lost = (f" {c.other} lost {c.other_unfinished} seed(s) to divergence or failure: +inf in "
            "the ranking, left out of this pairing (never called equivalent)."
            if c.other_unfinished else "")
    if r.n < 2:
        return (f"**undecided**: cannot be tested, only {r.n} seed(s) finished in both "
                f"{c.reference} and {c.other}.{lost}")
    if c.word == fx.EQUIVALENT:
        return (f"**equivalent** within ±{size(c.margin, 'never')}: {c.other} and the chosen "
                f"config "
                f"({_numbers(c)}, TOST selection-adjusted p {pval(c.p_equiv_adj)}).{lost}")
    if c.word == fx.HELPS:
        return f"**helps**: the chosen config is lower than {c.other} ({_numbers(c)}).{lost}"
    if c.word == fx.HURTS:
        return (f"**hurts**: on the seeds both finished {c.other} is lower ({_numbers(c)}), "
                f"but it ranks below the chosen config.{lost}")
    return (f"**undecided**: neither shown different nor within ±{size(c.margin, 'never')}; "
            f"{unseen(c)} ({c.other} vs the chosen config: {_numbers(c)}).{lost}")


def versus(runs: pd.DataFrame, configs: pd.DataFrame,
           criteria: Criteria = Criteria()) -> tuple[VersusWinner, ...]:
    """Each config's paired comparison with the winner (row 0 of ``configs``), in its order.

    The paired t-test (``p_vs_winner``, unadjusted) and Wilcoxon p, ``within_ci`` (mean inside
    the winner's CI), ``within_noise`` (paired t not significant at ``alpha``), ``mdd_vs_winner``
    (the smallest difference those paired seeds detect with ``power`` at the selection-adjusted
    ``alpha / pairs``, the procedure of "How sure": one pair, one number) and
    ``verdict_vs_winner`` (helps / hurts / equivalent / undecided: paired t and TOST against
    ``margin``, each selection-adjusted, ``p_adj_vs_winner``; a config with unfinished seeds
    is never equivalent). Configs with an infinite mean are never within noise: by the +inf
    rule they cannot win. The winner is not its own competitor: NaN, False and "winner".
    ``criteria``'s confidence, alpha, power and margin apply (not its named effect).
    """
    confidence, alpha, power, margin = (criteria.confidence, criteria.alpha, criteria.power,
                                        criteria.margin)
    win = configs.iloc[0]
    ref = per_seed(runs, str(win["fingerprint"]))
    results = [paired(ref, per_seed(runs, str(fp)), confidence) for fp in configs["fingerprint"]]
    loss = configs["loss_mean"]
    finite = np.isfinite(loss.to_numpy(float))
    within_ci = finite & loss.between(win["loss_ci_low"], win["loss_ci_high"]).to_numpy()
    within_noise = finite & (np.array([r.p_t for r in results], dtype=float) >= alpha)
    family = selection_family(configs)
    p_diff = selected(np.array([math.nan] + [r.p_t for r in results[1:]]), family)
    unfinished = (configs["seeds_diverged"] + configs["seeds_failed"]).to_numpy()
    p_eq = selected(np.array([math.nan] + [_equiv_p(r, margin) if u == 0 else math.nan
                                           for r, u in zip(results[1:], unfinished[1:],
                                                           strict=True)]), family)
    diff = np.array([math.nan] + [r.mean_diff for r in results[1:]], dtype=float)
    words = fx.decide(-diff, np.nan_to_num(p_diff, nan=1.0), np.nan_to_num(p_eq, nan=1.0), alpha)
    out = [VersusWinner(n_paired=results[0].n, diff_vs_winner=math.nan, p_vs_winner=math.nan,
                        p_wilcoxon_vs_winner=math.nan, mdd_vs_winner=math.nan, within_ci=False,
                        within_noise=False, p_adj_vs_winner=float(p_diff[0]),
                        p_equiv_vs_winner=float(p_eq[0]), verdict_vs_winner="winner")]
    out += [VersusWinner(n_paired=r.n, diff_vs_winner=r.mean_diff, p_vs_winner=r.p_t,
                         p_wilcoxon_vs_winner=r.p_wilcoxon,
                         mdd_vs_winner=min_detectable(r.sd, r.n, alpha / family, power),
                         within_ci=bool(within_ci[i]), within_noise=bool(within_noise[i]),
                         p_adj_vs_winner=float(p_diff[i]), p_equiv_vs_winner=float(p_eq[i]),
                         verdict_vs_winner=str(words[i]))
            for i, r in enumerate(results) if i]
    return tuple(out)


def versus_winner(runs: pd.DataFrame, configs: pd.DataFrame,
                  criteria: Criteria = Criteria()) -> pd.DataFrame:
    """``configs`` with ``versus``'s fields as columns, for analyses that read a DataFrame."""
    parts = versus(runs, configs, criteria)
    return configs.assign(**{f.name: [getattr(v, f.name) for v in parts]
                             for f in fields(VersusWinner)})
