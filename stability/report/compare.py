"""How sure is the choice: paired-by-seed comparisons, plain-words verdicts, seed noise.

Comparisons answer the review's questions: is the winner better than the baseline (fp32, clip
off, accum 1) and than the best config of each precision, and did clipping or accumulation
make any difference at all? Each is a paired t-test on the per-seed differences of best
validation loss over the seeds both configs finished (the Wilcoxon signed-rank p is the
check); the decision uses Holm-adjusted p-values over the comparisons in the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from stability.report.select import PRECISION_ORDER, baseline, best_of, per_seed
from stability.report.stats import Paired, holm, paired


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
    p_holm: float = math.nan
    verdict: str = ""
    confidence: float = 0.95


def _label(configs: pd.DataFrame, fp: str) -> str:
    return str(configs.loc[configs["fingerprint"] == fp, "label"].iloc[0])


def _unfinished(configs: pd.DataFrame, fp: str) -> int:
    row = configs.loc[configs["fingerprint"] == fp].iloc[0]
    return int(row["seeds_diverged"] + row["seeds_failed"])


def _questions(configs: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """``(question, kind, reference_fp, other_fp)``, one per distinct pair of configs."""
    win = str(configs.iloc[0]["fingerprint"])
    wanted: list[tuple[str, str, str | None, str | None]] = [
        ("winner vs baseline (fp32, clip off, accum 1)", "winner", win, baseline(configs))]
    for p in ("fp32", "bf16", "fp16"):
        wanted.append((f"winner vs best {p}", "winner", win,
                       best_of(configs, configs["precision"] == p)))
    clip = configs["clip_enabled"]
    wanted.append(("clipping: best clip-on vs best clip-off", "Clipping",
                   best_of(configs, ~clip), best_of(configs, clip)))
    acc1 = configs["accum_steps"] == 1
    wanted.append(("accumulation: best accum>1 vs best accum=1", "Gradient accumulation",
                   best_of(configs, acc1), best_of(configs, ~acc1)))
    merged: dict[tuple[str, str, str], str] = {}
    for question, kind, ref, other in wanted:
        if ref is None or other is None or ref == other:
            continue
        key = (kind, ref, other)
        merged[key] = f"{merged[key]} / {question.split(' vs ', 1)[1]}" if key in merged \
            else question
    return [(q, kind, ref, other) for (kind, ref, other), q in merged.items()]


def comparisons(runs: pd.DataFrame, configs: pd.DataFrame, confidence: float = 0.95,
                alpha: float = 0.05) -> list[Comparison]:
    """The review's paired comparisons with Holm-adjusted p-values and verdicts.

    Args:
        runs: one row per training run.
        configs: ``select.aggregate(runs)`` (ranked; row 0 is the winner).
        confidence: level of the intervals on the mean difference.
        alpha: significance level for the verdicts.
    """
    out = []
    for question, kind, ref, other in _questions(configs):
        result = paired(per_seed(runs, ref), per_seed(runs, other), confidence)
        out.append(Comparison(question, kind, _label(configs, ref), _label(configs, other), ref,
                              other, _unfinished(configs, other), result,
                              confidence=confidence))
    # A pair asked twice, in either direction (the winner vs the baseline and clip-on vs
    # clip-off can be the same two configs), is one test for Holm.
    unique = {frozenset((c.reference_fp, c.other_fp)): c.result.p_t for c in out}
    adjusted = dict(zip(unique, holm(list(unique.values())), strict=True))
    done = []
    for c in out:
        c = replace(c, p_holm=adjusted[frozenset((c.reference_fp, c.other_fp))])
        done.append(replace(c, verdict=verdict(c, alpha)))
    return done


def signed(x: float) -> str:
    """A signed difference with enough digits to not print a real difference as +0.0000."""
    if math.isnan(x):
        return "—"
    return f"{x:+.2e}" if 0 < abs(x) < 5e-4 else f"{x:+.4f}"


def _numbers(c: Comparison) -> str:
    r = c.result
    return (f"mean difference {signed(r.mean_diff)} ({c.confidence:.0%} CI {signed(r.low)} to "
            f"{signed(r.high)}) over {r.n} paired seeds, paired t p={r.p_t:.3g} "
            f"(Holm {c.p_holm:.3g}), Wilcoxon p={r.p_wilcoxon:.3g}")


def verdict(c: Comparison, alpha: float) -> str:
    """One plain sentence a reviewer can act on."""
    r = c.result
    lost = (f" {c.other} lost {c.other_unfinished} seed(s) to divergence or failure: +inf in "
            "the ranking, left out of this pairing." if c.other_unfinished else "")
    if r.n < 2:
        return (f"Cannot be tested: only {r.n} seed(s) finished in both {c.reference} and "
                f"{c.other}.{lost}")
    significant = c.p_holm < alpha
    if c.kind == "winner":
        if not significant:
            return (f"No significant difference: {c.other} is within the winner's seed noise "
                    f"({_numbers(c)}).{lost}")
        if r.mean_diff > 0:
            return f"The winner is significantly better than {c.other} ({_numbers(c)}).{lost}"
        return (f"On the seeds both finished {c.other} is significantly lower ({_numbers(c)}), "
                f"but it ranks below the winner.{lost}")
    if not significant:
        return f"{c.kind} made no difference on this task ({c.other} vs {c.reference}: " \
               f"{_numbers(c)}).{lost}"
    effect = "helped" if r.mean_diff < 0 else "hurt"
    return f"{c.kind} {effect}: {c.other} vs {c.reference}, {_numbers(c)}.{lost}"


def versus_winner(runs: pd.DataFrame, configs: pd.DataFrame, confidence: float = 0.95,
                  alpha: float = 0.05) -> pd.DataFrame:
    """``configs`` plus each config's paired comparison with the winner and its noise flags.

    Adds ``n_paired``, ``diff_vs_winner``, ``p_vs_winner`` (paired t, unadjusted),
    ``p_wilcoxon_vs_winner``, ``within_ci`` (mean inside the winner's CI) and ``within_noise``
    (paired t not significant at ``alpha``). Configs with an infinite mean are never within
    noise: by the +inf rule they cannot win.
    """
    win = configs.iloc[0]
    ref = per_seed(runs, str(win["fingerprint"]))
    results = [paired(ref, per_seed(runs, str(fp)), confidence) for fp in configs["fingerprint"]]
    out = configs.assign(
        n_paired=[r.n for r in results],
        diff_vs_winner=[r.mean_diff for r in results],
        p_vs_winner=[r.p_t for r in results],
        p_wilcoxon_vs_winner=[r.p_wilcoxon for r in results],
    )
    finite = np.isfinite(out["loss_mean"])
    out["within_ci"] = finite & out["loss_mean"].between(win["loss_ci_low"], win["loss_ci_high"])
    out["within_noise"] = finite & (out["p_vs_winner"] >= alpha)
    # The winner is not its own competitor.
    out.loc[0, ["within_ci", "within_noise"]] = False
    out.loc[0, ["diff_vs_winner", "p_vs_winner", "p_wilcoxon_vs_winner"]] = math.nan
    return out


def simpler_within_noise(configs: pd.DataFrame) -> pd.Series | None:
    """The simplest config the data cannot tell from the winner, if it is simpler than the winner.

    Simpler means the tie-break order of the selection rule (clip off before on, fp32 before
    bf16 before fp16, smaller accumulation); "cannot tell" is ``within_noise`` (paired t not
    significant). ``configs`` is ``versus_winner``'s output.
    """

    def key(row: pd.Series) -> tuple[int, int, int]:
        return (int(row["clip_enabled"]), PRECISION_ORDER.get(row["precision"], 9),
                int(row["accum_steps"]))

    winner = key(configs.iloc[0])
    close = [row for _, row in configs[configs["within_noise"]].iterrows() if key(row) < winner]
    return min(close, key=lambda r: (key(r), r["rank"])) if close else None
