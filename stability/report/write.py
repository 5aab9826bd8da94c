"""The report folder: ``report.md`` (tables, verdicts, figures) and ``summary.csv``.

Every number comes from the sweep's runs or from the winner's test evaluation; nothing is
typed in by hand. A value that does not exist is written as "—", an infinite mean (a config
that lost a seed) as "inf".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from stability.core.precision import Precision
from stability.core.task import DEFAULT_LOSS_NAME
from stability.report import decision, lr
from stability.report.advice import Recommendation, nearest_swept
from stability.report.compare import Comparison
from stability.report.evaluate import SeedTestResult, WinnerTestResult
from stability.report.factors import FactorAnalysis
from stability.report.fetch import Sweep
from stability.report.format import ci, fmt, pm, pval, seeds, signed, signed_ci, size, table
from stability.report.health import summary_sentence
from stability.report.html import inert
from stability.report.plots import Figure
from stability.report.select import SELECTION_RULE
from stability.report.spending import Spending, section
from stability.report.winner import Decision
from stability.stats.paired import wilcoxon_min_p

SUMMARY_COLUMNS = [
    "rank", "label", "fingerprint", "precision", "clip_enabled", "clip_method", "max_norm",
    "accum_steps", "seeds", "seeds_finished", "seeds_diverged", "seeds_failed", "seeds_missing",
    "flag", "loss_mean", "loss_std", "loss_ci_low", "loss_ci_high", "acc_mean", "acc_std",
    "acc_ci_low", "acc_ci_high", "clip_fraction_mean", "clip_fraction_std", "skip_count_mean",
    "skip_count_std", "underflow_mean", "wall_time_s_mean",
    "wall_time_s_median", "wall_time_s_max", "n_paired", "diff_vs_winner",
    "p_vs_winner", "p_wilcoxon_vs_winner", "mdd_vs_winner", "within_ci", "within_noise",
    "stability", "stability_reason", "seed_list",
]


@dataclass(frozen=True)
class ReportContext:
    """Everything report.md is written from."""

    sweep: Sweep
    tracking_uri: str
    runs: pd.DataFrame
    configs: pd.DataFrame  # ranked, with the versus-winner columns
    comparisons: Sequence[Comparison]
    test: WinnerTestResult
    figures: Sequence[Figure]
    notes: Sequence[str]  # what went wrong without stopping the report (plots, registry)
    confidence: float
    alpha: float
    report_run_id: str
    model_version: str  # "" when not registered
    elapsed_s: float
    generated_at: str
    git_commit: str
    advice: Sequence[Recommendation] = ()
    remarks: Sequence[str] = ()  # one line each in the figure section: why a figure is absent
    analysis: FactorAnalysis | None = None  # factor effects from every run (factors.analyse)
    model_uri: str = ""  # the registered winner, ``models:/<name>@champion``; "" if none
    loss_name: str = DEFAULT_LOSS_NAME  # the task's loss (``stability.loss_name``): table heads
    lr_curves: Sequence[lr.LrCurve] = ()  # when train.lr was swept (report/lr.py)
    lr_sentences: Sequence[str] = ()  # how each other factor moves the stable LR range
    spending: Spending | None = None  # an adaptive sweep's rounds (report/spending.py)
    sequential: decision.Sequential | None = None  # an adaptive sweep's verdicts (the same)
    decision: Decision | None = None  # the factor-by-factor choice (report/winner.py)


def write_summary(configs: pd.DataFrame, path: Path) -> None:
    """One row per config, ranked, with every aggregate the report uses."""
    cols = [c for c in SUMMARY_COLUMNS if c in configs.columns]
    configs[cols].assign(winner=configs["rank"] == 1).to_csv(path, index=False)


def _answer(ctx: ReportContext) -> list[str]:
    """The first screen (the decision, at most 10 lines), then everything behind it."""
    w, t, level = ctx.configs.iloc[0], ctx.test, f"{ctx.confidence:.0%}"
    others = len(ctx.configs) - 1
    tested = [s for s in t.seeds if math.isfinite(s.test_loss)]
    an, dec = ctx.analysis, ctx.decision
    how = (f"chosen factor by factor from all {len(ctx.runs)} runs (seeds as blocks; best "
           "validation loss; the cheapest level near the best, then the simplest)"
           if dec is not None and dec.choices else "the study's only finished config"
           if dec is not None else "the lowest mean best validation loss")
    lines = [f"**Train with `{w['label']}`** (config fingerprint `{w['fingerprint']}`), {how}.",
             ""]
    if dec is not None and an is not None and dec.choices:
        lines += [*decision.choice_lines(dec, an, ctx.sequential),
                  f"- {decision.guarantee(dec)}"]
    lines.append(
        f"- Sealed test (split of {t.test_size} sequences, opened once, for this config only): "
        f"loss {pm(t.loss.mean, t.loss.std)}, accuracy {pm(t.acc.mean, t.acc.std, 3)} over "
        f"{len(tested)} seeds (mean ± std).")
    lines += _lowest_line(ctx)
    if dec is not None and dec.note:
        lines.append(f"- **Note: {dec.note}.**")
    lines += ["", "Behind the decision:", ""]
    lines.append(
        f"- Validation (the only selection criterion): best validation loss "
        f"{pm(w['loss_mean'], w['loss_std'])} "
        f"({level} CI {ci(w['loss_ci_low'], w['loss_ci_high'])}) over {int(w['seeds'])} "
        f"seeds; validation accuracy at the best epoch {pm(w['acc_mean'], w['acc_std'], 3)}.")
    if an is not None and an.main:
        lines += ["", "What each setting does, from all "
                  f"{len(ctx.runs)} runs (seeds as blocks; effects on best validation loss, "
                  f"margin ±{size(an.margin, 'nonfinite')}):", "",
                  *_adaptive_line(ctx.sequential),
                  *decision.factor_sentences(an, ctx.sequential), ""]
    if ctx.lr_curves:
        lines += ["How far the learning rate can go (LR sensitivity, Wortsman et al. 2023; "
                  "stable LR range from the stability verdicts; section \"Learning rate\"):", "",
                  *[f"- {t}" for t in ctx.lr_sentences or
                    ["no other factor was swept beside the learning rate."]], ""]
    if math.isinf(w["loss_mean"]):
        lines.append("- **Warning: every config lost at least one seed**; the winner was chosen by "
                     "the tie-breaks (fewest unfinished seeds, then simplest).")
    if w["flag"]:
        lines.append(f"- **Warning: the winner is flagged: {w['flag']}.**")
    if w["precision"] == Precision.FP32 and not w["clip_enabled"] and w["accum_steps"] == 1:
        lines.append("- The winner is the baseline itself (fp32, clip off, accum 1).")
    if "stability" in ctx.configs:
        lines.append(f"- Stability: {summary_sentence(ctx.configs)}")
    lines += [f"- {c.question}: {c.verdict}" for c in ctx.comparisons]
    for r in ctx.advice:
        near = nearest_swept(r)
        lines.append(f"- Recommended clipping threshold (from the clip-off runs' pre-clip norms), "
                     f"{r.sentence()}" + (f"; nearest swept value {near:g}"
                                          if near == near else "") + ".")
    lines.append(f"- Against the winner: {_verdict_counts(ctx.configs)}; "
                 f"{int(ctx.configs['within_ci'].sum())} of {others} other configs have a mean "
                 f"inside the winner's {level} CI.")
    return lines


def _lowest_line(ctx: ReportContext) -> list[str]:
    """The config with the lowest validation mean, against the decision, selection-adjusted."""
    lowest = ctx.configs.sort_values("rank", kind="stable").iloc[0]
    w = ctx.configs.iloc[0]
    if lowest["fingerprint"] == w["fingerprint"]:
        return ["- Lowest validation mean: the winner itself."]
    c = next((c for c in ctx.comparisons if c.other_fp == lowest["fingerprint"]), None)
    if c is None:
        return []
    r = c.result
    return [f"- Lowest validation mean: `{lowest['label']}` ({fmt(lowest['loss_mean'])} vs "
            f"{fmt(w['loss_mean'])}); it − the winner {signed(r.mean_diff)} "
            f"({ctx.confidence:.0%} CI {signed(r.low)} to {signed(r.high)}, {r.n} seeds, "
            f"selection-adjusted p {pval(c.p_adj)}): **{c.word}** for the winner; the lowest of "
            f"{len(ctx.configs)} means is biased low by its own selection."]


def _verdict_counts(configs: pd.DataFrame) -> str:
    """"0 equivalent, 21 undecided, 26 worse" over the configs other than the winner."""
    if "verdict_vs_winner" not in configs:
        return "no per-config verdicts"
    counts = configs["verdict_vs_winner"].iloc[1:].value_counts()
    words = {"equivalent": "equivalent", "undecided": "undecided", "helps": "worse (the winner "
             "helps)", "hurts": "lower on the seeds both finished"}
    parts = [f"{int(counts.get(k, 0))} {v}" for k, v in words.items() if counts.get(k, 0)
             or k in ("equivalent", "undecided")]
    return (", ".join(parts) + " (paired by seed; t-test and TOST each selection-adjusted: "
            "Bonferroni over every pair of configs)")


def _device(runs: pd.DataFrame) -> str:
    devices = sorted(set(runs["device"].astype(str))) if "device" in runs else []
    named = [d for d in devices if d != "auto"]
    return "/".join(named) if named else "this study's machine"


def _factor_section(ctx: ReportContext) -> list[str]:
    an = ctx.analysis
    if an is None or not an.main:
        if an is not None and an.factors:
            return ["No level of a swept factor pairs with its reference on the same seeds (no "
                    "two configs differ in that factor alone): no factor effects.", ""]
        return ["The study swept no factor with two or more levels: no factor effects.", ""]
    parts = [*_adaptive_line(ctx.sequential),
             table(decision.FACTOR_HEADER, decision.factor_table(an, ctx.sequential)), "",
             f"Every contrast pairs runs that differ only in that factor: each cell of the other "
             f"factors and each seed gives one difference (`cells × seeds`). Each seed's mean "
             f"over the cells is one observation and the effect's t-test runs over the seeds "
             f"(`df` = seeds − 1): every run counts, the seed stays the unit (docs/report.md, "
             f"\"Factor effects\"). `helps` / `hurts`: two-sided t-test, Holm over this table "
             f"at α = {an.alpha}; `equivalent`: TOST against ±{size(an.margin, 'nonfinite')} "
             f"(report.margin), Holm over this table; `undecided`: neither. `detectable` is "
             f"the effect found with α / m (Holm's first step) at the report's power. Unfinished "
             "runs count at the study's worst finished loss and a contrast with any is never "
             "called equivalent. `training time ×`: the level's mean training seconds per run "
             "(median step time × optimizer steps; a run without them counts its wall time and is "
             "named under Problems) over the reference's."]
    if an.dropped_cells:
        parts += ["", f"{an.dropped_cells} cell(s) of a contrast lacked a seed on one side: only "
                  "those points were left out (each seed's difference is the mean over the cells "
                  "it has; a seed with none is not counted)."]
    if an.interactions:
        parts += ["", "Two-way interactions (the effect's difference between a level of the "
                  "other factor and its reference; Holm over this table):", "",
                  table(decision.INTERACTION_HEADER, decision.interaction_rows(an))]
    return parts + [""]


def _adaptive_line(seq: decision.Sequential | None) -> list[str]:
    """For an adaptive sweep: whose verdicts these are, and what the numbers beside them are."""
    if seq is None:
        return []
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


def _lr_section(ctx: ReportContext) -> list[str]:
    if not ctx.lr_curves:
        return []
    return ["## Learning rate (LR sensitivity per setting)", "",
            table(lr.HEADER, lr.table_rows(list(ctx.lr_curves))), "",
            "`LR sensitivity`: the mean over the swept learning rates of min(loss(lr), "
            "loss_init) − the best loss(lr), with loss(lr) the final validation loss averaged "
            "over seeds and `loss_init` the validation loss before training (Wortsman et al. "
            "2023); a run that did not finish counts as loss_init. Lower is less sensitive. "
            "`stable LR range`: the largest swept LR up to which every swept LR has a verdict "
            "other than unstable and a mean final loss below loss_init (docs/report.md).", ""]


def answer_markdown(ctx: ReportContext) -> str:
    """The report's answer section (markdown), as it opens report.md."""
    return "\n".join([*_answer(ctx), *_load_line(ctx)])


