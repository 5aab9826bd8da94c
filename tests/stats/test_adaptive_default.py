"""The adaptive rule on the default study's own numbers, beside the fixed 5-seed design.

The model is the measured study itself (``tests/data/default_study_runs.csv``: its 240 runs,
2026-12-01, sweep 20261201-173935-58fe04, 48 configs x seeds 0-4, all finished). The truth is
each config's mean; a synthetic seed is the truth plus a draw from the runs' empirical
covariance across the 48 configs (``sum_s z_s r_s / 2`` over the five residual vectors ``r_s``,
``z ~ N(0, 1)``): a seed moves every config at once as the real seeds did, so the contrasts keep
their measured spread (clip 10 vs off: per-seed SD 0.0008; accum 8: 0.010). The fixed design
is simulated from the same model, so "the same decisions" is a like-for-like comparison.
Costs are each config's measured mean ``wall_time_s`` (one core per run).

What this shows (docs/sweeps.md quotes it): round 1 alone is 144 runs, 60% of the fixed
grid's 240, so "<= 50% of the compute" is out of reach with 48 configs and ``n0 >= 3``; the
adaptive study spends about as much as the fixed one. And once accum 4 and 8 leave (decided
hurts at the first look), the clipping contrasts are averaged over accum 1 and 2 only, where
max_norm 1 no longer hurts (+0.0005, against +0.0065 over every accum): the adaptive study
answers "what does clipping do among the settings still worth using", a different question
from the fixed study's, and reaches the fixed study's clipping verdicts less often.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from stability.stats import effects as fx
from stability.stats import sequential as sq

SIMS = 10_000
ALPHA = 0.05
CLIPS, ACCUMS, PRECISIONS = ("off", "1", "5", "10"), (1, 2, 4, 8), ("fp32", "bf16", "fp16")
LEVELS = (4, 4, 3)
PLAN = sq.Plan()
FIXED_SEEDS = 5
# The fixed study's verdicts (report of sweep 20261201-173935-58fe04, /docs "Factor effects").
FIXED_STUDY = ("hurts", "undecided", "helps", "undecided", "hurts", "hurts", "undecided",
               "undecided")


def measured() -> tuple[np.ndarray, np.ndarray]:
    """The study's runs as ``loss[clip, accum, precision, seed]`` and mean seconds per config."""
    df = pd.read_csv(Path(__file__).parents[1] / "data" / "default_study_runs.csv",
                     dtype={"max_norm": str})
    y, secs = np.full((*LEVELS, 5), np.nan), np.zeros(LEVELS)
    for r in df.itertuples():
        at = (CLIPS.index(r.max_norm), ACCUMS.index(r.accum), PRECISIONS.index(r.precision))
        y[at + (r.seed,)] = r.best_val_loss
        secs[at] += r.wall_time_s / 5
    assert np.isfinite(y).all()
    return y, secs


def synthetic(y: np.ndarray, rng: np.random.Generator, n: int, seeds: int,
              truth: np.ndarray | None = None) -> np.ndarray:
    """``n`` studies ``[n, levels..., seeds]``: the truth plus the runs' empirical covariance."""
    mean = y.mean(axis=-1)
    resid = y - mean[..., None]
    z = rng.normal(size=(n, seeds, y.shape[-1]))
    noise = np.einsum("nsk,...k->n...s", z, resid) / math.sqrt(y.shape[-1] - 1)
    return (mean if truth is None else truth)[None, ..., None] + noise


def rate(hits: np.ndarray) -> tuple[float, float, float]:
    ci = stats.binomtest(int(hits.sum()), hits.size).proportion_ci(0.95)
    return float(hits.mean()), ci.low, ci.high


def mean_ci(x: np.ndarray) -> tuple[float, float, float]:
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def test_the_model_is_the_measured_study() -> None:
    y, _ = measured()
    margin = 0.05 * y.mean(axis=-1).min()  # report.margin: 5% of the lowest config mean
    v = fx.study_verdicts(y, 3, margin, ALPHA)
    assert tuple(v.verdict) == FIXED_STUDY  # the report's factor verdicts, recomputed
    np.testing.assert_allclose(v.mean, [0.0065, -0.0069, -0.0056, 0.0074, 0.0291, 0.0820,
                                        0.0010, 0.0015], atol=5e-5)


