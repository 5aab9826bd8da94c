"""The answer as a decision: four-word sentences, the margin, the cost-aware recommendation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from stability.report import decision, factors, winner
from stability.report.compare import versus_winner
from stability.report.options import ReportError, to_report_config
from stability.report.select import aggregate
from stability.stats import effects as fx
from stability.stats.paired import paired_power

WORDS = ("**helps**", "**hurts**", "**equivalent**", "**undecided**")


def study(effects: dict[str, float], seconds: dict[str, float], noise: float = 0.004,
          seeds: int = 5, rng_seed: int = 0) -> pd.DataFrame:
    """A 2 (clip off / 5) x 2 (fp32 / fp16) x seeds study with planted effects and run cost."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for clip in (None, 5.0):
        for precision in ("fp32", "fp16"):
            fp = f"{precision}-{clip}"
            for s in range(seeds):
                loss = 0.10 + effects.get(fp, 0.0) + rng.normal(0, noise)
                rows.append({"run_id": f"{fp}-{s}", "fingerprint": fp, "seed": s,
                             "outcome": "finished", "best_val_loss": loss,
                             "precision.name": precision, "clip.enabled": clip is not None,
                             "clip.method": "norm", "clip.max_norm": clip or 1.0,
                             "train.accum_steps": 1, "wall_time_s": 99.0,
                             "step_time_median_s": seconds[precision], "optimizer_steps": 100,
                             "peak_memory_mb": 300.0})
    return pd.DataFrame(rows)


def analysed(runs: pd.DataFrame, margin: float) -> tuple[pd.DataFrame, factors.FactorAnalysis]:
    configs = aggregate(runs)
    configs = versus_winner(runs, configs, margin=margin)
    return configs, factors.analyse(runs, configs, margin)


def test_every_factor_sentence_opens_its_verdict_with_one_of_four_words():
    runs = study({"fp32-5.0": -0.02, "fp16-5.0": -0.02}, {"fp32": 0.01, "fp16": 0.06})
    _, an = analysed(runs, 0.005)
    text = " ".join(decision.factor_sentences(an))
    assert "no significant difference" not in text.lower()
    clip = next(e for e in an.main if e.factor == factors.CLIP)
    assert clip.verdict == fx.HELPS and "max_norm 5 **helps**: lowers the loss by" in text
    prec = next(e for e in an.main if e.factor == factors.PRECISION)
    assert sum(text.count(w) for w in WORDS) == len(an.main)
    # fp16 costs what it costs, and the sentence says so
    assert prec.cost_ratio == pytest.approx(6.0)
    assert "6.00× the training time of fp32" in text


def _decide(runs: pd.DataFrame, margin: float, tolerance: float = 0.1) -> winner.Decision:
    configs = aggregate(runs)
    return winner.decide(runs, configs, factors.analyse(runs, configs, margin), margin,
                         cost_tolerance=tolerance)


def _chosen(dec: winner.Decision, factor: str) -> str:
    c = next(c for c in dec.choices if factor in c.factors)
    return c.levels[c.chosen][c.factors.index(factor)]


def test_the_cheaper_level_within_the_margin_is_chosen_over_the_lowest_mean():
    """fp16 is lower by a negligible 0.0005; fp32 is shown within the margin and 6x cheaper."""
    runs = study({"fp16-None": -0.0005, "fp16-5.0": -0.0005}, {"fp32": 0.01, "fp16": 0.06},
                 noise=0.0002)
    assert aggregate(runs).iloc[0]["precision"] == "fp16"  # the lowest mean
    dec = _decide(runs, 0.005)
    assert _chosen(dec, factors.PRECISION) == "fp32" and dec.guaranteed
    assert dec.fingerprint == "fp32-None"  # clip off: equally cheap, simpler
    _, an = analysed(runs, 0.005)
    lines = decision.choice_lines(dec, an)
    assert lines[1].startswith("- **Precision → fp32** (shown within ±0.0050 of the best level)")
    assert "6.00× the time" in lines[1]
    assert "with probability ≥ 95%" in decision.guarantee(dec)


