"""The decide study (``hydra.sweeper.strategy=decide``): settings, rounds, lines, budgets, resume.

The planning tests feed the real strategy synthetic results on points the real sweeper composed
from the real ``conf/``; the slow test runs a real tiny decide sweep in-process on an embedded
SQLite store and reads what it recorded.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from stability.core.config import ConfigError
from stability.sweep import strategy_registry
from stability.sweep.decide import KEY, DecideStrategy, Settings
from stability.sweep.strategy_base import FINISHED, SKIPPED, PointResult, settings_of
from stability.tracking.contract import Tag
from tests.sweep.test_sweep import TINY, in_process_sweeper

GRID = [*TINY, "clip.enabled=false,true", "clip.max_norm=1.0", "train.accum_steps=1,8",
        "precision=fp32"]


def of(values: dict | None) -> Settings:
    """``hydra.sweeper.decide`` read as the sweeper reads it."""
    return settings_of(Settings, values, KEY)


def strategy(args: list[str], **settings) -> DecideStrategy:
    s = in_process_sweeper(args)
    _, points = s.plan(args)
    return DecideStrategy(points, s.make_point, of(settings))


def results(points, loss_of, status=FINISHED) -> list[PointResult]:
    return [PointResult(point=p, status=status, best_val_loss=loss_of(p), seconds=10.0)
            for p in points]


def test_settings_are_validated_up_front_naming_the_key() -> None:
    assert of(None) == Settings()
    assert of(None).plan.looks == (5, 10, 15, 20)
    cases = {
        "n0": (1, "hydra.sweeper.decide.n0=1 is invalid: allowed values are an integer >= 2"),
        "rho": (0, "hydra.sweeper.decide.rho=0 is invalid: allowed values are a number > 0"),
        "cost_tolerance": (-1, "hydra.sweeper.decide.cost_tolerance=-1 is invalid: allowed "
                               "values are a number >= 0"),
        "alpha": (1.5, "hydra.sweeper.decide.alpha=1.5 is invalid: allowed values are "
                       "0 < alpha < 1"),
        "margin": ("120%", "hydra.sweeper.decide.margin='120%' is invalid"),
        "power": (0.8, "hydra.sweeper.decide.power is unknown: allowed keys are alpha, "
                       "budget_cpu_s, budget_runs, cost_tolerance, margin, max_seeds, n0, rho, "
                       "step"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(ConfigError) as err:
            of({key: value})
        assert str(err.value).startswith(message)


def test_the_default_grid_starts_as_the_default_study() -> None:
    """Round 1 is the default study: 48 configs x seeds 0-4 = 240 runs (resumed from it)."""
    s = in_process_sweeper([])
    _, points = s.plan([])
    st = DecideStrategy(points, s.make_point, Settings())
    first = st.initial()
    assert len(first) == 240
    assert {p.key for p in first} == {p.key for p in points}
    assert st.tags()[Tag.STRATEGY] == "decide"
    assert json.loads(st.tags()[Tag.DECIDE_PLAN])["n0"] == 5
    with pytest.raises(ConfigError, match="hydra.sweeper.decide.budget_runs=200 is invalid: "
                                          "allowed values are at least the first round, 48 "
                                          "configs x n0=5 = 240 runs"):
        DecideStrategy(points, s.make_point, Settings(budget_runs=200))


def test_a_clear_answer_is_shown_at_the_first_look_and_said() -> None:
    st = strategy(GRID, n0=3, step=3, max_seeds=9)
    first = st.initial()
    assert len(first) == 12  # 2 x 2 configs x 3 seeds
    rng = np.random.default_rng(0)
    # accum 8 far worse, clipping does nothing: accum 1 within at once; clipping's levels
    # equal to the thousandth, both within
    plan = st.next(results(first, lambda p: 0.5 + 0.2 * (p.cfg.train.accum_steps == 8)
                           + 0.003 * p.cfg.seed + rng.normal(0, 0.00001)))
    assert plan is None
    lines = st.lines()
    assert lines[-1] == ("decide: shown for all 2 factors after 12 runs (look 1, 3 seeds): "
                         "clipping off, accumulation 1")
    assert lines[-2].startswith("decide: look 1 (3 seeds, margin 0.025")
    assert "shown clipping, accumulation; open none; 12 runs so far" in lines[-2]


def test_open_choices_get_seeds_and_the_plan_is_a_pure_function_of_the_results() -> None:
    """An open clipping choice: round 2 seeds every config not shown worse; the results
    replayed in any order as skipped (a resume) plan the same runs."""
    noise: dict = {}
    rng = np.random.default_rng(1)

    def loss(p):
        return noise.setdefault(p.key, 0.5 + 0.1 * (p.cfg.train.accum_steps == 8)
                                + 0.01 * p.cfg.clip.enabled + rng.normal(0, 0.01))

    st = strategy(GRID, n0=3, step=3, max_seeds=9, margin=0.002)
    rounds, seen = [], []
    batch = st.initial()
    while batch:
        rounds.append(sorted(p.key for p in batch))
        got = results(batch, loss)
        seen += got
        batch = st.next(got)
    assert len(rounds) >= 2
    accum_8 = {p.fingerprint for p in (r.point for r in seen) if p.cfg.train.accum_steps == 8}
    assert not {fp for fp, _ in rounds[1]} & accum_8  # shown worse at look 1: it left
    assert {s for _, s in rounds[1]} == {3, 4, 5}
    final = st.lines()[-1]
    assert final.startswith(("decide: shown for all 2 factors after", "decide: not shown, "
                             "stopped by max_seeds (9) reached after"))

    again = strategy(GRID, n0=3, step=3, max_seeds=9, margin=0.002)
    assert sorted(p.key for p in again.initial()) == rounds[0]
    shuffled = list(seen)
    random.Random(2).shuffle(shuffled)
    assert again.next([PointResult(point=r.point, status=SKIPPED, best_val_loss=r.best_val_loss,
                                   seconds=r.seconds) for r in shuffled]) is None
    assert len(again.replay.looks) == len(st.replay.looks) == len(rounds)
    assert again.replay.looks[-1].pick.tolist() == st.replay.looks[-1].pick.tolist()
    assert again.lines()[-1] == final


def test_budgets_stop_before_a_round_and_say_what_stays_open() -> None:
    def loss(p):
        return 0.5 + 0.01 * np.sin(p.cfg.seed * 7 + p.cfg.train.accum_steps)

    st = strategy(GRID, n0=3, step=3, max_seeds=9, margin=0.0001, budget_runs=14)
    assert st.next(results(st.initial(), loss)) is None
    assert st.stopped == "budget_runs: the next round needs 12 runs, 2 left"
    last = st.lines()[-1]
    assert last.startswith("decide: not shown, stopped by budget_runs: the next round needs 12 "
                           "runs, 2 left after 12 runs (look 1); open: ")


@pytest.mark.slow
def test_a_real_decide_sweep_records_its_plan_and_says_its_outcome(tmp_path: Path, monkeypatch,
                                                                    capsys) -> None:
    """A real tiny decide sweep (2 x 2 configs, 2 epochs on 300 samples): the parent run
    records the strategy and its plan; the last line says the outcome and the runs it used,
    which are the runs in the store."""
    from hydra.core.global_hydra import GlobalHydra

    from stability import cli

    finals: list[DecideStrategy] = []

    class Recording(DecideStrategy):
        def next(self, results):
            out = super().next(results)
            finals.append(self)
            return out

    monkeypatch.setitem(strategy_registry.STRATEGIES, "decide", Recording)
    store = tmp_path / "store"
    monkeypatch.setattr(sys, "argv", [
        "stability-sweep", "-m", *TINY, "hydra/launcher=basic", "clip.enabled=false,true",
        "clip.max_norm=1.0", "train.accum_steps=1,4", "precision=fp32", "seed=0",
        f"tracking.uri=sqlite:///{store / 'mlflow.db'}", "tracking.experiment=decide",
        f"hydra.sweep.dir={store / 'sweep'}", "hydra.sweeper.strategy=decide",
        "hydra.sweeper.decide.n0=2", "hydra.sweeper.decide.step=1",
        "hydra.sweeper.decide.max_seeds=3"])
    try:
        cli.sweep()
    finally:
        GlobalHydra.instance().clear()
    out = capsys.readouterr().out
    st = finals[-1]
    said = [line for line in out.splitlines() if "decide:" in line]
    assert said[-1].startswith(("[sweep] decide: shown for all 2 factors after",
                                "[sweep] decide: not shown, stopped by max_seeds (3) reached "
                                "after"))
    c = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    exp = c.get_experiment_by_name("decide")
    runs = c.search_runs([exp.experiment_id], "tags.`stability.kind` = 'train'", max_results=100)
    assert f"after {len(runs)} runs" in said[-1] and len(runs) == len(st.loss)
    parents = c.search_runs([exp.experiment_id], "tags.`stability.kind` = 'sweep'")
    tags = parents[0].data.tags
    assert tags[Tag.STRATEGY] == "decide"
    assert json.loads(tags[Tag.DECIDE_PLAN]) == {**json.loads(Settings(
        n0=2, step=1, max_seeds=3).to_json(0))}
