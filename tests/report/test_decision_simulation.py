"""The decision's error rates, by simulation through the code the report runs.

Studies of the default grid's shape (tests/helpers/synthetic.py) go through
``report.winner.level_choice`` (what ``winner.decide`` calls for each factor) and
``compare.selected`` (what every winner-vs-X p-value goes through); ``test_the_report_path_*``
shows ``winner.decide`` and ``compare.comparisons`` on the runs table reach the same choices and
p-values, with unfinished runs, missing and extra seeds. Every rate is asserted through its
two-sided 95% Clopper-Pearson upper bound: a rule whose true rate is above alpha fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from stability.design import factors as vocabulary
from stability.report import compare, factors, winner
from stability.report.select import aggregate, per_seed, put_first
from stability.stats import best as mcb
from stability.stats import effects as fx
from stability.stats.paired import paired
from tests.helpers.synthetic import (
    ACCUMS,
    CLIPS,
    MARGIN,
    NOISE,
    PRECISIONS,
    fingerprint,
    planted,
    rate_ci,
    real_noise,
    run_seconds,
    runs_table,
    studies,
)

ALPHA = 0.05
SIMS = 6_000
LEVELS = (len(CLIPS), len(ACCUMS), len(PRECISIONS))
SIMPLE = ([0, 1, 1, 1], [0, 1, 2, 3], [0, 1, 2])  # winner.simplicity of each factor's levels
SECONDS = run_seconds(np.random.default_rng(0), 1)  # each precision's cost, no noise


def decide_batch(y: np.ndarray, delta: float | np.ndarray = MARGIN, alpha: float = ALPHA,
                 seconds: np.ndarray = SECONDS):
    """Each factor decided on its own (no interaction detected), as ``winner.decide`` does:
    alpha split over the 3 choices."""
    out = []
    for axis in range(3):
        b, mean, pick = winner.level_choice(y, 3, [axis], delta, alpha / 3, seconds,
                                            np.array(SIMPLE[axis]))
        out.append((b, mean, pick))
    return out


def test_the_guarantee_holds_at_the_least_favourable_effects():
    """Every non-best level exactly just past the margin: any of them called "within" is an
    error. The rate over all 3 factors at once is at most alpha."""
    gap = 1.001 * MARGIN
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
        wrong |= chosen_within & (gap[pick] > MARGIN)
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
        dec = winner.decide(runs, configs, an, MARGIN)
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
    configs = put_first(configs, winner.decide(runs, configs, an, MARGIN).fingerprint)
    configs = compare.versus_winner(runs, configs, compare.Criteria(margin=MARGIN))
    found = compare.comparisons(runs, configs, compare.Criteria(margin=MARGIN))
    assert found and any(c.question.endswith("lowest mean") for c in found) \
        or configs.iloc[0]["rank"] == 1
    for c in found:
        raw = paired(per_seed(runs, c.reference_fp), per_seed(runs, c.other_fp)).p_t
        assert c.p_adj == pytest.approx(min(1.0, raw * 48 * 47 / 2))
    assert fingerprint(0, 0, 0) in set(configs["fingerprint"])


# The scenarios of the decision audit (main 7250b77): the README's effects (clip off 0.0068
# worse than max_norm 5), the same effects on the measured study's own covariance, every
# max_norm helping by 0.01, the global null, and a scan of the gap between clip off and the
# max_norm levels. ``far``: the chosen clipping level is truly more than the margin worse than
# the best; ``regret``: how much worse it truly is. Bounds: the Clopper-Pearson upper bound of
# ``far`` and the 95% upper bound of the mean regret (normal, 3,000 studies) must not exceed
# the rate and regret the docs state (docs/report.md, "The decision"). The rule they replace
# ("cheapest not shown worse") had 0.72 / 0.0050 on the first row.
README_EFFECTS = {"accum": (0, 0.0103, 0.0324, 0.0832), "precision": (0, 0.0002, 0.0011)}
SCENARIOS = [  # (name, clip effects, noise, stated P(far), stated regret)
    ("README effects", (0, 0.0062, -0.0068, -0.0053), "iid", 0.05, 0.0007),
    ("README effects, the study's covariance", (0, 0.0062, -0.0068, -0.0053), "real", 0.005,
     0.0004),
    ("every max_norm helps by 0.01", (0, -0.01, -0.01, -0.01), "iid", 0.005, 0.0001),
    *((f"gap {g}", (0, -g, -g, -g), "iid", far, regret) for g, far, regret in (
        (0.004, 0.25, 0.0010), (0.006, 0.04, 0.00025), (0.008, 0.005, 0.00005),
        (0.010, 0.002, 0.00002), (0.015, 0.002, 0.00002))),
]


def _clip_choice(clip: tuple, noise: str, sims: int = 3_000, seed: int = 21):
    """The chosen clipping level of ``sims`` studies and its true gap to the best level."""
    rng = np.random.default_rng(seed)
    effect = planted(clip=clip, **README_EFFECTS)
    y = (studies(rng, sims, effect) if noise == "iid"
         else NOISE["loss"] + effect + real_noise(rng, sims))
    b, _, pick = decide_batch(y)[0]
    true = effect.mean(axis=(1, 2, 3))
    return b, pick, (true - true.min())[pick]


@pytest.mark.parametrize(("name", "clip", "noise", "stated_far", "stated_regret"), SCENARIOS,
                         ids=[s[0] for s in SCENARIOS])
def test_the_choice_follows_the_evidence_when_nothing_is_shown_within(name, clip, noise,
                                                                        stated_far, stated_regret):
    b, pick, gap = _clip_choice(clip, noise)
    far = gap > MARGIN
    rate, low, high = rate_ci(int(far.sum()), len(far))
    regret_high = gap.mean() + 1.96 * gap.std(ddof=1) / np.sqrt(len(gap))
    shown = np.mean(np.take_along_axis(b.status, pick[:, None], -1)[:, 0] == mcb.WITHIN)
    print(f"{name}: P(chosen clipping > margin worse) {rate:.4f} (95% CI {low:.4f}-{high:.4f}), "
          f"regret {gap.mean():.5f} (upper {regret_high:.5f}); shown within in {shown:.3f}")
    assert high <= stated_far
    assert regret_high <= stated_regret


def test_under_the_global_null_the_simplest_level_is_kept():
    """No effect anywhere: every level is as good, and the choice is clip off (the simplest)
    in at least 90% of studies; an argmin of the level means would take it in 25%."""
    y = studies(np.random.default_rng(22), 3_000)
    _, _, pick = decide_batch(y)[0]
    kept = pick == 0
    rate, low, high = rate_ci(int(kept.sum()), len(kept))
    print(f"global null: clip off kept in {rate:.4f} (95% CI {low:.4f}-{high:.4f})")
    assert low >= 0.9


@pytest.mark.parametrize("effect", ["README effects", "global null"])
def test_noise_in_the_measured_cost_does_not_flip_the_choice(effect):
    """Per-run training seconds with 6% log-normal noise (the precision's cost otherwise):
    the chosen config is the one the noise-free costs choose in at least 95% of studies."""
    rng = np.random.default_rng(23)
    planted_effect = planted(clip=(0, 0.0062, -0.0068, -0.0053), **README_EFFECTS) \
        if effect == "README effects" else None
    y = studies(rng, 3_000, planted_effect)
    clean = [p for _, _, p in decide_batch(y)]
    noisy = [p for _, _, p in decide_batch(y, seconds=run_seconds(rng, 3_000, 0.06))]
    flip = np.any([a != b for a, b in zip(clean, noisy, strict=True)], axis=0)
    rate, low, high = rate_ci(int(flip.sum()), len(flip))
    print(f"{effect}: 6% cost noise flips the chosen config in {rate:.4f} "
          f"(95% CI {low:.4f}-{high:.4f})")
    assert high <= 0.05
