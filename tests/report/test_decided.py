"""The report of a decide study (``report.decide.decided``): the answer is the study's last look.

A decide study simulated through ``stats.shown`` (the strategy's code) is written as the
report's runs table; the report's replay finds the look it stopped at, and ``winner.decide``
at that look's share of alpha reaches the study's bounds, so every "shown" claim it prints is
one the union bound over the looks covers. The recorded plan is data: bounded, and a plan
that does not parse shows nothing.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from stability.design.margin import Margin
from stability.report.decide import decided, factors, spending, winner
from stability.report.decide.select import aggregate
from stability.stats import best as mcb
from stability.stats import sequential as sq
from stability.stats import shown
from stability.tracking.contract import Tag
from tests.helpers.synthetic import NOISE, planted, real_noise, runs_table

PLAN = sq.Plan(n0=5, step=5, max_seeds=20)
SIMPLE = (np.array([0, 1, 1, 1]), np.array([0, 1, 2, 3]), np.array([0, 1, 2]))
README = {"clip": (0, 0.0062, -0.0068, -0.0053), "accum": (0, 0.0103, 0.0324, 0.0832),
          "precision": (0, 0.0002, 0.0011)}


def margin_of(low):
    return 0.05 * np.abs(low)


def test_the_report_decides_at_the_share_of_the_look_the_study_stopped_at() -> None:
    rng = np.random.default_rng(80)
    y = NOISE["loss"] + planted(**README) + real_noise(rng, 6, PLAN.max_seeds)
    st = shown.simulate(y, PLAN, margin_of, SIMPLE)  # costs blind: every run 1 s of wall time
    checked = 0
    for i in range(6):
        k = int(st.stopped[i])
        asked = np.zeros(y.shape[1:], dtype=bool)
        asked[..., :PLAN.n0] = True
        for lk in st.looks[: k - 1]:
            s = np.arange(PLAN.max_seeds)
            asked |= lk.next[i][..., None] & (s >= lk.seeds) & (s < lk.seeds + PLAN.step)
        runs = runs_table(np.where(asked, y[i], np.nan))
        configs = aggregate(runs)
        spent = decided.analyse(runs, configs, PLAN, Margin.parse("5%"), 0.0, 0)
        assert spent.alpha == pytest.approx(PLAN.spend[k - 1])
        settled = bool(st.final.settled[i].all())
        assert (f"shown at look {k} of 4" in spent.note) == settled
        assert f"decide study: {int(asked.sum())} runs" in spent.note
        margin = Margin.parse("5%").of(float(configs.iloc[0]["loss_mean"]))
        assert margin == pytest.approx(float(st.final.margin[i]))
        settings = winner.Settings(margin=margin, alpha=0.05, cost_tolerance=0.0)
        dec = winner.decide(runs, configs, None, settings, spent=spent)
        assert dec.alpha == 0.05 and dec.study == spent.note
        for f, c in enumerate(dec.choices):
            np.testing.assert_allclose(c.upper, st.final.upper[f][i])
            assert c.status == tuple(st.final.status[f][i])
            if settled:
                assert c.status[c.chosen] == mcb.WITHIN
        checked += settled
    assert checked >= 3


def test_the_recorded_plan_is_data() -> None:
    plan = {"n0": 5, "step": 5, "max_seeds": 20, "alpha": 0.05, "rho": 1.0, "margin": "5%",
            "cost_tolerance": 0.0, "base_seed": 3}
    got = decided.plan_of({Tag.STRATEGY: "decide", Tag.DECIDE_PLAN: json.dumps(plan)})
    assert got is not None and got[0] == PLAN and got[3] == 3
    assert decided.plan_of({Tag.STRATEGY: "adaptive"}) is None
    for bad in ({**plan, "max_seeds": 10**6}, {**plan, "rho": -1}, {**plan, "margin": "x"}):
        with pytest.raises(ValueError):
            decided.plan_of({Tag.STRATEGY: "decide", Tag.DECIDE_PLAN: json.dumps(bad)})

    class Parent:
        def get_run(self, _):
            class R:
                class data:  # noqa: N801 - the shape MLflow's Run has
                    tags = {Tag.STRATEGY: "decide", Tag.DECIDE_PLAN: "{not json"}
            return R

    notes: list[str] = []
    runs = runs_table(NOISE["loss"] + planted(**README)[..., 0:1].repeat(5, -1))
    spent = decided.of_sweep(Parent(), "p", runs, aggregate(runs), notes)
    assert spent is not None and spent.alpha == 0.0 and "could not be replayed" in spent.note
    assert notes and notes[0].startswith("the decide study's looks: not replayed")
    an = factors.analyse(runs, aggregate(runs), 0.004)
    settings = winner.Settings(margin=0.004, alpha=0.05, cost_tolerance=0.0)
    dec = winner.decide(runs, aggregate(runs), an, settings, spent=spent)
    assert not any(c.status[c.chosen] == mcb.WITHIN for c in dec.choices)


def test_a_decide_sweeps_verdicts_are_withheld_and_say_why() -> None:
    from stability.report.present.sections import decision_text

    seq = spending.Sequential(decide=True)
    runs = runs_table(NOISE["loss"] + planted(**README)[..., 0:1].repeat(5, -1))
    an = factors.analyse(runs, aggregate(runs), 0.004)
    assert {seq.word(e) for e in an.main} == {spending.WITHHELD}
    line = decision_text.adaptive_line(seq)[0]
    assert line.startswith("**Decide sweep: the factor verdicts are withheld.**")