def _load_line(ctx: ReportContext) -> list[str]:
    """The answer's last line: how to load the registered winner."""
    if not ctx.model_uri:
        return []
    return [f"- Load the winner: `mlflow.pyfunc.load_model(\"{ctx.model_uri}\")` "
            f"(registered model version {ctx.model_version})."]


def _comparison_table(ctx: ReportContext) -> str:
    rows = [[c.question, c.reference, c.other, str(c.result.n), signed(c.result.mean_diff),
             signed_ci(c.result.low, c.result.high), pval(c.result.p_t), pval(c.p_adj),
             pval(c.result.p_wilcoxon), size(c.power.mdd), seeds(c.power.seeds_for_effect),
             str(c.other_unfinished)] for c in ctx.comparisons]
    power = ctx.comparisons[0].power if ctx.comparisons else None
    effect = size(power.effect) if power else "—"
    level = f"{power.power:.0%}" if power else ""
    return table(["question", "reference", "other", "paired seeds", "mean diff (other − ref)",
                   f"{ctx.confidence:.0%} CI", "paired t p", "selection-adjusted p", "Wilcoxon p",
                   f"detectable at {level} power", f"seeds to detect {effect}",
                   "other's unfinished seeds"], rows)


def _config_table(configs: pd.DataFrame, loss_name: str = DEFAULT_LOSS_NAME) -> str:
    rows = []
    for _, c in configs.iterrows():
        rows.append([
            str(c["rank"]), f"`{c['label']}`", str(c.get("stability", "—")),
            f"{c['seeds_finished']}/{c['seeds']}",
            str(c["seeds_diverged"] + c["seeds_failed"]), pm(c["loss_mean"], c["loss_std"]),
            ci(c["loss_ci_low"], c["loss_ci_high"]), pm(c["acc_mean"], c["acc_std"], 3),
            fmt(c["clip_fraction_mean"], 3), fmt(c["skip_count_mean"], 1),
            fmt(c["underflow_mean"], 4), _wall(c),
            signed(c["diff_vs_winner"]), pval(c.get("p_adj_vs_winner", c["p_vs_winner"])),
            size(c["mdd_vs_winner"]),
            c["flag"] or "",
        ])
    return table(["rank", "config", "stability", "finished", "unfinished",
                   f"best val loss ({loss_name})", "CI",
                   "val acc", "clip frac", "skips", "fp16 underflow", "wall s (median, max)",
                   "diff vs winner", "p vs winner (selection-adjusted)", "detectable vs winner",
                   "flag"], rows)


