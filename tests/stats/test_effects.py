"""Factor effects and the helps / hurts / equivalent / undecided rule: error rates by simulation.

Synthetic studies have the default grid's shape (clip off/1/5/10 x accum 1/2/4/8 x fp32/bf16/
fp16 x 5 seeds = 240 runs) and its measured noise (``NOISE``, from the default study of
2026-12-01: see docs/report.md). Each test runs ``SIMS`` studies through
``effects.study_verdicts``, the vectorised form of the rule; ``test_the_report_runs_the_same_rule``
shows ``report.decide.factors.analyse`` (what report.md says) reaches identical numbers on one
study.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from stability.design import factors as vocabulary
from stability.report.decide import factors
from stability.report.decide.compare import versus_winner
from stability.report.decide.select import aggregate
from stability.stats import effects as fx
from stability.stats.paired import paired_power
from tests.helpers.synthetic import rate_ci

SIMS = 10_000
ALPHA = 0.05
CLIPS, ACCUMS, PRECISIONS, SEEDS = (None, 1.0, 5.0, 10.0), (1, 2, 4, 8), ("fp32", "bf16", "fp16"), 5
SHAPE = (len(CLIPS), len(ACCUMS), len(PRECISIONS), SEEDS)
MAINS = 3 + 3 + 2  # contrasts in the main-effect family
# Measured on the default study (240 runs, docs/report.md "Factor effects"): SD of a run's
# best val loss around its config mean and seed (the seed x config interaction), SD of the
# seed effect, and the typical loss (the lowest config mean) that sets the 5% margin.
NOISE = {"run": 0.0105, "seed": 0.0013, "loss": 0.0777}
MARGIN = 0.05 * NOISE["loss"]


def studies(rng: np.random.Generator, n: int, effect: np.ndarray | None = None,
            run: float = NOISE["run"], seed_by_clip: float = 0.0,
            tails: float = math.inf) -> np.ndarray:
    """``n`` synthetic studies: base + planted effects + seed + seed x clip + run noise.

    ``tails`` < inf draws the run noise from a Student t with that many df (scaled to ``run``).
    """
    y = NOISE["loss"] + (0.0 if effect is None else effect)
    y = y + rng.normal(0, NOISE["seed"], (n, 1, 1, 1, SEEDS))
    y = y + rng.normal(0, seed_by_clip, (n, len(CLIPS), 1, 1, SEEDS))
    if math.isinf(tails):
        noise = rng.normal(0, run, (n, *SHAPE))
    else:
        noise = rng.standard_t(tails, (n, *SHAPE)) * run / math.sqrt(tails / (tails - 2))
    return y + noise


def planted(clip: tuple = (0, 0, 0, 0), accum: tuple = (0, 0, 0, 0),
            precision: tuple = (0, 0, 0)) -> np.ndarray:
    """An additive effect array of the grid's shape (level 0 of each factor is the reference)."""
    return (np.asarray(clip)[:, None, None, None] + np.asarray(accum)[None, :, None, None]
            + np.asarray(precision)[None, None, :, None])


@pytest.mark.parametrize(("label", "kwargs"), [
    ("measured noise", {}),
    ("seed x clip interaction 0.5 x run noise", {"seed_by_clip": 0.5 * NOISE["run"]}),
    ("heavy tails (t, 3 df)", {"tails": 3.0}),
])
def test_no_effect_means_at_most_alpha_false_helps_or_hurts(label, kwargs):
    """Every factor without effect: a study with any helps/hurts is at most alpha (FWER)."""
    v = fx.study_verdicts(studies(np.random.default_rng(1), SIMS, **kwargs), 3, MARGIN, ALPHA)
    any_claim = np.isin(v.verdict, [fx.HELPS, fx.HURTS]).any(axis=-1)
    rate, low, high = rate_ci(int(any_claim.sum()), SIMS)
    print(f"{label}: false helps/hurts in {rate:.4f} of studies (95% CI {low:.4f}-{high:.4f})")
    assert high <= ALPHA  # the Clopper-Pearson upper bound: a rate above alpha fails
    # Holm over the 21 nearly independent interaction tests has an exact FWER of
    # 1 - (1 - alpha/21)^21 = 0.0488 here, which no feasible simulation separates from alpha by
    # its upper bound; the rate must not be shown above alpha (Holm off: ~0.66, fails).
    inter = (v.interaction_p_holm < ALPHA).any(axis=-1)
    assert rate_ci(int(inter.sum()), SIMS)[1] <= ALPHA


