"""The decide study (``strategy=decide``) by simulation, through the code the sweep runs.

Each scenario of the decision audit draws potential outcomes ``y[study, levels..., 20 seeds]``
and runs ``stats.shown.simulate`` on them with the strategy's default plan (``decide.Settings``:
5 seeds, +5 a round, up to 20, alpha 0.05 spent evenly over the looks) and the report's margin
(5% of the lowest config mean, recomputed at each look as the report computes it). A study
reads only the runs it asked for. Against it, the fixed study at 5 / 10 / 20 seeds decided by
the report's rule (``stats.choice.level_choice``, alpha split over the factors).

Asserted through two-sided 95% Clopper-Pearson upper bounds, per scenario:

- ``far``: some factor's chosen level is truly more than the margin (5% of the true lowest
  config mean) worse than its factor's best level (over the whole grid, as the report's claim
  reads): at most 0.05, shown or not;
- ``false shown``: some factor's choice printed as shown within the margin is truly more
  than that printed margin worse than its best: at most alpha (the guarantee, >= 95%).

Printed per scenario and rule (docs/report.md and docs/sweeps.md quote the slow table): P(far),
the false-shown rate, P(all three shown), the regret (the largest true gap of a chosen level to
its factor's best, mean over studies) and the runs used (mean, 95% CI).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from stability.stats import best as mcb
from stability.stats import sequential as sq
from stability.stats import shown
from stability.stats.choice import Terms, level_choice
from tests.helpers.synthetic import (
    MARGIN,
    NOISE,
    PRECISIONS,
    SECONDS,
    default_study,
    planted,
    rate_ci,
    real_noise,
    studies,
)

ALPHA = 0.05
PLAN = sq.Plan(n0=5, step=5, max_seeds=20, alpha=ALPHA)  # decide.Settings' defaults
SIMPLE = (np.array([0, 1, 1, 1]), np.array([0, 1, 2, 3]), np.array([0, 1, 2]))
README = {"clip": (0, 0.0062, -0.0068, -0.0053), "accum": (0, 0.0103, 0.0324, 0.0832),
          "precision": (0, 0.0002, 0.0011)}


def report_margin(low: np.ndarray) -> np.ndarray:
    """``design.Margin("5%").of``, vectorised: 5% of the lowest config mean."""
    return 0.05 * np.abs(low)


@dataclass(frozen=True)
class Scenario:
    """Potential outcomes, their truth (config means), the runs' seconds, the levels' simplicity."""

    y: np.ndarray
    truth: np.ndarray
    seconds: np.ndarray
    simple: tuple[np.ndarray, ...] = SIMPLE
    margin_of: object = report_margin


def precision_seconds(shape: tuple[int, ...]) -> np.ndarray:
    """Each run's training seconds by its precision (the last factor), no noise."""
    cost = np.array([SECONDS[p] for p in PRECISIONS])
    return np.broadcast_to(cost.reshape((1,) * (len(shape) - 2) + (3, 1)), shape)


def additive(rng: np.random.Generator, sims: int, effect: np.ndarray,
             noise: str = "iid", **kwargs) -> Scenario:
    seeds = PLAN.max_seeds
    y = (studies(rng, sims, effect, seeds=seeds, **kwargs) if noise == "iid"
         else NOISE["loss"] + effect + real_noise(rng, sims, seeds))
    truth = NOISE["loss"] + effect[..., 0]
    return Scenario(y=y, truth=truth, seconds=precision_seconds(truth.shape + (seeds,)))


