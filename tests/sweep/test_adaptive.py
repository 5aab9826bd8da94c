"""The adaptive study (``hydra.sweeper.strategy=adaptive``): design, planning, budgets, resume.

The planning tests feed the real strategy synthetic results on points the real sweeper
composed from the real ``conf/``; the resume test runs small adaptive studies in-process on
embedded SQLite stores, one of them killed after its first round and re-run with the same
command.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from stability.core.config import ConfigError
from stability.stats import sequential as sq
from stability.sweep import strategy_registry
from stability.sweep.adaptive import KEY, AdaptiveStrategy, Settings, design
from stability.sweep.strategy_base import FINISHED, NOT_FINISHED, SKIPPED, PointResult, settings_of
from tests.sweep.test_sweep import TINY, in_process_sweeper


def strategy(args: list[str], **settings) -> AdaptiveStrategy:
    s = in_process_sweeper(args)
    _, points = s.plan(args)
    return AdaptiveStrategy(points, s.make_point, of(settings))


def of(values: dict | None) -> Settings:
    """``hydra.sweeper.adaptive`` read as the sweeper reads it."""
    return settings_of(Settings, values, KEY)


def results(points, loss_of, status=FINISHED) -> list[PointResult]:
    return [PointResult(point=p, status=status, best_val_loss=loss_of(p),
                        seconds=10.0) for p in points]


def test_settings_are_validated_up_front_naming_the_key() -> None:
    assert of(None) == Settings()
    assert of({"n0": 2, "margin": 0.004, "budget_runs": 100}).plan.looks == (2, 4, 6, 8,
                                                                                       9)
    cases = {
        "n0": (1, "hydra.sweeper.adaptive.n0=1 is invalid: allowed values are an integer >= 2"),
        "step": (0, "hydra.sweeper.adaptive.step=0 is invalid: allowed values are an integer >= 1"),
        "alpha": (1.5, "hydra.sweeper.adaptive.alpha=1.5 is invalid: allowed values are "
                       "0 < alpha < 1"),
        "budget_runs": (0, "hydra.sweeper.adaptive.budget_runs=0 is invalid: allowed values are "
                           "an integer >= 1 or null"),
        "budget_cpu_s": (-3, "hydra.sweeper.adaptive.budget_cpu_s=-3 is invalid: allowed values "
                             "are seconds > 0 or null"),
        "margin": ("120%", "hydra.sweeper.adaptive.margin='120%' is invalid"),
        "nzero": (3, "hydra.sweeper.adaptive.nzero is unknown: allowed keys are alpha, "
                     "budget_cpu_s, budget_runs, margin, max_seeds, n0, power, step"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(ConfigError) as err:
            of({key: value})
        assert str(err.value).startswith(message)
    with pytest.raises(ConfigError, match=r"max_seeds=3 is invalid: allowed values are an "
                                          r"integer >= n0 \(5\)"):
        of({"n0": 5, "max_seeds": 3})


def test_the_default_grid_is_a_4x3x4_factorial_with_the_reports_references() -> None:
    s = in_process_sweeper([])
    _, points = s.plan([])
    d = design(points)
    assert d.names == ("clipping", "accumulation", "precision")  # the report's (design.factors)
    assert d.levels == (("off", "max_norm 1", "max_norm 5", "max_norm 10"),
                        ("1", "2", "4", "8"), ("fp32", "bf16", "fp16"))
    assert len(d.configs) == 48
    with pytest.raises(ConfigError, match="budget_runs=100 is invalid: allowed values are at "
                                          "least the first round, 48 configs x n0=3 = 144 runs"):
        AdaptiveStrategy(points, s.make_point, Settings(budget_runs=100))
    with pytest.raises(ConfigError, match="strategy=adaptive is invalid for this grid: allowed "
                                          "grids are a full factorial"):
        design([p for p in points if p.cfg.precision.name == "fp32"][:-5])  # a config short


GRID = [*TINY, "clip.enabled=false", "train.accum_steps=1,8", "precision=fp32"]


def test_round_one_is_n0_seeds_per_config_and_a_level_that_hurts_ends_the_study() -> None:
    st = strategy(GRID, n0=3, max_seeds=7)
    first = st.initial()
    assert sorted((p.cfg.train.accum_steps, p.cfg.seed) for p in first) == [
        (1, 0), (1, 1), (1, 2), (8, 0), (8, 1), (8, 2)]
    rng = np.random.default_rng(0)
    # accum 8 far worse on every seed: decided "hurts" at the first look, nothing more to run
    plan = st.next(results(first, lambda p: 0.5 + 0.2 * (p.cfg.train.accum_steps == 8)
                           + rng.normal(0, 0.001)))
    assert plan is None
    assert st.replay is not None and [sq.VERDICTS[v] for v in st.replay.states[-1].verdict] == [
        "hurts"]


def test_the_next_round_is_a_pure_function_of_the_recorded_results() -> None:
    """Order of arrival, and results replayed as skipped (a resume), change nothing."""
    rng = np.random.default_rng(1)
    noise = {}

    def loss(p):
        return noise.setdefault(p.key, 0.5 + 0.002 * (p.cfg.train.accum_steps == 8)
                                + rng.normal(0, 0.01))

    st = strategy(GRID, n0=3, step=2, max_seeds=9, margin=0.0001, power=0.01)
    seen: list[PointResult] = []
    batch = st.initial()
    rounds = []
    while batch:
        rounds.append(sorted(p.key for p in batch))
        got = results(batch, loss)
        seen += got
        batch = st.next(got)
    assert len(rounds) >= 2  # undecided at the first look: seeded on
    assert rounds[1] == sorted((fp, s) for fp in {k[0] for k in rounds[0]} for s in (3, 4))

    again = strategy(GRID, n0=3, step=2, max_seeds=9, margin=0.0001, power=0.01)
    shuffled = list(seen)
    random.Random(2).shuffle(shuffled)
    replayed = [sorted(p.key for p in again.initial())]
    nxt = again.next([PointResult(point=r.point, status=SKIPPED, best_val_loss=r.best_val_loss,
                                  seconds=r.seconds)
                      for r in shuffled])  # everything recorded comes back at once
    assert replayed == rounds[:1] and nxt is None
    assert again.replay.states[-1].verdict.tolist() == st.replay.states[-1].verdict.tolist()
    assert len(again.replay.states) == len(st.replay.states) == len(rounds)


def test_unfinished_runs_count_at_the_worst_loss_and_block_equivalence() -> None:
    st = strategy(GRID, n0=3, max_seeds=3, margin=0.05)
    first = st.initial()
    ok = results(first, lambda p: 0.5 + 0.0001 * p.cfg.seed)
    assert st.next(ok) is None and st.replay.states[-1].verdict.tolist() == [sq.EQUIVALENT]
    st = strategy(GRID, n0=3, max_seeds=3, margin=0.05)
    first = st.initial()
    bad = [r if r.point.cfg.seed != 1 or r.point.cfg.train.accum_steps != 8
           else PointResult(r.point, NOT_FINISHED) for r in results(first, lambda p: 0.5
                                                                   + 0.0001 * p.cfg.seed)]
    assert st.next(bad) is None
    assert st.replay.fill == [pytest.approx(0.5002)]
    assert st.replay.states[-1].verdict.tolist() == [sq.UNDECIDED]


def test_budgets_stop_before_a_round_that_would_overrun_them() -> None:
    def loss(p):
        return 0.5 + 0.01 * math.sin(p.cfg.seed * 7 + p.cfg.train.accum_steps)

    for settings, why in (({"budget_runs": 7}, "budget_runs: the next round needs 4 runs, 1 "
                           "left"),
                          ({"budget_cpu_s": 95}, "budget_cpu_s: the next round needs ~40 "
                           "CPU-s, 35 left")):
        st = strategy(GRID, n0=3, step=2, max_seeds=9, margin=0.0001, power=0.01, **settings)
        assert st.next(results(st.initial(), loss)) is None
        assert st.stopped == why


@pytest.mark.slow
def test_a_killed_adaptive_study_resumes_and_plans_the_same_runs(tmp_path: Path, monkeypatch,
                                                                  capsys) -> None:
    """Run to completion on one store; on another, kill after round 1 (Ctrl-C as the
    strategy plans round 2) and re-run the same command: same runs, same verdicts.

    The command names ``adaptive``; the test registers, under that name, the real strategy
    with one step more (a subclass): it keeps each instance to read its final state, and the
    killed run's raises Ctrl-C as it plans round 2 (a real SIGINT lands at a time the test
    cannot choose). The sweeper is untouched: it looks the name up in the registry.
    """
    from hydra.core.global_hydra import GlobalHydra

    from stability import cli

    finals: list[AdaptiveStrategy] = []

    class Recording(AdaptiveStrategy):
        def next(self, results):
            out = super().next(results)
            finals.append(self)
            return out

    class Killed(AdaptiveStrategy):
        def next(self, results):
            raise KeyboardInterrupt

    def sweep(store: Path, strategy: type[AdaptiveStrategy]) -> int:
        monkeypatch.setitem(strategy_registry.STRATEGIES, "adaptive", strategy)
        monkeypatch.setattr(sys, "argv", [
            "stability-sweep", "-m", *TINY, "hydra/launcher=basic", "clip.enabled=false",
            "train.accum_steps=1,4", "precision=fp32", "seed=0",
            f"tracking.uri=sqlite:///{store / 'mlflow.db'}", "tracking.experiment=adaptive",
            f"hydra.sweep.dir={store / 'sweep'}", "hydra.sweeper.strategy=adaptive",
            "hydra.sweeper.adaptive.n0=2", "hydra.sweeper.adaptive.step=1",
            "hydra.sweeper.adaptive.max_seeds=4", "hydra.sweeper.adaptive.margin=0.0001",
            "hydra.sweeper.adaptive.power=0.01"])
        try:
            cli.sweep()
            return 0
        except SystemExit as stop:
            return int(stop.code or 0)
        finally:
            GlobalHydra.instance().clear()

    def finished(store: Path) -> set[tuple[str, int]]:
        c = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
        exp = c.get_experiment_by_name("adaptive")
        return {(r.data.tags["stability.fingerprint"], int(r.data.tags["stability.seed"]))
                for r in c.search_runs([exp.experiment_id], "attributes.status = 'FINISHED' and "
                                       "tags.`stability.kind` = 'train'", max_results=100)}

    assert sweep(tmp_path / "whole", Recording) == 0
    whole = finals[-1]
    assert len(whole.replay.states) >= 2  # the study went past round 1

    assert sweep(tmp_path / "resumed", Killed) == 130
    assert len(finished(tmp_path / "resumed")) == 4  # round 1: 2 configs x n0=2
    capsys.readouterr()
    assert sweep(tmp_path / "resumed", Recording) == 0
    out = capsys.readouterr().out
    resumed = finals[-1]

    assert finished(tmp_path / "resumed") == finished(tmp_path / "whole")
    assert "skipped 4 points already FINISHED" in out
    assert resumed.replay.states[-1].verdict.tolist() == whole.replay.states[-1].verdict.tolist()
    assert [s.looks for s in resumed.replay.states] == [s.looks for s in whole.replay.states]
    np.testing.assert_array_equal(*(np.isfinite(s.arrays()[0]) for s in (resumed, whole)))
    np.testing.assert_allclose(resumed.arrays()[0], whole.arrays()[0], equal_nan=True)
