"""The report's "How the study spent its runs": the sweep's looks replayed from its runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from stability.design import factors as vocabulary
from stability.design.margin import Margin
from stability.report.decide import factors, spending
from stability.report.decide.compare import versus_winner
from stability.report.decide.select import aggregate
from stability.report.present.sections import decision_text as decision
from stability.report.present.sections import spending as spending_section
from stability.stats import sequential as sq
from stability.tracking.contract import Tag
from tests.stats.test_sequential import LEVELS, MARGIN, PLAN, planted, studies

CLIPS, ACCUMS, PRECISIONS = (None, 1.0, 5.0, 10.0), (1, 2, 4, 8), ("fp32", "bf16", "fp16")


def runs_of(y: np.ndarray, seeds: np.ndarray, base: int = 100) -> pd.DataFrame:
    """The runs an adaptive study made: config ``(c, a, p)`` ran its first ``seeds`` seeds."""
    rows = []
    for (c, a, p), n in np.ndenumerate(seeds):
        clip = CLIPS[c]
        fp = f"{clip}-{ACCUMS[a]}-{PRECISIONS[p]}"
        for s in range(n):
            rows.append({"run_id": f"{fp}-{s}", "fingerprint": fp, "seed": base + s,
                         "outcome": "finished", "best_val_loss": y[c, a, p, s],
                         "precision.name": PRECISIONS[p], "clip.enabled": clip is not None,
                         "clip.method": "norm", "clip.max_norm": clip or 1.0,
                         "train.accum_steps": ACCUMS[a], "wall_time_s": 2.0 + a,
                         "skip_count": 0})
    return pd.DataFrame(rows)


def test_the_report_replays_the_looks_the_rule_took() -> None:
    effect = planted(clip=(0, 0.0039, -0.0098, -0.0058), accum=(0, 0.008, 0.031, 0.085),
                     precision=(0, 0.0014, -0.0006))
    y = studies(np.random.default_rng(30), 1, PLAN.max_seeds, effect)[0]
    state, seeds = sq.run(y[None], PLAN, MARGIN, LEVELS)
    runs = runs_of(y, seeds[0])
    configs = versus_winner(runs, aggregate(runs))
    sp = spending.analyse(runs, configs, PLAN, MARGIN, 100)

    assert [d.verdict for d in sp.decisions] == [sq.VERDICTS[v] for v in state.verdict[0]]
    assert [d.look for d in sp.decisions] == state.decided_at[0].tolist()
    assert sp.runs == len(runs) == int(seeds.sum()) == sum(r.runs for r in sp.rounds)
    assert sp.fixed_runs == 48 * PLAN.max_seeds
    assert sp.cpu_s == pytest.approx(runs["wall_time_s"].sum())
    per_config = runs.groupby("fingerprint")["wall_time_s"].mean().sum() * PLAN.max_seeds
    assert sp.fixed_cpu_s == pytest.approx(per_config)
    assert [r.seeds for r in sp.rounds] == list(PLAN.looks[:len(sp.rounds)])
    assert sp.seeds.sum(axis=1).sort_values().tolist() == sorted(seeds[0].ravel().tolist())
    accum8 = next(d for d in sp.decisions if d.contrast == "accum 8 vs accum 1")
    assert (accum8.verdict, accum8.look, accum8.seeds) == ("hurts", 1, PLAN.n0)
    assert accum8.low < accum8.mean < accum8.high

    text = "\n".join(spending_section.section(sp))
    assert "| 1 | 3 | 48 | 144 |" in text
    assert f"Spent {sp.runs} runs" in text and f"would have taken {48 * 9} runs" in text


def test_the_plan_is_read_from_the_parent_run_as_untrusted_data() -> None:
    good = {"n0": 3, "step": 2, "max_seeds": 9, "alpha": 0.05, "power": 0.8, "margin": "5%",
            "base_seed": 7}
    tags = {Tag.STRATEGY: "adaptive", Tag.ADAPTIVE_PLAN: json.dumps(good)}
    plan, margin, base = spending.plan_of(tags)
    assert (plan.looks, margin, base) == ((3, 5, 7, 9), Margin(5.0, relative=True), 7)
    assert spending.plan_of({}) is None  # a grid sweep: no section
    for bad in ("not json", json.dumps(good | {"max_seeds": 10**9}),
                json.dumps(good | {"n0": 1}), json.dumps(good | {"margin": [1]})):
        with pytest.raises(ValueError):
            spending.plan_of(tags | {Tag.ADAPTIVE_PLAN: bad})
    notes: list[str] = []

    class Store:
        def get_run(self, run_id):
            return type("R", (), {"data": type("D", (), {"tags": tags | {
                Tag.ADAPTIVE_PLAN: "not json"}})})

    assert spending.of_sweep(Store(), "p", pd.DataFrame(), pd.DataFrame(), notes) is None
    assert notes and notes[0].startswith("how the study spent its runs: not replayed")


class Parent:
    """A tracking client whose only run is a sweep's parent with these tags."""

    def __init__(self, tags: dict[str, str]) -> None:
        self.tags = tags

    def get_run(self, run_id):
        return type("R", (), {"data": type("D", (), {"tags": self.tags})})


