"""The decide study's looks (``stats.shown``): the report's rule at each look's share of alpha,
the configs still in contention, unfinished runs, and the plan as a pure function of the runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from stability.stats import best as mcb
from stability.stats import sequential as sq
from stability.stats import shown
from stability.stats.choice import Terms, level_choice

PLAN = sq.Plan(n0=3, step=3, max_seeds=9)
SIMPLE = (np.array([0, 1, 1]), np.array([0, 1]))


def margin_of(low: np.ndarray) -> np.ndarray:
    return 0.05 * np.abs(low)


SETUP = shown.Setup(plan=PLAN, margin_of=margin_of, simple=SIMPLE)


def study(rng: np.random.Generator, n: int = 1, clip=(0.0, 0.004, -0.004),
          accum=(0.0, 0.05), sd: float = 0.004) -> np.ndarray:
    """``y[n, clip 3, accum 2, 9 seeds]``: additive effects, a seed effect, run noise."""
    y = 0.5 + np.asarray(clip)[:, None, None] + np.asarray(accum)[None, :, None]
    y = y + rng.normal(0, 0.002, (n, 1, 1, PLAN.max_seeds))
    return y + rng.normal(0, sd, (n, 3, 2, PLAN.max_seeds))


def test_a_look_is_the_reports_rule_at_its_share_of_alpha() -> None:
    """Look 1 on round 1 = ``level_choice`` per factor at ``spend[0] / factors`` with the
    report's margin (5% of the lowest config mean), the bounds constrained to the levels not
    shown worse."""
    y = study(np.random.default_rng(1), 50)
    ran = np.zeros(y.shape, dtype=bool)
    ran[..., :3] = True
    lk = shown.look(np.where(ran, y, np.nan), ran, 0, SETUP)
    first = y[..., :3]
    margin = margin_of(first.mean(axis=-1).reshape(50, -1).min(axis=-1))
    np.testing.assert_allclose(lk.margin, margin)
    assert lk.alpha == pytest.approx(0.05 / 3)
    for f in range(2):
        terms = Terms(delta=margin, alpha=0.05 / 3 / 2, constrained=True)
        b, _, pick = level_choice(first, 2, [f], terms, np.full(first.shape, 1.0), SIMPLE[f])
        np.testing.assert_array_equal(lk.pick[:, f], pick)
        np.testing.assert_allclose(lk.upper[f], b.upper)
        np.testing.assert_array_equal(lk.status[f], b.status)
    assert lk.runs.tolist() == [18] * 50


def test_constrained_bounds_leave_out_only_the_levels_shown_worse() -> None:
    """``U_i`` over the levels not shown worse, by hand: level 2 left after 3 of 6 seeds (far
    worse than level 1, with which it moves), so its wide pair with the noisy level 0 would
    set level 0's plain bound; the constrained bound leaves it out."""
    rng = np.random.default_rng(2)
    y1 = rng.normal(0, 0.0005, 6)
    y2 = np.where(np.arange(6) < 3, 0.5 + y1 + rng.normal(0, 0.0005, 6), np.nan)
    y = np.stack([rng.normal(0, 1, 6), y1, y2])[:, None, :]  # [level, cell, seed]
    plain = mcb.mcb(mcb.pairwise(y), 0.01, 0.05)
    tight = mcb.mcb(mcb.pairwise(y), 0.01, 0.05, constrained=True)
    assert plain.status[2] == tight.status[2] == mcb.WORSE
    np.testing.assert_array_equal(plain.lower, tight.lower)
    d = mcb.pairwise(y)[0]  # level 0 against each
    n = np.isfinite(d).sum(-1)
    t = stats.t.ppf(1 - 0.05 / 2, n - 1)
    hi = np.nanmean(d, -1) + t * np.nanstd(d, -1, ddof=1) / np.sqrt(n)
    assert hi[2] > hi[1] > 0
    assert plain.upper[0] == pytest.approx(hi[2])
    assert tight.upper[0] == pytest.approx(hi[1])  # level 2 left out
    # no margin (-inf): nothing is set aside
    same = mcb.mcb(mcb.pairwise(y), -np.inf, 0.05, constrained=True)
    np.testing.assert_allclose(same.upper, mcb.mcb(mcb.pairwise(y), -np.inf, 0.05).upper)


