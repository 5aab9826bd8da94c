"""Adaptive seeds (``stats.sequential``): error rates across looks and contrasts, by simulation.

Synthetic studies have the default grid's shape (clip 4 x accum 4 x precision 3 levels) and its
measured noise (the same model as ``stats/test_effects.py``). Each case runs ``SIMS`` adaptive
studies through ``sequential.run``, the rule the sweep's strategy runs on one study.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from stability.stats import sequential as sq

SIMS = 10_000
ALPHA = 0.05
LEVELS = (4, 4, 3)
NOISE = {"run": 0.0105, "seed": 0.0013, "loss": 0.0777}  # the default study, 2026-12-01
MARGIN = 0.05 * NOISE["loss"]
PLAN = sq.Plan()


def studies(rng: np.random.Generator, n: int, seeds: int, effect: np.ndarray | float = 0.0,
            seed_by_clip: float = 0.0) -> np.ndarray:
    """``n`` complete synthetic studies ``[n, clip, accum, precision, seed]``."""
    y = NOISE["loss"] + effect + rng.normal(0, NOISE["seed"], (n, 1, 1, 1, seeds))
    y = y + rng.normal(0, seed_by_clip, (n, LEVELS[0], 1, 1, seeds))
    return y + rng.normal(0, NOISE["run"], (n, *LEVELS, seeds))


def planted(clip=(0, 0, 0, 0), accum=(0, 0, 0, 0), precision=(0, 0, 0)) -> np.ndarray:
    """An additive effect array of the grid's shape (level 0 is each factor's reference)."""
    return (np.asarray(clip)[:, None, None] + np.asarray(accum)[None, :, None]
            + np.asarray(precision)[None, None, :])[..., None]  # a seed axis to broadcast


def rate_ci(hits: int, n: int) -> tuple[float, float, float]:
    ci = stats.binomtest(hits, n).proportion_ci(0.95)
    return hits / n, ci.low, ci.high


def test_the_plan_spends_alpha_over_its_looks_and_rejects_bad_values_at_once() -> None:
    assert PLAN.looks == (3, 5, 7, 9)
    assert PLAN.spend.sum() == pytest.approx(ALPHA)
    assert np.all(PLAN.spend > 0)
    assert sq.Plan(n0=3, step=4, max_seeds=9).looks == (3, 7, 9)
    with pytest.raises(ValueError, match=r"n0=1: .*; step=0: .*; alpha=2: .*") as err:
        sq.Plan(n0=1, step=0, alpha=2)
    assert "allowed values" in str(err.value)


@pytest.mark.parametrize(("label", "kwargs", "runs"), [
    ("measured noise", {}, 272),
    ("seed x clip interaction 0.5 x run noise", {"seed_by_clip": 0.5 * NOISE["run"]}, 259),
])
def test_no_effect_means_at_most_alpha_false_helps_or_hurts_over_all_looks(label, kwargs, runs):
    """Error held over the looks, and the runs the rule costs pinned (measured 2026-12-02,
    seed 11): futility removed costs about 430 runs instead of 272 and fails here."""
    y = studies(np.random.default_rng(11), SIMS, PLAN.max_seeds, **kwargs)
    state, seeds = sq.run(y, PLAN, MARGIN, LEVELS)
    claims = np.isin(state.verdict, [sq.HELPS, sq.HURTS]).any(axis=-1)
    rate, low, high = rate_ci(int(claims.sum()), SIMS)
    print(f"{label}: false helps/hurts in {rate:.4f} of adaptive studies "
          f"(95% CI {low:.4f}-{high:.4f}); runs {seeds.sum(axis=(1, 2, 3)).mean():.0f}")
    assert high <= ALPHA  # the Clopper-Pearson upper bound
    assert seeds.sum(axis=(1, 2, 3)).mean() == pytest.approx(runs, rel=0.02)


@pytest.mark.parametrize("sign", [1, -1])
def test_effects_at_the_margin_are_called_equivalent_at_most_alpha(sign: int) -> None:
    effect = planted(clip=(0, *(3 * [sign * MARGIN])), accum=(0, *(3 * [sign * MARGIN])),
                     precision=(0, sign * MARGIN, sign * MARGIN))
    # Additive: every level lies exactly one margin from its factor's reference.
    y = studies(np.random.default_rng(12 + sign), SIMS, PLAN.max_seeds, effect)
    state, _ = sq.run(y, PLAN, MARGIN, LEVELS)
    rate, low, high = rate_ci(int((state.verdict == sq.EQUIVALENT).any(axis=-1).sum()), SIMS)
    print(f"every contrast at {sign:+d} margin: false 'equivalent' in {rate:.4f} "
          f"(95% CI {low:.4f}-{high:.4f})")
    assert high <= ALPHA  # the Clopper-Pearson upper bound


def test_a_level_that_hurts_leaves_the_study_and_its_cells_stop_getting_seeds() -> None:
    effect = planted(accum=(0, 0, 0, 0.2))  # accum 8 far worse in every cell
    y = studies(np.random.default_rng(3), 200, PLAN.max_seeds, effect)
    state, seeds = sq.run(y, PLAN, MARGIN, LEVELS)
    j = sq.contrasts(LEVELS).index((1, 3))
    assert np.all(state.verdict[:, j] == sq.HURTS)
    assert np.all(state.decided_at[:, j] == 1)
    assert not state.alive[1][:, 3].any()
    assert np.all(seeds[:, :, 3, :] == PLAN.n0)  # every accum-8 config ran the first round only
    assert seeds[:, :, :3, :].max() > PLAN.n0  # the others were seeded on where still open


def test_the_rule_is_a_pure_function_of_the_results_it_read() -> None:
    """Replaying the looks on the same data plans the same runs, and unread runs don't matter."""
    rng = np.random.default_rng(4)
    y = studies(rng, 50, PLAN.max_seeds, planted(clip=(0, 0.004, -0.01, -0.006),
                                                  accum=(0, 0.008, 0.031, 0.085)))
    first, seeds = sq.run(y, PLAN, MARGIN, LEVELS)
    again, seeds_again = sq.run(y.copy(), PLAN, MARGIN, LEVELS)
    np.testing.assert_array_equal(first.verdict, again.verdict)
    np.testing.assert_array_equal(seeds, seeds_again)
    never_run = np.arange(PLAN.max_seeds) >= seeds[..., None]
    scrambled = np.where(never_run, np.nan, y)
    third, seeds_third = sq.run(scrambled, PLAN, MARGIN, LEVELS)
    np.testing.assert_array_equal(first.verdict, third.verdict)
    np.testing.assert_array_equal(seeds, seeds_third)


