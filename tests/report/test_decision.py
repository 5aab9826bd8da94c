"""The answer as a decision: four-word sentences, the margin, the cost-aware recommendation."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from stability.design import factors as vocabulary
from stability.design.margin import Margin
from stability.report.decide import factors, winner
from stability.report.decide.compare import Criteria, versus_winner
from stability.report.decide.select import aggregate
from stability.report.options import ReportError, to_report_config
from stability.report.present.sections import decision_text as decision
from stability.stats import cost as costs
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
    configs = versus_winner(runs, configs, Criteria(margin=margin))
    return configs, factors.analyse(runs, configs, margin)


def test_every_factor_sentence_opens_its_verdict_with_one_of_four_words():
    runs = study({"fp32-5.0": -0.02, "fp16-5.0": -0.02}, {"fp32": 0.01, "fp16": 0.06})
    _, an = analysed(runs, 0.005)
    text = " ".join(decision.factor_sentences(an))
    assert "no significant difference" not in text.lower()
    clip = next(e for e in an.main if e.factor == vocabulary.CLIP)
    assert clip.verdict == fx.HELPS and "max_norm 5 **helps**: lowers the loss by" in text
    prec = next(e for e in an.main if e.factor == vocabulary.PRECISION)
    assert sum(text.count(w) for w in WORDS) == len(an.main)
    # fp16 costs what it costs, and the sentence says so
    assert prec.cost_ratio == pytest.approx(6.0)
    assert "6.00× the training time of fp32" in text


def _decide(runs: pd.DataFrame, margin: float, tolerance: float = costs.FLOOR
            ) -> winner.Decision:
    configs = aggregate(runs)
    return winner.decide(runs, configs, factors.analyse(runs, configs, margin),
                         winner.Settings(margin=margin, cost_tolerance=tolerance))


def _chosen(dec: winner.Decision, factor: str) -> str:
    c = next(c for c in dec.choices if factor in c.factors)
    return c.levels[c.chosen][c.factors.index(factor)]


def test_the_cheaper_level_within_the_margin_is_chosen_over_the_lowest_mean():
    """fp16 is lower by a negligible 0.0005; fp32 is shown within the margin and 6x cheaper."""
    runs = study({"fp16-None": -0.0005, "fp16-5.0": -0.0005}, {"fp32": 0.01, "fp16": 0.06},
                 noise=0.0002)
    assert aggregate(runs).iloc[0]["precision"] == "fp16"  # the lowest mean
    dec = _decide(runs, 0.005)
    assert _chosen(dec, vocabulary.PRECISION) == "fp32" and dec.guaranteed
    assert dec.fingerprint == "fp32-None"  # clip off: equally cheap, simpler
    _, an = analysed(runs, 0.005)
    lines = decision.choice_lines(dec, an)
    assert lines[1].startswith("- **Precision → fp32** (shown within 0.0050 of the best level: at "
                               "most ")
    assert "6.00× the time" in lines[1]
    assert "Shown: with probability ≥ 95%" in decision.guarantee(dec)
    assert "Best guess" not in decision.guarantee(dec)


def test_a_level_shown_worse_than_the_best_is_never_chosen_however_cheap():
    """fp16 is 6x dearer but 0.02 lower with tight seeds: fp32 is shown worse, fp16 is chosen."""
    runs = study({"fp16-None": -0.02, "fp16-5.0": -0.02}, {"fp32": 0.01, "fp16": 0.06},
                 noise=0.001)
    dec = _decide(runs, 0.005)
    c = next(c for c in dec.choices if c.factors == (vocabulary.PRECISION,))
    assert c.status == ("worse", "within") and _chosen(dec, vocabulary.PRECISION) == "fp16"


def test_without_evidence_the_lowest_estimate_is_a_named_best_guess():
    """Seeds too noisy to show anything within the margin: the choice is the level with the
    lowest estimate (not the simpler or cheaper level whose estimate is also near it), and the
    guarantee calls it a best guess with its simultaneous bound and the seeds, at 80% power,
    that would show it within."""
    runs = study({"fp16-None": -0.004, "fp16-5.0": -0.004}, {"fp32": 0.01, "fp16": 0.011},
                 noise=0.01)
    dec = _decide(runs, 0.0005)
    c = next(c for c in dec.choices if c.factors == (vocabulary.PRECISION,))
    assert set(c.status) == {"open"} and not dec.guaranteed
    assert c.gap[c.chosen] == 0 and c.basis == winner.CHOSEN_LOWEST
    text = decision.guarantee(dec)
    assert "Best guess, not shown" in text and f"{c.upper[c.chosen]:.4f}" in text
    assert "the lowest estimate" in text
    line = next(x for x in decision.choice_lines(dec, analysed(runs, 0.0005)[1])
                if "Precision" in x)
    assert "best guess: the lowest estimate, nothing within 0.0005 of the best level even one " \
        "comparison at a time" in line
    assert re.search(r"; \d+ seeds would show it within with 80% power\)", line)
    near = replace(dec, choices=tuple(replace(x, basis=winner.CHOSEN_NEAR) for x in dec.choices))
    assert "each chosen level is within it of every other level one comparison at a time " \
        "(one-sided 97.5% each)" in decision.guarantee(near)  # alpha over the 2 choices


def test_cost_differences_inside_the_run_to_run_spread_do_not_decide():
    """Clip on is 5% cheaper on average, but runs of one config vary by ~10%: the same cost, so
    the simpler clip off wins. 50% cheaper is beyond the spread and decides. Zero spread is not
    certainty: a spread-free 5% counts only under a floor of 0 (``cost_tolerance``), not the
    default 10%; a spread-free 15% counts."""
    rng = np.random.default_rng(3)
    runs = study({}, {"fp32": 0.01, "fp16": 0.06}, noise=0.0002)
    noisy = runs.assign(step_time_median_s=runs["step_time_median_s"]
                        * np.exp(rng.normal(0, 0.1, len(runs))))
    cheaper = noisy["clip.enabled"]
    assert _chosen(_decide(noisy.assign(step_time_median_s=np.where(
        cheaper, noisy["step_time_median_s"] * 0.95, noisy["step_time_median_s"])), 0.005),
        vocabulary.CLIP) == "off"
    assert _chosen(_decide(noisy.assign(step_time_median_s=np.where(
        cheaper, noisy["step_time_median_s"] * 0.5, noisy["step_time_median_s"])), 0.005),
        vocabulary.CLIP) == "max_norm 5"

    def exact(share: float) -> pd.DataFrame:
        return runs.assign(step_time_median_s=np.where(
            runs["clip.enabled"], runs["step_time_median_s"] * share, runs["step_time_median_s"]))
    assert _chosen(_decide(exact(0.95), 0.005), vocabulary.CLIP) == "off"
    assert _chosen(_decide(exact(0.95), 0.005, tolerance=0.0), vocabulary.CLIP) == "max_norm 5"
    assert _chosen(_decide(exact(0.85), 0.005), vocabulary.CLIP) == "max_norm 5"


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


def test_margin_is_a_share_of_the_lowest_config_mean_or_loss_units():
    assert Margin.parse("5%").of(0.08) == pytest.approx(0.004)
    assert Margin.parse(0.002).of(0.08) == 0.002
    assert math.isnan(Margin.parse("5%").of(math.inf))  # no finite winner: no equivalence
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


def test_the_reports_equivalence_verdict_is_tost_at_alpha_not_twice_it():
    """A one-contrast family whose TOST p is 0.07: not equivalent at alpha = 0.05 (a TOST run
    at 2 alpha would call it so); 0.03 is."""
    base = factors.Effect(factor=vocabulary.CLIP, level="max_norm 5", reference="off", mean=0.001,
                          low=-0.002, high=0.004, p=0.5, p_equiv=0.07, df=4, sd_seed=0.002,
                          cells=1, seeds=5)
    [e] = factors._decide([base], 0.05, 0.8, 0.004)
    assert e.verdict == fx.UNDECIDED and e.p_equiv_holm == pytest.approx(0.07)
    [e] = factors._decide([replace(base, p_equiv=0.03)], 0.05, 0.8, 0.004)
    assert e.verdict == fx.EQUIVALENT


def test_alpha_is_split_over_the_choices_decided_together():
    """Each choice's MCB bounds spend alpha / (number of choices): one guarantee for all."""
    from stability.stats import best as mcb

    runs = study({"fp16-5.0": 0.003}, {"fp32": 0.01, "fp16": 0.06}, noise=0.003)
    dec = _decide(runs, 0.005)
    assert len(dec.choices) == 2
    d = factors.design(runs, aggregate(runs))
    table, fs = d.table, d.factors
    cube = factors.Cube.of(table, fs)
    for axis, c in enumerate(dec.choices):
        y = winner.joint(cube.loss, [axis], len(fs))
        split = mcb.mcb(mcb.pairwise(y), 0.005, 0.05 / len(dec.choices))
        whole = mcb.mcb(mcb.pairwise(y), 0.005, 0.05)
        assert c.upper == pytest.approx(tuple(split.upper))
        assert c.upper != pytest.approx(tuple(whole.upper))