def test_a_level_shown_worse_leaves_and_settled_studies_stop() -> None:
    """accum 2 (+0.05) is shown worse at look 1: the next round seeds only accum 1's configs;
    a factor's levels not shown worse all stay (the seeds stay comparable)."""
    y = study(np.random.default_rng(3), 200, clip=(0.0, 0.004, -0.004))
    st = shown.simulate(y, PLAN, margin_of, SIMPLE)
    lk = st.looks[0]
    worse = lk.status[1][:, 1] == mcb.WORSE
    assert worse.mean() > 0.9
    going = ~lk.done & worse
    assert going.any()
    nxt = lk.next[going]
    assert not nxt[:, :, 1].any()  # accum 2 left
    keep = (lk.status[0][going] != mcb.WORSE)
    np.testing.assert_array_equal(nxt[:, :, 0], keep)
    assert not lk.next[lk.done].any()
    assert (st.runs[st.stopped == 1] == 18).all()
    assert st.runs.max() <= 6 * 9


def test_unfinished_runs_count_at_the_worst_read_loss_and_block_the_margin() -> None:
    """A run that did not finish stands at the worst finished loss the look reads; its config
    sets no margin (its mean is not finite in the report)."""
    rng = np.random.default_rng(4)
    y = study(rng)[0]
    ran = np.zeros(y.shape, dtype=bool)
    ran[..., :3] = True
    loss = np.where(ran, y, np.nan)
    best = np.unravel_index(np.argmin(loss[..., :3].mean(-1)), (3, 2))
    loss[best + (1,)] = np.nan  # the best config's seed 1 did not finish
    lk = shown.look(loss, ran, 0, SETUP)
    means = np.nanmean(np.where(ran, y, np.nan)[..., :3], axis=-1)
    means[best] = np.inf
    assert float(lk.margin) == pytest.approx(0.05 * means.min())
    filled = np.where(ran, y, np.nan)[..., :3].copy()
    filled[best + (1,)] = np.nanmax(loss[..., :3])
    terms = Terms(delta=float(lk.margin), alpha=PLAN.spend[0] / 2, constrained=True)
    b, _, _ = level_choice(filled, 2, [0], terms, np.full(filled.shape, np.nan), SIMPLE[0])
    np.testing.assert_allclose(lk.upper[0], b.upper)


def test_the_plan_is_a_pure_function_of_the_recorded_runs() -> None:
    """Replaying the runs a simulated study asked for gives its looks; a record cut after
    round 1 asks exactly round 2's runs; runs outside the next look's window change no look
    already taken."""
    rng = np.random.default_rng(5)
    y = study(rng, 40, clip=(0.0, 0.003, 0.0), sd=0.006)
    st = shown.simulate(y, PLAN, margin_of, SIMPLE)
    assert (st.stopped > 1).any()
    for i in range(40):
        asked = np.zeros(y.shape[1:], dtype=bool)
        asked[..., :3] = True
        for lk in st.looks[: st.stopped[i] - 1]:
            seed = np.arange(9)
            asked |= lk.next[i][..., None] & (seed >= lk.seeds) & (seed < lk.seeds + 3)
        rep = shown.replay(np.where(asked, y[i], np.nan), asked, PLAN, margin_of, SIMPLE)
        assert rep.done and len(rep.looks) == st.stopped[i]
        assert rep.looks[-1].pick.tolist() == st.final.pick[i].tolist()
        assert rep.looks[-1].settled.tolist() == st.final.settled[i].tolist()
        assert int(asked.sum()) == st.runs[i]
        if st.stopped[i] > 1:
            first = asked & (np.arange(9) < 3)
            cut = shown.replay(np.where(first, y[i], np.nan), first, PLAN, margin_of, SIMPLE)
            assert len(cut.looks) == 1 and not cut.done
            np.testing.assert_array_equal(cut.missing, asked & (np.arange(9) >= 3)
                                          & (np.arange(9) < 6))
            extra = first | (np.arange(9) == 8)  # a stray run beyond the next window
            again = shown.replay(np.where(extra, y[i], np.nan), extra, PLAN, margin_of, SIMPLE)
            assert again.looks[0].pick.tolist() == cut.looks[0].pick.tolist()
            np.testing.assert_array_equal(again.missing, cut.missing)