def test_the_default_studys_effects_operating_characteristics() -> None:
    """With the default study's measured pooled effects planted on homogeneous noise: what the
    adaptive rule decides and spends, beside the fixed 5-seed grid. (The study's own covariance
    is in ``stats/test_adaptive_default.py``, the numbers docs/sweeps.md quotes.)"""
    from stability.stats import effects as fx

    effect = planted(clip=(0, 0.0065, -0.0069, -0.0056), accum=(0, 0.0074, 0.0291, 0.0820),
                     precision=(0, 0.0010, 0.0015))
    state, seeds = sq.run(studies(np.random.default_rng(21), SIMS, PLAN.max_seeds, effect),
                          PLAN, MARGIN, LEVELS)
    fixed = fx.study_verdicts(studies(np.random.default_rng(22), SIMS, 5, effect), 3, MARGIN,
                              ALPHA)
    adaptive_decided = (state.verdict != sq.UNDECIDED).mean(axis=0)
    fixed_decided = (fixed.verdict != fx.UNDECIDED).mean(axis=0)
    runs = seeds.sum(axis=(1, 2, 3))
    print("adaptive P(decided)", np.round(adaptive_decided, 3), "runs", runs.mean())
    print("fixed    P(decided)", np.round(fixed_decided, 3), "runs", 5 * np.prod(LEVELS))
    # The large accum effects are decided by both designs.
    assert adaptive_decided[4] > 0.99 and adaptive_decided[5] > 0.99
