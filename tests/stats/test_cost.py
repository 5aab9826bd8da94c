"""Cost differences count only beyond the run-to-run spread (``stats.cost``), on the measured
default study (tests/data/default_study_runs.csv: wall-clock seconds of 240 runs)."""

from __future__ import annotations

import numpy as np

from stability.report.decide import winner
from stability.stats import cost as costs
from tests.helpers.synthetic import default_study


def _by(axis: int) -> costs.Cost:
    _, seconds = default_study()
    return costs.level_cost(winner.joint(seconds, [axis], 3))


def test_clipping_levels_cost_the_same_within_the_spread():
    """max_norm 1, 5 and 10 do the same work; they measured 1.02 / 1.01 / 1.12x clip off (mean
    log) on a shared machine, inside a run's own spread (log SD 0.178): none is costlier."""
    c = _by(0)
    ratio = c.ratio(0)
    print("clipping cost / clip off:", np.round(ratio, 3), "spread", np.round(c.spread, 3))
    assert 0.17 < float(c.spread) < 0.19
    assert ratio.max() > 1.1  # the artifact is there ...
    assert costs.equally_cheap(c, np.ones(4, dtype=bool)).all()  # ... and decides nothing


def test_precision_costs_differ_beyond_the_spread():
    """bf16 and fp16 are dearer than fp32 on these CPUs by far more than the spread."""
    c = _by(2)
    assert costs.equally_cheap(c, np.ones(3, dtype=bool)).tolist() == [True, False, False]
    assert c.ratio(0)[1] > 1.3 and c.ratio(0)[2] > 2.5


def test_a_costlier_level_must_clear_the_spread_and_its_own_uncertainty():
    s = np.log([[1.0, 1.1, 0.9, 1.0], [1.25, 1.35, 1.15, 1.25]])[:, None, :]  # [level, cell, seed]
    c = costs.level_cost(np.exp(s))
    assert float(c.spread) < 0.1 and c.runs.tolist() == [4, 4]
    assert costs.equally_cheap(c, np.ones(2, dtype=bool), floor=0.0).tolist() == [True, False]
    # 25% dearer, but not shown so by more than the spread and 10% beyond it
    assert costs.equally_cheap(c, np.ones(2, dtype=bool)).tolist() == [True, True]
    assert costs.FLOOR == 0.1
    blind = costs.Cost(c.log_mean, np.array(np.nan), c.runs)
    assert costs.equally_cheap(blind, np.ones(2, dtype=bool), floor=0.0).all()


def test_a_difference_past_the_cut_but_not_shown_past_it_does_not_count():
    """Two runs a level: level 1 is 30% dearer, past the cut (spread 0.129 and the floor's
    0.095 beyond it: 0.224) on its point estimate (0.262), but its one-sided 95% lower bound
    (0.262 - 1.645 x 0.129) is not: the same cost. Without the uncertainty term it would count."""
    c = costs.level_cost(np.array([[1.0, 1.2], [1.3, 1.56]])[:, None, :])
    diff, s = float(c.log_mean[1] - c.log_mean[0]), float(c.spread)
    assert diff > s + np.log1p(costs.FLOOR) and diff - 1.645 * s < s + np.log1p(costs.FLOOR)
    assert costs.equally_cheap(c, np.ones(2, dtype=bool)).tolist() == [True, True]
    assert costs.equally_cheap(c, np.ones(2, dtype=bool), floor=0.0).tolist() == [True, True]


def test_zero_spread_is_not_certainty_that_a_small_difference_matters():
    """Identical run times (no spread): 1% dearer is the same cost under the default floor, 20%
    dearer is not; only a floor of 0 lets the bare 1% decide."""
    for dearer, same in ((1.01, True), (1.2, False)):
        c = costs.level_cost(np.array([[1.0, 1.0, 1.0], [dearer] * 3])[:, None, :])
        assert float(c.spread) == 0.0
        assert costs.equally_cheap(c, np.ones(2, dtype=bool)).tolist() == [True, same]
    assert costs.equally_cheap(c, np.ones(2, dtype=bool), floor=0.0).tolist() == [True, False]
    tiny = costs.level_cost(np.array([[1.0, 1.0, 1.0], [1.01] * 3])[:, None, :])
    assert costs.equally_cheap(tiny, np.ones(2, dtype=bool), floor=0.0).tolist() == [True, False]