def test_no_effect_with_the_measured_covariance_keeps_the_family_wise_error() -> None:
    y, _ = measured()
    flat = np.full(LEVELS, y.mean())
    margin = 0.05 * y.mean(axis=-1).min()
    state, _ = sq.run(synthetic(y, np.random.default_rng(40), SIMS, PLAN.max_seeds, flat), PLAN,
                      margin, LEVELS)
    r, low, high = rate(np.isin(state.verdict, [sq.HELPS, sq.HURTS]).any(axis=-1))
    print(f"null, measured covariance: adaptive false helps/hurts {r:.4f} ({low:.4f}-{high:.4f})")
    assert r <= ALPHA + 2 * math.sqrt(ALPHA * (1 - ALPHA) / SIMS)


def test_the_measured_effects_adaptive_against_the_fixed_five_seeds() -> None:
    y, secs = measured()
    margin = 0.05 * y.mean(axis=-1).min()
    state, seeds = sq.run(synthetic(y, np.random.default_rng(41), SIMS, PLAN.max_seeds), PLAN,
                          margin, LEVELS)
    fixed = fx.study_verdicts(synthetic(y, np.random.default_rng(42), SIMS, FIXED_SEEDS), 3,
                              margin, ALPHA)
    names = [f"{['clip', 'accum', 'precision'][i]} {(CLIPS, ACCUMS, PRECISIONS)[i][a]}"
             for i, a in sq.contrasts(LEVELS)]
    same_adaptive, same_fixed = [], []
    for j, name in enumerate(names):
        word = FIXED_STUDY[j]
        a = rate(np.array([sq.VERDICTS[v] for v in state.verdict[:, j]]) == word)
        f = rate(fixed.verdict[:, j] == word)
        same_adaptive.append(a)
        same_fixed.append(f)
        decided = rate(state.verdict[:, j] != sq.UNDECIDED)
        print(f"{name:>14} fixed study: {word:>9}; same verdict adaptive {a[0]:.3f} "
              f"({a[1]:.3f}-{a[2]:.3f}), fixed-5 {f[0]:.3f} ({f[1]:.3f}-{f[2]:.3f}); adaptive "
              f"decided {decided[0]:.3f}, given up {state.futile[:, j].mean():.3f}")
    runs = seeds.sum(axis=(1, 2, 3)).astype(float)
    cpu = (seeds * secs).sum(axis=(1, 2, 3)) / (FIXED_SEEDS * secs.sum())
    fixed_runs = FIXED_SEEDS * math.prod(LEVELS)
    r, c = mean_ci(runs), mean_ci(cpu)
    print(f"runs: adaptive {r[0]:.1f} ({r[1]:.1f}-{r[2]:.1f}) vs fixed {fixed_runs}; "
          f"CPU-seconds adaptive / fixed {c[0]:.3f} ({c[1]:.3f}-{c[2]:.3f}); 5-95% runs "
          f"{np.percentile(runs, 5):.0f}-{np.percentile(runs, 95):.0f}")

    first_round = math.prod(LEVELS) * PLAN.n0
    assert runs.min() >= first_round > 0.5 * fixed_runs  # round 1 alone is over half the grid
    assert c[1] > 0.5  # the <= 50% compute goal is not met, with its CI
    # accum 4 and 8 hurt at the first look in (almost) every study, as in the fixed design
    assert same_adaptive[4][1] > 0.99 and same_adaptive[5][1] > 0.99
    first = rate(state.decided_at[:, 5] == 1)
    print(f"accum 8 decided at look 1 in {first[0]:.3f} ({first[1]:.3f}-{first[2]:.3f})")
    # clip 1 and clip 10: the fixed design reproduces its verdicts more often than the
    # adaptive one, whose clipping contrasts lose accum 4 and 8 (module docstring)
    for j in (0, 2):
        assert same_adaptive[j][2] < same_fixed[j][1]
    at_12 = (y.mean(axis=-1)[1, :2] - y.mean(axis=-1)[0, :2]).mean()
    assert abs(at_12) < margin < y.mean(axis=-1)[1].mean() - y.mean(axis=-1)[0].mean()