def scenario(name: str, sims: int, seed: int) -> Scenario:
    """The audit's scenarios (the module docstring; docs/report.md names each)."""
    rng = np.random.default_rng(seed)
    if name == "README effects":
        return additive(rng, sims, planted(**README))
    if name == "README effects, the study's covariance":
        return additive(rng, sims, planted(**README), noise="real")
    if name == "the default study (its means and covariance)":
        loss, secs = default_study()
        truth = loss.mean(axis=-1)
        y = truth[None, ..., None] + real_noise(rng, sims, PLAN.max_seeds)
        seconds = secs[..., np.arange(PLAN.max_seeds) % secs.shape[-1]]  # its runs' own times
        return Scenario(y=y, truth=truth, seconds=seconds)
    if name == "global null":
        return additive(rng, sims, planted())
    if name.startswith("gap "):
        g = float(name.split()[1])
        return additive(rng, sims, planted(clip=(0, -g, -g, -g), accum=README["accum"]))
    if name == "uneven noise (max_norm 5 at 3x)":
        run = np.full((4, 4, 3), NOISE["run"])
        run[2] *= 3
        return additive(rng, sims, planted(**README), run=run)
    if name == "cheaper and slightly worse (fp32 at 1.25x the margin)":
        return additive(rng, sims, planted(clip=README["clip"], accum=README["accum"],
                                           precision=(1.25 * MARGIN, 0, 0.0005)))
    if name == "8 levels (clipping: off and 7 thresholds)":
        clip = (0, 0.0062, -0.0068, -0.0053, -0.0060, -0.0040, 0.0020, 0.0)
        effect = (np.asarray(clip)[:, None, None, None]
                  + np.asarray(README["accum"])[None, :, None, None]
                  + np.asarray(README["precision"])[None, None, :, None])
        sc = additive(rng, sims, effect)
        return Scenario(y=sc.y, truth=sc.truth, seconds=sc.seconds,
                        simple=(np.array([0] + [1] * 7), SIMPLE[1], SIMPLE[2]))
    if name == "least favourable (every other level at 1.001x the margin, margin in loss units)":
        g = 1.001 * MARGIN
        sc = additive(rng, sims, planted(clip=(g, g, 0, g), accum=(0, g, g, g),
                                         precision=(g, 0, g)))
        return Scenario(y=sc.y, truth=sc.truth, seconds=sc.seconds,
                        margin_of=lambda low: np.full(np.shape(low), MARGIN))
    raise KeyError(name)


def true_gaps(truth: np.ndarray) -> list[np.ndarray]:
    """Each factor's levels' true gap to its best, over the whole grid (the report's claim)."""
    out = []
    for f in range(truth.ndim):
        m = truth.mean(axis=tuple(a for a in range(truth.ndim) if a != f))
        out.append(m - m.min())
    return out


@dataclass(frozen=True)
class Outcome:
    far: np.ndarray  # [sims]: some chosen level truly > the true margin worse than its best
    false_shown: np.ndarray  # [sims]: some shown choice truly > its printed margin worse
    all_shown: np.ndarray  # [sims]
    regret: np.ndarray  # [sims]: the largest true gap of a chosen level
    runs: np.ndarray  # [sims]


def judge(sc: Scenario, pick: np.ndarray, shown_: np.ndarray, margin: np.ndarray,
          runs: np.ndarray) -> Outcome:
    gaps = true_gaps(sc.truth)
    true_margin = 0.05 * sc.truth.min() if sc.margin_of is report_margin else MARGIN
    chosen = np.stack([g[pick[:, f]] for f, g in enumerate(gaps)], axis=-1)
    return Outcome(far=(chosen > true_margin).any(axis=-1),
                   false_shown=(shown_ & (chosen > margin[:, None])).any(axis=-1),
                   all_shown=shown_.all(axis=-1), regret=chosen.max(axis=-1),
                   runs=np.asarray(runs, dtype=float))


def decide(sc: Scenario, plan: sq.Plan = PLAN) -> Outcome:
    st = shown.simulate(sc.y, plan, sc.margin_of, sc.simple, sc.seconds)
    f = st.final
    return judge(sc, f.pick, f.settled, f.margin, st.runs)


def fixed(sc: Scenario, seeds: int) -> Outcome:
    """The fixed study of ``seeds`` seeds, decided by the report's rule."""
    y, secs = sc.y[..., :seeds], np.broadcast_to(sc.seconds, sc.y.shape)[..., :seeds]
    nf = len(sc.simple)
    low = y.mean(axis=-1).reshape(len(y), -1).min(axis=-1)
    margin = np.asarray(sc.margin_of(low), dtype=float)
    picks, within = [], []
    for f in range(nf):
        b, _, pick = level_choice(y, nf, [f], Terms(delta=margin, alpha=ALPHA / nf), secs,
                                  sc.simple[f])
        picks.append(pick)
        within.append(np.take_along_axis(b.status, pick[:, None], -1)[:, 0] == mcb.WITHIN)
    runs = np.full(len(y), math.prod(y.shape[1:]))
    return judge(sc, np.stack(picks, -1), np.stack(within, -1), margin, runs)