def test_the_reports_margin_is_five_percent_of_the_lowest_config_mean():
    """``stages.weigh`` (what the report runs): 5% of the lowest of the 48 config means, which
    the decision and every simulation use, not of the median or the first config."""
    from stability.report import stages
    from stability.report.evidence.fetch import Sweep
    from stability.report.options import ReportConfig
    from tests.helpers.synthetic import planted, runs_table, studies

    y = studies(np.random.default_rng(5), 1, planted(accum=(0, 0.01, 0.03, 0.08)))[0]
    runs = runs_table(y)
    configs = aggregate(runs)
    fetched = stages.Fetched(sweep=Sweep("e", "0", "s", None), runs=runs, configs=configs,
                             set_aside=())
    margin = stages.weigh(None, fetched, ReportConfig()).margin
    means = configs["loss_mean"]
    assert margin == pytest.approx(0.05 * means.min())
    assert margin < 0.05 * means.median() - 1e-4


def test_the_cost_floor_has_one_default():
    """``stats.cost.FLOOR`` is the report's ``cost_tolerance`` default and the shipped one."""
    from pathlib import Path

    import yaml

    from stability.report.options import ReportConfig

    conf = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf" / "report.yaml")
                          .read_text())
    assert conf["cost_tolerance"] == ReportConfig().cost_tolerance == costs.FLOOR == 0.1
    assert to_report_config({"cost_tolerance": 0}).cost_tolerance == 0.0