ADAPTIVE = {Tag.STRATEGY: "adaptive", Tag.ADAPTIVE_PLAN: json.dumps({
    "n0": PLAN.n0, "step": PLAN.step, "max_seeds": PLAN.max_seeds, "alpha": PLAN.alpha,
    "power": PLAN.power, "margin": MARGIN, "base_seed": 100})}


def adaptive_study(seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    effect = planted(clip=(0, 0.0039, -0.0098, -0.0058), accum=(0, 0.008, 0.031, 0.085),
                     precision=(0, 0.0014, -0.0006))
    y = studies(np.random.default_rng(seed), 1, PLAN.max_seeds, effect)[0]
    runs = runs_of(y, sq.run(y[None], PLAN, MARGIN, LEVELS)[1][0])
    return runs, versus_winner(runs, aggregate(runs))


def test_an_adaptive_sweeps_factor_table_and_answer_give_the_replayed_verdicts() -> None:
    runs, configs = adaptive_study(37)  # max_norm 5: fixed-design helps, the rule undecided
    sp, seq = spending.replayed(Parent(ADAPTIVE), "p", runs, configs, [])
    an = factors.analyse(runs, configs, MARGIN)
    replay = {d.contrast: d for d in sp.decisions}
    fixed = {spending.contrast_name(e): e.verdict for e in an.main}
    assert (fixed["max_norm 5 vs clip off"], replay["max_norm 5 vs clip off"].verdict) == (
        "helps", "undecided")

    rows = decision.factor_table(an, seq)
    assert sorted(r[1] for r in rows) == sorted(replay)
    for r in rows:
        d = replay[r[1]]
        without = f", averaged without {d.left}" if d.left else ""
        assert r[7] == (f"{d.verdict} (look {d.look}{without})" if d.look
                        else f"{d.verdict} (after the last look{without})")
        # a verdict reached after accum 8 left is about the design without it, and says so
        late = (d.look or len(PLAN.looks)) > 2 and d.factor != vocabulary.ACCUM
        assert ("accum 8" in d.left) == late
    assert "accum 8 **hurts (look 2)**" in " ".join(decision.factor_sentences(an, seq))
    assert [r[7] for r in decision.factor_table(an)] == list(fixed.values())  # grid: unchanged
    clipping = next(s for s in decision.factor_sentences(an, seq) if "**Clipping**" in s)
    assert "max_norm 5 **undecided (after the last look, averaged without accum 4, accum 8)**" \
        in clipping
    assert "max_norm 5 **helps**" in "".join(decision.factor_sentences(an))


def test_an_adaptive_sweep_whose_plan_cannot_be_read_gives_no_fixed_design_verdict() -> None:
    runs, configs = adaptive_study(37)
    an = factors.analyse(runs, configs, MARGIN)
    notes: list[str] = []
    sp, seq = spending.replayed(Parent(ADAPTIVE | {Tag.ADAPTIVE_PLAN: "{}"}), "p", runs,
                                configs, notes)
    assert sp is None and not seq.replayed and "verdicts are withheld" in notes[0]
    assert {r[7] for r in decision.factor_table(an, seq)} == {spending.WITHHELD}
    said = " ".join(decision.factor_sentences(an, seq))
    assert not any(f"**{v}" in said for v in ("helps", "hurts", "equivalent", "undecided"))
    assert spending.replayed(Parent({}), "p", runs, configs, []) == (None, None)  # a grid