def _wall(c: pd.Series) -> str:
    median, top = c.get("wall_time_s_median", math.nan), c.get("wall_time_s_max", math.nan)
    return "—" if math.isnan(median) else f"{median:.1f} ({top:.1f})"


def _mlflow_state(s: SeedTestResult) -> str:
    """What the report did with a seed's test metrics in MLflow."""
    if s.logged:
        return "logged now"
    return "already logged" if math.isfinite(s.test_loss) else "not evaluated"


def _test_table(t: WinnerTestResult, loss_name: str = DEFAULT_LOSS_NAME) -> str:
    rows = [[str(s.seed), f"`{s.run_id}`", fmt(s.test_loss), fmt(s.test_acc, 4),
             _mlflow_state(s), inert(s.note)] for s in t.seeds]
    return table(["seed", "run", f"test loss ({loss_name})", "test acc", "MLflow", "note"],
                  rows)


def render(ctx: ReportContext) -> str:
    """The whole report.md."""
    s, runs, configs = ctx.sweep, ctx.runs, ctx.configs
    seeds = sorted(runs["seed"].unique())
    n = len(seeds)
    flagged = configs[configs["flag"] != ""]
    parts = [
        f"# Training-stability report: sweep `{s.sweep_id}`", "",
        f"Experiment `{s.experiment}` at `{ctx.tracking_uri}`; {len(runs)} training runs, "
        f"{len(configs)} configs, seeds {', '.join(map(str, seeds))}. Generated "
        f"{ctx.generated_at} (git `{ctx.git_commit[:12] or 'unknown'}`) in {ctx.elapsed_s:.1f} s; "
        f"MLflow report run `{ctx.report_run_id}`"
        + (f", registered model version {ctx.model_version}." if ctx.model_version else "."), "",
        "## Answer", "", *_answer(ctx), *_load_line(ctx), "",
        "## Factor effects (every run, seeds as blocks)", "", *_factor_section(ctx),
        *_lr_section(ctx),
        *(["## How the study spent its runs", "", *section(ctx.spending)] if ctx.spending
          else []),
        "## Selection rule", "", SELECTION_RULE + ".", "",
        "The test split played no part in the choice: it was opened only after selection, "
        "for the winner's seeds.", "",
        "## How sure (paired by seed)", "", _comparison_table(ctx), "",
        f"Differences are `other − reference` in best validation loss over the seeds both "
        f"finished ({ctx.confidence:.0%} t interval). The decision uses the paired t-test with "
        f"Holm's correction over this table at α = {ctx.alpha}; the Wilcoxon signed-rank test "
        f"is a distribution-free check. With {n} seeds the exact two-sided Wilcoxon p-value "
        f"cannot go below {wilcoxon_min_p(n):.4g}, which is why it is not the decision. "
        "`detectable` is the minimum detectable difference: the mean difference the paired t-test "
        "on these seeds would find with the stated power, from the observed SD of the per-seed "
        "differences (noncentral t; docs/report.md). A non-significant result says nothing "
        "about differences smaller than that.", "",
        "## Test evaluation (winner only)", "", _test_table(ctx.test, ctx.loss_name), "",
        f"Evaluated on `{ctx.test.device}` under each run's own precision from its "
        "`checkpoints/best.pt` artifact (the best-validation epoch).", "",
        "## All configs, ranked", "", _config_table(configs, ctx.loss_name), "",
        "`unfinished` seeds count as +inf in `best val loss`; `val acc` is at each seed's best "
        "epoch, over finished seeds; `p vs winner` is the unadjusted paired t-test; `wall s` is "
        "the median run time over seeds (a worker's first run also pays its cold start: imports, "
        "first kernels) with the slowest seed in brackets.", "",
        "## Stability verdicts", "",
        *([f"- `{r['label']}`: **{r['stability']}**: {r['stability_reason']}"
           for _, r in configs.iterrows() if r.get("stability", "stable") != "stable"]
          or ["- every config is stable."]), "",
        "Judged per seed from `steps.csv` and the run's outcome, worst seed wins; thresholds are "
        "`verdict.*` in `conf/report.yaml` (docs/report.md).", "",
        "## Flags", "",
        *([f"- `{r['label']}`: {r['flag']}" for _, r in flagged.iterrows()]
          or ["- none: every config has every seed, all finished."]), "",
    ]
    if ctx.notes:
        parts += ["## Problems while writing this report", "",
                  *[f"- {inert(note)}" for note in ctx.notes], ""]
    parts += ["## Figures", ""]
    for remark in ctx.remarks:
        parts += [remark, ""]
    for f in ctx.figures:
        parts += [f"### {f.title}", "", f"![{f.title}](plots/{f.file})", "", f.caption, ""]
    parts += ["## Reproduce", "", "```bash",
              f"python experiments/report.py experiment={s.experiment} sweep_id={s.sweep_id}",
              "```", "", "`summary.csv` holds the ranked table with every aggregate above.", ""]
    return "\n".join(parts)