def summary(name: str, rule: str, o: Outcome) -> tuple[float, float]:
    far, _, far_high = rate_ci(int(o.far.sum()), len(o.far))
    bad, _, bad_high = rate_ci(int(o.false_shown.sum()), len(o.far))
    half = 1.96 * o.runs.std(ddof=1) / math.sqrt(len(o.runs)) if len(o.runs) > 1 else 0.0
    print(f"| {name} | {rule} | {far:.4f} [{far_high:.4f}] | {bad:.4f} [{bad_high:.4f}] | "
          f"{o.all_shown.mean():.3f} | {o.regret.mean():.5f} | {o.runs.mean():.0f} "
          f"[{o.runs.mean() - half:.0f}, {o.runs.mean() + half:.0f}] |")
    return far_high, bad_high


SCENARIOS = ["README effects", "README effects, the study's covariance",
             "the default study (its means and covariance)", "global null",
             *(f"gap {g}" for g in (0.004, 0.006, 0.008, 0.010, 0.015)),
             "uneven noise (max_norm 5 at 3x)",
             "cheaper and slightly worse (fp32 at 1.25x the margin)",
             "8 levels (clipping: off and 7 thresholds)",
             "least favourable (every other level at 1.001x the margin, margin in loss units)"]
FAST = ["README effects, the study's covariance", "global null",
        "least favourable (every other level at 1.001x the margin, margin in loss units)"]


@pytest.mark.parametrize("name", FAST)
def test_the_decide_study_keeps_its_guarantee_fast(name: str) -> None:
    """The rule on three scenarios, 600 studies each: the bounds hold already."""
    o = decide(scenario(name, 600, seed=50 + FAST.index(name)))
    far_high, bad_high = summary(name, "decide", o)
    assert far_high <= 0.05
    assert bad_high <= ALPHA


def test_each_look_spends_only_its_share_of_alpha() -> None:
    """One factor, two levels, the simpler one exactly at the margin worse and noise that keeps
    most studies going to the last look: choosing it as "shown within" is the error, one
    one-sided t-test per look. Spending alpha over the looks holds it at most alpha (0.034 in
    4,000 studies); full alpha at every look (the mutant in experiments/mutants.py) makes it
    0.13."""
    rng = np.random.default_rng(70)
    y = np.zeros((4_000, 2, PLAN.max_seeds))
    y[:, 0] = MARGIN
    y = y + rng.normal(0, 6 * MARGIN / math.sqrt(2), y.shape)
    st = shown.simulate(y, PLAN, lambda low: np.full(np.shape(low), MARGIN), (np.array([0, 1]),))
    wrong = st.final.settled[:, 0] & (st.final.pick[:, 0] == 0)
    rate, low, high = rate_ci(int(wrong.sum()), len(wrong))
    print(f"at the margin: shown within in {rate:.4f} (95% CI {low:.4f}-{high:.4f}); "
          f"studies ending at each look {np.bincount(st.stopped)[1:].tolist()}")
    assert high <= ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("name", SCENARIOS)
def test_the_decide_study_against_the_fixed_study(name: str) -> None:
    """Every scenario, 2,000 studies: decide against the fixed study at 5 / 10 / 20 seeds
    (the table in docs/report.md). Asserted for decide: the two bounds; on the default study
    and the README effects, the answer shown for all three factors in fewer runs than the
    fixed 10 seeds (480), and more often than at 10 seeds."""
    sc = scenario(name, 2_000, seed=60 + SCENARIOS.index(name))
    o = decide(sc)
    far_high, bad_high = summary(name, "decide", o)
    fixed_10 = None
    for seeds in (5, 10, 20):
        f = fixed(sc, seeds)
        summary(name, f"fixed {seeds}", f)
        fixed_10 = f if seeds == 10 else fixed_10
    assert far_high <= 0.05
    assert bad_high <= ALPHA
    if name in ("README effects, the study's covariance",
                "the default study (its means and covariance)"):
        half = 1.96 * o.runs.std(ddof=1) / math.sqrt(len(o.runs))
        assert o.runs.mean() + half < 480
        assert o.all_shown.mean() > fixed_10.all_shown.mean()

