"""The decision's error rates, by simulation through the code the report runs.

Studies of the default grid's shape (tests/helpers/synthetic.py) go through
``report.decide.winner.level_choice`` (what ``winner.decide`` calls for each factor) at the margin
the report computes in each study (5% of its lowest config mean, ``design.Margin.lowest``; a level's
truth is judged against 5% of the true lowest config mean), and
``compare.selected`` (what every winner-vs-X p-value goes through); ``test_the_report_path_*``
shows ``winner.decide`` and ``compare.comparisons`` on the runs table reach the same choices and
p-values, with unfinished runs, missing and extra seeds. Every rate is asserted through its
two-sided 95% Clopper-Pearson upper bound: a rule whose true rate is above alpha fails. The
choice's scenarios, its cost and the seeds it prints: tests/report/test_decision_choice.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from stability.design import factors as vocabulary
from stability.report.decide import compare, factors, winner
from stability.report.decide.select import aggregate, per_seed, put_first
from stability.stats import best as mcb
from stability.stats import effects as fx
from stability.stats.paired import paired
from tests.helpers.synthetic import (
    ACCUMS,
    CLIPS,
    MARGIN,
    NOISE,
    PRECISIONS,
    decide_batch,
    fingerprint,
    planted,
    rate_ci,
    run_seconds,
    runs_table,
    studies,
    true_margin,
)

ALPHA = 0.05
SIMS = 6_000
LEVELS = (len(CLIPS), len(ACCUMS), len(PRECISIONS))
SECONDS = run_seconds(np.random.default_rng(0), 1)  # each precision's cost, no noise


def test_the_guarantee_holds_at_the_least_favourable_effects():
    """Every non-best level exactly just past the margin: any of them called "within" is an
    error. The rate over all 3 factors at once is at most alpha. The report's margin is 5% of
    the lowest of 48 noisy means, lower than the true one here, so it errs towards caution."""
    gap = 1.001 * MARGIN
    assert true_margin(None) == pytest.approx(MARGIN)  # the best config's true mean is the base
    effect = planted(clip=(gap, gap, 0, gap), accum=(0, gap, gap, gap), precision=(gap, 0, gap))
    y = studies(np.random.default_rng(11), SIMS, effect)
    truth = [np.array([1, 1, 0, 1]), np.array([0, 1, 1, 1]), np.array([1, 0, 1])]
    wrong = np.zeros(SIMS, dtype=bool)
    for (b, _, _), far in zip(decide_batch(y), truth, strict=True):
        wrong |= ((b.status == mcb.WITHIN) & far.astype(bool)).any(axis=-1)
    rate, low, high = rate_ci(int(wrong.sum()), SIMS)
    print(f"least favourable: a level past the margin called within in {rate:.4f} "
          f"(95% CI {low:.4f}-{high:.4f})")
    assert high <= ALPHA


@pytest.mark.parametrize(("label", "kwargs"), [
    ("additive, measured noise", {}),
    ("unequal noise per config", {"run": np.broadcast_to(
        np.array([1.6, 1.0, 0.6])[None, None, :] * NOISE["run"], LEVELS)}),
    ("seed x clip interaction", {"seed_by_clip": 0.5 * NOISE["run"]}),
])
def test_the_chosen_config_is_within_the_margin_of_the_best_as_the_guarantee_says(label, kwargs):
    """Planted effects like the default study's, plus a clip x precision interaction: each
    level chosen as "within" is truly within the margin of its factor's best (pooled over the
    other factors) in at least 1 - alpha of the studies."""
    effect = planted(clip=(0, 0.0039, -0.0098, -0.0058), accum=(0, 0.008, 0.031, 0.085),
                     precision=(0, 0.0014, -0.0006))
    effect = effect + np.array([0, 0, 0.004, 0])[:, None, None, None] * \
        np.array([0, -1, 1])[None, None, :, None]  # clip 5 helps less with fp16, more with bf16
    y = studies(np.random.default_rng(12), SIMS, effect, **kwargs)
    wrong = np.zeros(SIMS, dtype=bool)
    for axis, (b, _, pick) in enumerate(decide_batch(y)):
        true = effect.mean(axis=tuple(a for a in range(4) if a != axis))
        gap = true - true.min()
        chosen_within = np.take_along_axis(b.status, pick[:, None], -1)[:, 0] == mcb.WITHIN
        wrong |= chosen_within & (gap[pick] > true_margin(effect))
    rate, low, high = rate_ci(int(wrong.sum()), SIMS)
    print(f"{label}: chosen level past the margin in {rate:.4f} (95% CI {low:.4f}-{high:.4f})")
    assert high <= ALPHA


def _pair_p(y: np.ndarray, a: tuple, b: tuple) -> np.ndarray:
    """The paired t p-value of config ``b`` vs ``a`` in every study (``compare``'s test)."""
    d = y[(slice(None), *b)] - y[(slice(None), *a)]
    return fx.p_two_sided(fx.estimate(d[:, None, :]))


def test_no_claim_about_the_winner_under_a_global_null():
    """No effect anywhere: "the winner helps / hurts vs X" (baseline, best of each precision,
    lowest mean) in at most alpha of the studies; today's unadjusted test said so in 21%."""
    y = studies(np.random.default_rng(13), SIMS)
    picks = [p for _, _, p in decide_batch(y)]
    family = compare.selection_family(np.zeros(int(np.prod(LEVELS))))
    means = y.mean(axis=-1).reshape(SIMS, -1)
    claims = np.zeros(SIMS, dtype=bool)
    for i in range(SIMS):
        win = tuple(int(p[i]) for p in picks)
        flat = np.unravel_index(np.argmin(means[i]), LEVELS)
        others = [(0, 0, 0), tuple(int(x) for x in flat)]
        for pi in range(len(PRECISIONS)):
            block = y[i, :, :, pi].mean(axis=-1)
            c, a = np.unravel_index(np.argmin(block), block.shape)
            others.append((int(c), int(a), pi))
        ps = [float(_pair_p(y[i:i + 1], win, o)[0]) for o in set(others) if o != win]
        claims[i] = any(compare.selected(p, family) < ALPHA for p in ps)
    rate, low, high = rate_ci(int(claims.sum()), SIMS)
    print(f"global null: a winner claim in {rate:.4f} (95% CI {low:.4f}-{high:.4f})")
    assert high <= ALPHA


def test_the_report_path_reaches_the_same_choices_with_unfinished_missing_and_extra_seeds():
    """``winner.decide`` on the runs table = the batch rule on the same numbers, with a
    diverged run (at the study's worst loss), a missing run and a sixth seed on one config;
    an extra seed costs no main effect, and the winner has every seed finished."""
    rng = np.random.default_rng(14)
    effect = planted(clip=(0, 0.0039, -0.0098, -0.0058), accum=(0, 0.008, 0.031, 0.085))
    for _ in range(8):
        y = studies(rng, 1, effect)[0]
        extra = np.full(y.shape[:-1] + (1,), np.nan)
        extra[2, 0, 0, 0] = y[2, 0, 0].mean()  # seed 5, on one config only
        y6 = np.concatenate([y, extra], axis=-1)
        runs = runs_table(y6, outcome={(2, 0, 0, 1): "diverged"}, drop={(1, 1, 1, 3)})
        configs = aggregate(runs)
        an = factors.analyse(runs, configs, MARGIN)
        assert len(an.main) == 8  # the sixth seed drops nothing
        dec = winner.decide(runs, configs, an, winner.Settings(margin=MARGIN))
        assert dec.fingerprint is not None
        row = configs.set_index("fingerprint").loc[dec.fingerprint]
        assert row["seeds_diverged"] + row["seeds_failed"] == 0
        # the same numbers as arrays: the diverged run at the worst finished loss
        arr = y6.copy()
        arr[1, 1, 1, 3] = np.nan
        arr[2, 0, 0, 1] = runs.loc[runs["outcome"] == "finished", "best_val_loss"].max()
        batch = decide_batch(arr[None], MARGIN, seconds=np.broadcast_to(
            SECONDS[..., :1], arr[None].shape))
        grouped = {c.factors for c in dec.choices}
        for axis, (b, _, pick) in enumerate(batch):
            name = (vocabulary.CLIP, vocabulary.ACCUM, vocabulary.PRECISION)[axis]
            if (name,) not in grouped:
                continue  # decided jointly in this study: not the single-factor rule
            c = next(c for c in dec.choices if c.factors == (name,))
            assert c.upper == pytest.approx(tuple(b.upper[0]))
            assert c.preferred == int(pick[0])


def test_the_report_path_adjusts_every_winner_comparison_the_same_way():
    """``compare.comparisons`` p-values = the paired t p times the pairs of configs."""
    y = studies(np.random.default_rng(15), 1)[0]
    runs = runs_table(y)
    configs = aggregate(runs)
    an = factors.analyse(runs, configs, MARGIN)
    dec = winner.decide(runs, configs, an, winner.Settings(margin=MARGIN))
    configs = put_first(configs, dec.fingerprint)
    configs = compare.versus_winner(runs, configs, compare.Criteria(margin=MARGIN))
    found = compare.comparisons(runs, configs, compare.Criteria(margin=MARGIN))
    assert found and any(c.question.endswith("lowest mean") for c in found) \
        or configs.iloc[0]["rank"] == 1
    for c in found:
        raw = paired(per_seed(runs, c.reference_fp), per_seed(runs, c.other_fp)).p_t
        assert c.p_adj == pytest.approx(min(1.0, raw * 48 * 47 / 2))
    assert fingerprint(0, 0, 0) in set(configs["fingerprint"])
