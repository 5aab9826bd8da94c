"""The answer as a decision: four-word sentences, the margin, the cost-aware recommendation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from stability.report import decision, factors
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


def test_the_cheapest_equivalent_config_is_recommended_and_named_as_equivalent():
    """fp16 wins by a real but negligible 0.0005: fp32 is equivalent to it and 6x cheaper."""
    runs = study({"fp16-None": -0.0005, "fp16-5.0": -0.0005}, {"fp32": 0.01, "fp16": 0.06},
                 noise=0.0002)
    configs, _ = analysed(runs, 0.005)
    assert configs.iloc[0]["precision"] == "fp16"
    row, kind = decision.cheapest(configs)
    assert kind == fx.EQUIVALENT and row["precision"] == "fp32"
    text = decision.cost_sentence(configs, 0.005, "cpu")
    assert "6.00× faster on cpu" in text
    assert "**equivalent** to the winner within ±0.0050" in text


def test_without_equivalence_the_recommendation_says_not_distinguishable():
    """fp16 a little lower, seeds too noisy to tell, margin too tight to show equivalence."""
    runs = study({"fp16-None": -0.01, "fp16-5.0": -0.01}, {"fp32": 0.01, "fp16": 0.06},
                 noise=0.01)
    configs, _ = analysed(runs, 0.012)
    assert configs.iloc[0]["precision"] == "fp16"
    row, kind = decision.cheapest(configs, 0.012)
    assert kind == fx.UNDECIDED and row["precision"] == "fp32"
    assert abs(row["diff_vs_winner"]) <= 0.012
    assert "**not distinguishable** from the winner" in decision.cost_sentence(
        configs, 0.012, "cpu")


def test_an_undecided_config_far_from_the_winner_is_not_recommended():
    """Two seeds cannot tell a config 0.05 worse apart; its estimate is outside the margin."""
    runs = study({"fp32-None": 0.05, "fp32-5.0": 0.05}, {"fp32": 0.01, "fp16": 0.06},
                 noise=0.05, seeds=2)
    configs, _ = analysed(runs, 0.005)
    assert configs.iloc[0]["precision"] == "fp16"
    assert (configs.loc[configs["precision"] == "fp32", "verdict_vs_winner"] == "undecided").all()
    row, _ = decision.cheapest(configs, 0.005)
    assert row is None
    assert "no cheaper config is shown equivalent" in decision.cost_sentence(configs, 0.005, "cpu")


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