def test_a_level_shown_worse_than_the_best_is_never_chosen_however_cheap():
    """fp16 is 6x dearer but 0.02 lower with tight seeds: fp32 is shown worse, fp16 is chosen."""
    runs = study({"fp16-None": -0.02, "fp16-5.0": -0.02}, {"fp32": 0.01, "fp16": 0.06},
                 noise=0.001)
    dec = _decide(runs, 0.005)
    c = next(c for c in dec.choices if c.factors == (factors.PRECISION,))
    assert c.status == ("worse", "within") and _chosen(dec, factors.PRECISION) == "fp16"


def test_without_evidence_the_cheapest_not_shown_worse_is_chosen_and_the_guarantee_says_so():
    """Seeds too noisy to show anything within the margin: fp32 (cheapest) is taken, and the
    guarantee names no factor as within the margin."""
    runs = study({}, {"fp32": 0.01, "fp16": 0.06}, noise=0.01)
    dec = _decide(runs, 0.0005)
    assert all(set(c.status) == {"open"} for c in dec.choices)
    assert _chosen(dec, factors.PRECISION) == "fp32" and not dec.guaranteed
    assert "none of the 2 choices is shown within" in decision.guarantee(dec)


def test_costs_within_the_tolerance_are_equal_and_the_simplest_wins():
    """Clip on is 5% dearer than off here and both are within the margin: off is simpler."""
    runs = study({}, {"fp32": 0.01, "fp16": 0.06}, noise=0.0002)
    runs.loc[runs["clip.enabled"], "step_time_median_s"] *= 0.95  # clip on 5% cheaper
    assert _chosen(_decide(runs, 0.005), factors.CLIP) == "off"
    assert _chosen(_decide(runs, 0.005, tolerance=0.0), factors.CLIP) == "max_norm 5"


def test_a_config_with_an_unfinished_seed_is_never_the_winner():
    """The rule's choice lost a seed: the next combination in order is the winner, and says why."""
    runs = study({"fp16-None": -0.0005, "fp16-5.0": -0.0005}, {"fp32": 0.01, "fp16": 0.06},
                 noise=0.0002)
    runs.loc[(runs["fingerprint"] == "fp32-None") & (runs["seed"] == 3), "outcome"] = "diverged"
    dec = _decide(runs, 0.005)
    assert dec.fingerprint != "fp32-None" and "unfinished seed" in dec.note


def test_old_runs_without_cost_metrics_fall_back_to_wall_time():
    runs = study({}, {"fp32": 0.01, "fp16": 0.06}).drop(
        columns=["step_time_median_s", "optimizer_steps", "peak_memory_mb"])
    configs = aggregate(runs)
    assert (configs["train_seconds"] == 99.0).all()
    assert configs["peak_memory_mb"].isna().all()


def test_margin_is_a_share_of_the_winner_or_loss_units():
    assert decision.margin_of("5%", 0.08) == pytest.approx(0.004)
    assert decision.margin_of(0.002, 0.08) == 0.002
    assert math.isnan(decision.margin_of("5%", math.inf))  # no finite winner: no equivalence
    assert to_report_config({"margin": "2%"}).margin == "2%"
    assert to_report_config({"margin": 0.003}).margin == 0.003
    for bad in ("five", "0%", -1.0, "150%"):
        with pytest.raises(ReportError, match=r"margin=.* is invalid: allowed values are a share"):
            to_report_config({"margin": bad})


def test_an_undecided_contrast_quotes_seeds_at_which_its_test_has_the_power():
    """The quoted seed count is where the two-sided test reaches the power, at alpha / m."""
    mean, sd, alpha = 0.01, 0.012, 0.05 / 8
    n = fx.seeds_to_decide(mean, sd, margin=0.004, alpha=alpha, power=0.8)
    assert paired_power(mean, sd, int(n), alpha) >= 0.8 > paired_power(mean, sd, int(n) - 1, alpha)
    # inside the margin, equivalence may decide it sooner than detection would
    near = fx.seeds_to_decide(0.0005, 0.004, margin=0.004, alpha=alpha, power=0.8)
    assert fx.tost_power(0.0005, 0.004, int(near), 0.004, alpha) >= 0.8
    assert near < fx.seeds_to_decide(0.0005, 0.004, margin=1e-9, alpha=alpha, power=0.8)
