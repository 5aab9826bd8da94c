"""Aggregation over seeds, the +inf rule, tie-breaking and the comparisons, on small tables."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from stability.report.decide.compare import Criteria, comparisons, versus_winner
from stability.report.decide.select import (
    SELECTION_RULE,
    aggregate,
    baseline,
    effective_loss,
    missing_costs,
    representative_seed,
)
from stability.report.options import ReportError, Thresholds, to_report_config
from stability.stats.paired import min_detectable, seeds_needed


def runs_table(configs: list[tuple[str, str, bool, float, int, dict[int, float | str]]]
               ) -> pd.DataFrame:
    """Rows shaped like ``fetch.fetch_runs``: (fp, precision, clip, max_norm, accum, losses)."""
    rows = []
    for fp, precision, clip, max_norm, accum, losses in configs:
        for seed, loss in losses.items():
            finished = not isinstance(loss, str)
            rows.append({
                "run_id": f"{fp}-{seed}", "fingerprint": fp, "seed": seed,
                "outcome": "finished" if finished else loss,
                "best_val_loss": loss if finished else 0.01,
                "precision.name": precision, "clip.enabled": clip, "clip.method": "norm",
                "clip.max_norm": max_norm, "train.accum_steps": accum,
                "clip_fraction": 0.5 if clip else 0.0, "skip_count": 1 if not finished else 0,
                "fp16_underflow_fraction": 0.01 if precision == "fp16" else math.nan,
                "wall_time_s": 2.0, "val_acc_at_best": 0.8 + seed / 100 if finished else math.nan,
            })
    return pd.DataFrame(rows)


def test_aggregate_mean_std_and_t_interval_per_config():
    runs = runs_table([("a", "fp32", False, 1.0, 1, {0: 0.40, 1: 0.44, 2: 0.42}),
                       ("b", "fp16", True, 0.5, 2, {0: 0.50, 1: 0.52, 2: 0.51})])
    configs = aggregate(runs)
    a = configs.set_index("fingerprint").loc["a"]
    losses = [0.40, 0.44, 0.42]
    low, high = stats.t.interval(0.95, 2, loc=0.42, scale=stats.sem(losses))
    assert a["loss_mean"] == pytest.approx(0.42)
    assert a["loss_std"] == pytest.approx(pd.Series(losses).std())
    assert (a["loss_ci_low"], a["loss_ci_high"]) == pytest.approx((low, high))
    assert a["acc_mean"] == pytest.approx(0.81)
    assert a["label"] == "fp32 noclip acc=1"
    assert configs.set_index("fingerprint").loc["b", "label"] == "fp16 clip=0.5 acc=2"
    assert list(configs["fingerprint"]) == ["a", "b"] and list(configs["rank"]) == [1, 2]


def test_a_diverged_seed_counts_as_inf_so_the_config_cannot_win():
    runs = runs_table([("lucky", "fp16", True, 1.0, 1, {0: 0.10, 1: 0.11, 2: "diverged"}),
                       ("steady", "fp32", False, 1.0, 1, {0: 0.40, 1: 0.41, 2: 0.42})])
    configs = aggregate(runs)
    assert configs.iloc[0]["fingerprint"] == "steady"
    lucky = configs.set_index("fingerprint").loc["lucky"]
    assert lucky["loss_mean"] == math.inf
    assert lucky["seeds_diverged"] == 1 and lucky["seeds_finished"] == 2
    assert "did not finish" in lucky["flag"]
    assert "+inf" in SELECTION_RULE
    # the tie-break in words, from the design's registry (``design.factors.TIE_BREAK``)
    assert ("the simpler config: clip off before on, fp32 before bf16 before fp16, smaller "
            "train.accum_steps; then the fingerprint, alphabetically") in SELECTION_RULE


def test_failed_or_nan_runs_are_inf_too():
    runs = runs_table([("x", "fp32", False, 1.0, 1, {0: 0.3, 1: "failed", 2: math.nan})])
    assert list(effective_loss(runs)) == [0.3, math.inf, math.inf]
    row = aggregate(runs).iloc[0]
    assert row["seeds_failed"] == 1 and row["seeds_finished"] == 2


@pytest.mark.parametrize(("first", "second"), [
    (("off", "fp32", False, 1.0, 1), ("on", "fp32", True, 1.0, 1)),  # clip off before on
    (("fp32", "fp32", True, 1.0, 1), ("bf16", "bf16", True, 1.0, 1)),  # fp32 before bf16
    (("bf16", "bf16", True, 1.0, 1), ("fp16", "fp16", True, 1.0, 1)),  # bf16 before fp16
    (("acc2", "fp16", True, 1.0, 2), ("acc4", "fp16", True, 1.0, 4)),  # smaller accum first
    (("off16", "fp16", False, 1.0, 8), ("on32", "fp32", True, 1.0, 1)),  # clip decides first
])
def test_ties_go_to_the_simpler_config(first, second):
    losses = {0: 0.3, 1: 0.5}
    for order in ((second, first), (first, second)):  # input order must not matter
        configs = aggregate(runs_table([(*c, losses) for c in order]))
        assert list(configs["fingerprint"]) == [first[0], second[0]]


def test_ties_between_inf_configs_go_to_fewer_unfinished_seeds():
    runs = runs_table([("two_lost", "fp32", False, 1.0, 1, {0: "diverged", 1: "failed"}),
                       ("one_lost", "fp16", True, 1.0, 4, {0: 0.2, 1: "diverged"})])
    assert aggregate(runs).iloc[0]["fingerprint"] == "one_lost"


def test_missing_seeds_are_flagged():
    runs = runs_table([("full", "fp32", False, 1.0, 1, {0: 0.4, 1: 0.4, 2: 0.4}),
                       ("short", "fp32", True, 1.0, 1, {0: 0.5, 2: 0.5})])
    short = aggregate(runs).set_index("fingerprint").loc["short"]
    assert short["seeds_missing"] == 1
    assert short["flag"] == "missing seeds 1"


def test_labels_tell_apart_configs_that_differ_elsewhere():
    runs = runs_table([("g", "fp32", False, 1.0, 1, {0: 0.4}), ("r", "fp32", False, 1.0, 1,
                                                               {0: 0.5})])
    runs["model.cell"] = ["gru", "rnn"]
    labels = set(aggregate(runs)["label"])
    assert labels == {"fp32 noclip acc=1 model.cell=gru", "fp32 noclip acc=1 model.cell=rnn"}


def test_representative_seed_is_the_median_finished_seed():
    runs = runs_table([("a", "fp32", False, 1.0, 1,
                        {0: 0.5, 1: 0.3, 2: 0.4, 3: "diverged", 4: 0.6})])
    assert representative_seed(runs, "a")["seed"] == 2  # median of 0.3 0.4 0.5 0.6 -> lower
    assert representative_seed(runs_table([("d", "fp16", True, 1.0, 1, {0: "diverged"})]),
                               "d") is None


def five_seeds(base: float, shifts: list[float]) -> dict[int, float]:
    return {s: base + d for s, d in enumerate(shifts)}


def test_an_unclear_winner_comparison_is_undecided_or_equivalent_never_no_difference():
    noise = [0.01, -0.02, 0.015, -0.005, 0.0]
    runs = runs_table([
        ("base", "fp32", False, 1.0, 1, five_seeds(0.40, [0.0] * 5)),
        ("other", "bf16", False, 1.0, 1, five_seeds(0.40, noise)),
    ])
    configs = versus_winner(runs, aggregate(runs))
    [c] = comparisons(runs, configs, Criteria(margin=0.001))
    assert c.question == "chosen vs lowest-mean bf16" and c.word == "undecided"
    assert c.verdict.startswith("**undecided**: neither shown different nor within ±0.0010")
    assert c.result.p_t == pytest.approx(stats.ttest_rel(
        [0.40 + d for d in noise], [0.40] * 5).pvalue)
    # The same data with a margin far outside the noise: TOST shows equivalence.
    [wide] = comparisons(runs, configs, Criteria(margin=0.05))
    assert wide.word == "equivalent" and wide.verdict.startswith("**equivalent** within ±0.0500")
    assert "no significant difference" not in (c.verdict + wide.verdict).lower()


def test_comparisons_call_a_clear_effect_significant_and_count_seed_noise():
    runs = runs_table([
        ("win", "bf16", True, 1.0, 2, five_seeds(0.30, [0.0, 0.01, -0.01, 0.005, -0.005])),
        ("base", "fp32", False, 1.0, 1, five_seeds(0.50, [0.0, 0.012, -0.008, 0.004, -0.006])),
        ("near", "fp16", True, 1.0, 2, five_seeds(0.30, [0.002, 0.0, -0.005, 0.01, -0.004])),
    ])
    configs = versus_winner(runs, aggregate(runs))
    assert configs.iloc[0]["fingerprint"] == "win" and baseline(configs) == "base"
    by_q = {c.question: c for c in comparisons(runs, configs)}
    base = by_q["chosen vs baseline (fp32, clip off, accum 1) / lowest-mean fp32"]
    assert base.result.mean_diff == pytest.approx(0.2, abs=1e-3)
    assert base.p_adj == pytest.approx(min(1.0, 3 * base.result.p_t))  # 3 configs: 3 pairs
    assert base.p_adj < 0.05 and base.verdict.startswith("**helps**: the chosen config is lower")
    near = by_q["chosen vs lowest-mean fp16"]
    assert near.word == "undecided" and near.verdict.startswith("**undecided**")
    rows = configs.set_index("fingerprint")
    assert rows.loc["near", "within_noise"] and not rows.loc["base", "within_noise"]
    assert rows.loc["near", "within_ci"] and not rows.loc["base", "within_ci"]
    assert math.isnan(rows.loc["win", "p_vs_winner"])


def test_report_config_names_the_bad_key():
    with pytest.raises(ReportError, match=r"device='gpu' is invalid: allowed values are auto"):
        to_report_config({"device": "gpu"})
    with pytest.raises(ReportError, match="unknown key colour"):
        to_report_config({"colour": "red"})
    with pytest.raises(ReportError, match=r"alpha=1.5 is invalid"):
        to_report_config({"alpha": 1.5})
    assert to_report_config({"sweep_id": 20260101, "registry": {"enabled": False}}).sweep_id \
        == "20260101"


def test_a_question_asked_twice_is_one_test_and_two_configs_are_one_pair():
    runs = runs_table([
        ("clip", "fp32", True, 1.0, 1, five_seeds(0.300, [0.0, 0.01, -0.01, 0.005, -0.005])),
        ("plain", "fp32", False, 1.0, 1, five_seeds(0.301, [0.004, -0.006, 0.0, -0.01, 0.01])),
    ])
    configs = versus_winner(runs, aggregate(runs))
    assert configs.iloc[0]["fingerprint"] == "clip"
    found = comparisons(runs, configs)
    # best fp32 is the winner itself: one question; two configs are one pair, so no penalty
    assert [c.question for c in found] == ["chosen vs baseline (fp32, clip off, accum 1)"]
    assert found[0].p_adj == pytest.approx(found[0].result.p_t)


def test_a_non_significant_verdict_says_what_difference_would_go_unseen():
    noise = [0.01, -0.02, 0.015, -0.005, 0.0]
    runs = runs_table([
        ("base", "fp32", False, 1.0, 1, five_seeds(0.40, [0.0, 0.004, -0.004, 0.002, -0.002])),
        ("clip", "bf16", True, 1.0, 1, five_seeds(0.40, noise)),
    ])
    configs = versus_winner(runs, aggregate(runs), Criteria(alpha=0.05, power=0.8))
    [clip] = comparisons(runs, configs, Criteria(alpha=0.05, power=0.8, min_effect=0.005))
    diffs = [n - b for n, b in zip(noise, [0.0, 0.004, -0.004, 0.002, -0.002], strict=True)]
    sd = float(pd.Series(diffs).std(ddof=1))
    expected = min_detectable(sd, 5, 0.05, 0.8)
    assert clip.power.mdd == pytest.approx(expected)
    assert expected > abs(clip.result.mean_diff)  # why nothing was found: too few seeds
    assert (f"with 5 seeds a difference smaller than {expected:.4f} "
            "would go unseen (80% power, α = 0.05)") in clip.verdict
    assert clip.power.seeds_for_effect == seeds_needed(0.005, sd, 0.05, 0.8)
    assert f"detecting 0.0050 would take {int(clip.power.seeds_for_effect)} seeds" in clip.verdict
    other = configs.set_index("fingerprint").loc[
        "clip" if configs.iloc[0]["fingerprint"] == "base" else "base"]
    assert other["mdd_vs_winner"] == pytest.approx(expected)


def test_the_default_effect_is_the_winners_seed_sd():
    runs = runs_table([
        ("a", "fp32", False, 1.0, 1, five_seeds(0.30, [0.0, 0.01, -0.01, 0.005, -0.005])),
        ("b", "bf16", True, 1.0, 1, five_seeds(0.31, [0.004, -0.006, 0.0, -0.01, 0.01])),
    ])
    configs = versus_winner(runs, aggregate(runs))
    [c, *_] = comparisons(runs, configs, Criteria(min_effect_sd=2.0))
    assert c.power.effect == pytest.approx(2.0 * configs.iloc[0]["loss_std"])


def test_wall_time_is_the_median_over_seeds_so_a_cold_start_does_not_skew_it():
    runs = runs_table([("a", "fp32", False, 1.0, 1, {0: 0.3, 1: 0.3, 2: 0.3})])
    runs["wall_time_s"] = [22.9, 0.2, 0.3]  # the worker's first run paid the cold start
    row = aggregate(runs).iloc[0]
    assert row["wall_time_s_median"] == pytest.approx(0.3)
    assert row["wall_time_s_max"] == pytest.approx(22.9)


def test_finished_runs_without_a_cost_metric_are_named_not_silently_timed_by_wall_time():
    runs = runs_table([("a", "fp32", False, 1.0, 1, {0: 0.3, 1: 0.3, 2: "failed"})])
    runs["run_name"] = ["a s=0", "a s=1", "a s=2"]
    runs["step_time_median_s"] = [0.01, math.nan, math.nan]  # s=1: an old or hand-tracked run
    runs["effective_batch"], runs["grad_syncs"], runs["final_scaler_scale"] = 32, 10, 1.0
    assert missing_costs(runs) == ["1 finished run(s) lack `step_time_median_s`: their "
                                   "training time is their wall_time_s (cold start included): "
                                   "`a s=1`"]
    runs["step_time_median_s"] = 0.01
    assert missing_costs(runs.drop(columns=["grad_syncs"])) == [
        "2 finished run(s) lack `grad_syncs`: `a s=0`, `a s=1`"]


def test_the_config_table_is_assembled_once_from_the_stages_parts_with_the_schemas_columns():
    from dataclasses import replace

    from stability.report.decide.compare import versus
    from stability.report.decide.select import put_first
    from stability.report.decide.table import COLUMNS, SUMMARY_COLUMNS, ConfigTable
    from stability.report.examine import health

    runs = runs_table([
        ("low", "fp16", True, 1.0, 2, {0: 0.30, 1: 0.31, 2: 0.29}),
        ("base", "fp32", False, 1.0, 1, {0: 0.35, 1: 0.36, 2: 0.34}),
        ("lost", "bf16", True, 0.5, 1, {0: 0.20, 1: "diverged", 2: 0.21}),
    ])
    ranked = put_first(aggregate(runs), "base")  # a decided winner that is not rank 1
    t = Thresholds()
    table = ConfigTable.assemble(ranked, versus(runs, ranked),
                                 health.verdicts(runs, ranked, {}, t))
    assert [r.fingerprint for r in table] == ["base", "low", "lost"] and len(table) == 3
    assert table.winner.fingerprint == "base" and table.lowest.fingerprint == "low"
    assert table.row("lost").unfinished == 1 and math.isinf(table.row("lost").loss_mean)
    assert table.winner.verdict_vs_winner == "winner" and not table.winner.within_ci
    # The same numbers as the column-by-column frame the analyses read.
    grown = health.judge(runs, versus_winner(runs, ranked), {}, t)
    frame = table.frame()
    assert list(frame.columns) == list(COLUMNS)
    assert sorted(grown.columns) == sorted(COLUMNS)
    pd.testing.assert_frame_equal(frame, grown[list(COLUMNS)], check_dtype=False)
    summary = table.summary()
    assert list(summary.columns) == [*SUMMARY_COLUMNS, "winner"]
    assert list(summary["winner"]) == [True, False, False]  # the decision's choice, not rank 1
    with pytest.raises(KeyError):
        table.row("absent")
    # The stability sentence reads the typed rows: one group per precision and verdict.
    marginal = [replace(table.row("low"), stability="marginal", stability_reason=reason)
                for reason in ("spikes (1/3 seeds)", "backoffs (2/3 seeds)")]
    mixed = ConfigTable((replace(table.winner, stability="stable", stability_reason=""),
                         *marginal, table.row("lost")))
    assert table.row("lost").stability == "unstable"  # its diverged seed
    # each config with its own reason, never another config's (issue 49)
    low, lost = table.row("low").label, table.row("lost").label
    assert health.summary_sentence(mixed) == (
        f"The chosen config is stable; 1 bf16 config is unstable: `{lost}` (diverged); "
        f"2 fp16 configs are marginal: `{low}` (backoffs), `{low}` (spikes); "
        "0 of 3 others stable.")