@pytest.mark.parametrize("sign", [1, -1])
def test_effects_at_the_margin_are_called_equivalent_at_most_alpha(sign):
    """Every contrast exactly at +-margin (the equivalence null): any "equivalent" <= alpha."""
    d = sign * MARGIN
    effect = planted(clip=(0, d, d, d), accum=(0, d, d, d), precision=(0, d, d))
    v = fx.study_verdicts(studies(np.random.default_rng(2), SIMS, effect), 3, MARGIN, ALPHA)
    any_equiv = (v.verdict == fx.EQUIVALENT).any(axis=-1)
    rate, low, high = rate_ci(int(any_equiv.sum()), SIMS)
    print(f"margin {d:+.4f}: false equivalent in {rate:.4f} (95% CI {low:.4f}-{high:.4f})")
    assert high <= ALPHA


def test_true_equivalence_is_found_when_the_noise_allows_it():
    """With no effect and a tenth of the noise, TOST calls every contrast equivalent."""
    v = fx.study_verdicts(studies(np.random.default_rng(3), 2_000, run=NOISE["run"] / 10), 3,
                          MARGIN, ALPHA)
    assert (v.verdict == fx.EQUIVALENT).mean() > 0.95


def test_a_planted_clipping_effect_is_found_with_the_power_the_report_states():
    """-0.006 at max_norm 5 only: found at least as often as the stated power says.

    The report states power at alpha / m (Holm's first step) from the SD of the per-seed
    means; here that SD is known: (2 run variance / cells) ** 0.5 for 12 cells.
    """
    effect = planted(clip=(0, 0, -0.006, 0))
    v = fx.study_verdicts(studies(np.random.default_rng(4), SIMS, effect), 3, MARGIN, ALPHA)
    found = v.verdict[:, 1] == fx.HELPS  # contrast order: max_norm 1, 5, 10; accum...; prec...
    sd_seed = math.sqrt(2 * NOISE["run"] ** 2 / (len(ACCUMS) * len(PRECISIONS)))
    stated = paired_power(0.006, sd_seed, SEEDS, ALPHA / MAINS)
    rate, low, high = rate_ci(int(found.sum()), SIMS)
    print(f"planted -0.006: found {rate:.4f} (95% CI {low:.4f}-{high:.4f}), stated {stated:.4f}")
    assert high >= stated  # never found less often than the report claims
    wrong = np.isin(v.verdict[:, [0, 2, 3, 4, 5, 6, 7]], [fx.HELPS, fx.HURTS]).any(axis=-1)
    assert rate_ci(int(wrong.sum()), SIMS)[2] <= ALPHA


def test_the_measured_default_study_effects_are_recovered():
    """The default study's pooled effects, planted: accumulation 8 is always found to hurt."""
    effect = planted(clip=(0, 0.0039, -0.0098, -0.0058), accum=(0, 0.008, 0.031, 0.085))
    v = fx.study_verdicts(studies(np.random.default_rng(5), 2_000, effect), 3, MARGIN, ALPHA)
    assert (v.verdict[:, 5] == fx.HURTS).mean() > 0.99  # accum 8
    assert (v.verdict[:, 4] == fx.HURTS).mean() > 0.8  # accum 4


def _runs(y: np.ndarray) -> pd.DataFrame:
    rows = []
    for (c, a, p, s), loss in np.ndenumerate(y):
        clip = CLIPS[c]
        fp = f"{clip}-{ACCUMS[a]}-{PRECISIONS[p]}"
        rows.append({"run_id": f"{fp}-{s}", "fingerprint": fp, "seed": s, "outcome": "finished",
                     "best_val_loss": loss, "precision.name": PRECISIONS[p],
                     "clip.enabled": clip is not None, "clip.method": "norm",
                     "clip.max_norm": clip or 1.0, "train.accum_steps": ACCUMS[a],
                     "wall_time_s": 1.0, "skip_count": 0})
    return pd.DataFrame(rows)


def test_the_report_runs_the_same_rule():
    """``factors.analyse`` on one study's runs = ``study_verdicts`` on its array, contrast by
    contrast: the simulated rule is the report's rule."""
    effect = planted(clip=(0, 0, -0.02, 0), accum=(0, 0, 0, 0.08))
    y = studies(np.random.default_rng(6), 1, effect)[0]
    runs = _runs(y)
    configs = versus_winner(runs, aggregate(runs))
    an = factors.analyse(runs, configs, MARGIN)
    v = fx.study_verdicts(y, 3, MARGIN, ALPHA)
    assert [f.name for f in an.factors] == [vocabulary.CLIP, vocabulary.ACCUM, vocabulary.PRECISION]
    assert [e.level for e in an.main] == ["max_norm 1", "max_norm 5", "max_norm 10", "2", "4",
                                          "8", "bf16", "fp16"]
    assert [e.mean for e in an.main] == pytest.approx(list(v.mean))
    assert [e.p_holm for e in an.main] == pytest.approx(list(v.p_holm))
    assert [e.p_equiv_holm for e in an.main] == pytest.approx(list(v.p_equiv_holm))
    assert [e.verdict for e in an.main] == list(v.verdict)
    assert [e.p_holm for e in an.interactions] == pytest.approx(list(v.interaction_p_holm))
    assert an.main[5].verdict == fx.HURTS and an.main[5].cells == 12 and an.main[5].seeds == 5


def test_an_unfinished_run_is_counted_at_the_worst_loss_and_blocks_equivalence():
    """A diverged run is not dropped: it enters at the study's worst finished loss, its level
    shows the count, and its contrast cannot be called equivalent."""
    effect = planted(accum=(0, 0, 0, 0.085))
    y = studies(np.random.default_rng(7), 1, effect, run=NOISE["run"] / 10)[0]
    runs = _runs(y)
    hit = runs.index[(runs["fingerprint"] == "None-1-fp16") & (runs["seed"] == 0)][0]
    runs.loc[hit, "outcome"] = "diverged"
    configs = versus_winner(runs, aggregate(runs))
    an = factors.analyse(runs, configs, MARGIN)
    fp16 = next(e for e in an.main if e.level == "fp16")
    bf16 = next(e for e in an.main if e.level == "bf16")
    assert fp16.unfinished == (1, 0) and fp16.runs == 160 and bf16.unfinished == (0, 0)
    assert bf16.verdict == fx.EQUIVALENT and fp16.verdict != fx.EQUIVALENT
    worst = runs.loc[runs["outcome"] == "finished", "best_val_loss"].max()
    lifted = (worst - runs.loc[hit, "best_val_loss"]) / (16 * SEEDS)  # one of 16 x 5 differences
    assert lifted > 0.0009  # the diverged run's cell is at accum 1: the worst loss is accum 8's
    assert fp16.mean - bf16.mean == pytest.approx(lifted, abs=0.0004)


def test_holm_matches_the_scalar_version():
    """The vectorised Holm equals the per-list Holm of ``stability.stats.paired``."""
    from stability.stats.paired import holm as holm_list

    p = np.random.default_rng(8).uniform(0, 0.2, (50, 7))
    p[3, 2] = math.nan
    expected = [holm_list(row) for row in p]
    np.testing.assert_allclose(fx.holm(p), expected, equal_nan=True)
