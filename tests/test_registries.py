"""Registries, not special cases: a new sweep strategy or trainer backend plugs in by name.

A throwaway strategy registered here runs from the real sweeper (in-process, the real conf/)
with its own settings block validated by its own settings type; the sweeper is not touched.
A throwaway trainer backend registered here trains a task that declares it through the real
job and ``integrations.study``; the backend is the thing under test, so it trains nothing
real (it stands in for a trainer we do not own: its ``run`` only counts the call).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from stability.core.config import ConfigError, RunConfig, to_run_config
from stability.core.task import Task, trainer_name
from stability.integrations import backends, protocol
from stability.sweep import strategy_registry
from stability.sweep.grid import SweepPoint
from stability.sweep.job import run_job
from stability.sweep.strategy_base import PointMaker, PointResult
from tests.integrations.test_study import ROOT, _raw
from tests.sweep.test_sweep import TINY

# --- a strategy of our own --------------------------------------------------------------------


@dataclass(frozen=True)
class FirstsSettings:
    """``hydra.sweeper.firsts``: how many grid points to run."""

    count: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ConfigError(f"hydra.sweeper.firsts.count={self.count!r} is invalid: allowed "
                              "values are an integer >= 1")


class Firsts:
    """Runs the grid's first ``count`` points in one round, says so, and stops."""

    settings_type: ClassVar[type] = FirstsSettings
    reads_losses: ClassVar[bool] = False
    RESULTS: ClassVar[list[PointResult]] = []

    def __init__(self, points: Sequence[SweepPoint], make: PointMaker,
                 settings: FirstsSettings) -> None:
        self.points, self.settings = list(points), settings
        self._said = [f"firsts: {settings.count} of {len(points)} points"]

    def initial(self) -> list[SweepPoint]:
        return self.points[:self.settings.count]

    def next(self, results: Sequence[PointResult]) -> list[SweepPoint] | None:
        Firsts.RESULTS.extend(results)
        return None

    def tags(self) -> dict[str, str]:
        return {}

    def lines(self) -> list[str]:
        out, self._said = self._said, []
        return out


class Mute:
    """A half-written strategy: no ``lines``."""

    settings_type: ClassVar[type] = FirstsSettings
    reads_losses: ClassVar[bool] = False
    initial, next, tags = Firsts.initial, Firsts.next, Firsts.tags


@pytest.fixture
def firsts() -> Iterator[None]:
    strategy_registry.register("firsts", Firsts)
    Firsts.RESULTS.clear()
    yield
    del strategy_registry.STRATEGIES["firsts"]


def in_process_sweep(monkeypatch, tmp_path: Path, *args: str) -> int:
    """``stability sweep -m`` on a two-point grid, in-process; its exit status."""
    from hydra.core.global_hydra import GlobalHydra

    from stability import cli

    monkeypatch.setattr(sys, "argv", [
        "stability-sweep", "-m", *TINY, "hydra/launcher=basic", "clip.enabled=false",
        "train.accum_steps=1,4", "precision=fp32", "seed=0", "tracking.enabled=false",
        f"hydra.sweep.dir={tmp_path / 'sweep'}", *args])
    try:
        cli.sweep()
        return 0
    except SystemExit as stop:
        return int(stop.code or 0)
    finally:
        GlobalHydra.instance().clear()


def test_a_registered_strategy_runs_from_the_sweeper_with_its_own_settings(
        firsts, tmp_path: Path, monkeypatch, capsys) -> None:
    assert in_process_sweep(monkeypatch, tmp_path, "hydra.sweeper.strategy=firsts",
                            "+hydra.sweeper.firsts.count=1") == 0
    out = capsys.readouterr().out
    assert "[sweep] firsts: 1 of 2 points" in out
    assert "grid=4, unique=1, launched=1, skipped_done=0, not_finished=0" in out
    [result] = Firsts.RESULTS
    assert result.status == "finished" and result.point.cfg.train.accum_steps == 1
    assert [p.name for p in (tmp_path / "sweep").glob("*/steps.csv")] == ["steps.csv"]


@pytest.mark.parametrize(("args", "message"), [
    (["+hydra.sweeper.firsts.cout=2"],
     "error: hydra.sweeper.firsts.cout is unknown: allowed keys are count"),
    (["+hydra.sweeper.firsts.count=0"],
     "error: hydra.sweeper.firsts.count=0 is invalid: allowed values are an integer >= 1"),
    (["+hydra.sweeper.first.count=2"],
     "error: hydra.sweeper.first is unknown: allowed keys are the sweeper's "
     "(conf/hydra/sweeper/study.yaml) and a strategy's settings (grid, adaptive, decide, firsts)"),
])
def test_a_bad_strategy_setting_is_one_line_and_exit_2(firsts, tmp_path: Path, monkeypatch,
                                                        capsys, args: list[str],
                                                        message: str) -> None:
    assert in_process_sweep(monkeypatch, tmp_path, "hydra.sweeper.strategy=firsts", *args) == 2
    assert capsys.readouterr().err.strip() == message
    assert not list((tmp_path / "sweep").glob("*/steps.csv"))  # nothing ran


def test_the_registry_names_what_it_refuses(firsts) -> None:
    assert strategy_registry.load_strategy("firsts") is Firsts
    assert strategy_registry.names() == ("grid", "adaptive", "decide", "firsts")
    with pytest.raises(ValueError, match="'firsts' is taken"):
        strategy_registry.register("firsts", Mute)
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.strategy=tests.test_registries.Mute "
                                          r"is invalid: Mute lacks lines \(allowed values: a "
                                          r"strategy defining settings_type, reads_losses"):
        strategy_registry.load_strategy("tests.test_registries.Mute")
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.strategy=nope is invalid: allowed "
                                          r"values are grid, adaptive, decide, firsts or an "
                                          r"importable"):
        strategy_registry.load_strategy("nope")


# --- a trainer backend of our own -------------------------------------------------------------


class CountingTask:
    """A task trained by the ``counting`` backend: what that backend requires, nothing more."""

    trainer = "counting"

    def model(self) -> nn.Module:
        return nn.Linear(2, 1)

    def sealed_test(self, *, winner: str) -> Any:
        raise AssertionError("not opened here")


class UnknownTrainerTask(CountingTask):
    trainer = "nobody"


class NotANameTask(CountingTask):
    trainer = 3


@dataclass
class Recorder:
    """What ``study.train`` reads of a trainer's recorder once the fit has ended."""

    best_val_loss: float = 0.25
    best_epoch: int = 1
    epochs: list = None  # type: ignore[assignment]
    closed: bool = False

    def close(self) -> None:
        self.closed = True

    def summary(self) -> dict[str, float]:
        return {"best_val_loss": self.best_val_loss, "clip_fraction": 0.0, "skip_count": 0}


class Counting:
    """A trainer backend that counts what ``study`` asks of it."""

    REQUIRED = ("model", "sealed_test")

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.recorder = Recorder(epochs=[])

    def check(self, task: Task, cfg: RunConfig, device: str) -> None:
        self.calls.append("check")

    def prepare(self, task: Task, cfg: RunConfig, device: str, folder: Path,
                sinks: Sequence[Any]) -> protocol.Fit:
        self.calls.append("prepare")
        callback = type("Callback", (), {"recorder": self.recorder})()
        return protocol.Fit(task.model(), callback, lambda: self.calls.append("run"))

    def rebuild(self, task: Task, cfg: RunConfig) -> nn.Module:
        self.calls.append("rebuild")
        return task.model()

    def evaluate(self, task: Task, cfg: RunConfig, model: nn.Module, dataset: Any,
                 device: str) -> dict[str, float]:
        self.calls.append("evaluate")
        return {"loss": 0.5, "acc": 1.0}

    def example(self, task: Task, model: nn.Module) -> tuple[nn.Module, Any]:
        self.calls.append("example")
        return model, torch.zeros(1, 2).numpy()


@pytest.fixture
def counting() -> Iterator[Counting]:
    backend = Counting()
    backends.register("counting", backend)
    yield backend
    del backends.BACKENDS["counting"]


def test_a_registered_backend_trains_the_tasks_that_declare_it(counting: Counting,
                                                               tmp_path: Path) -> None:
    raw = _raw(tmp_path / "run", "tests.test_registries.CountingTask", "tracking.enabled=false")
    said: list[str] = []
    assert run_job(raw, say=said.append) == 0.25  # the real job -> study.train -> the backend
    # checked by the job before its run exists, then by study.train itself
    assert counting.calls == ["check", "check", "prepare", "run"] and counting.recorder.closed
    assert said[0].startswith("finished: best val_loss 0.2500 at epoch 1")
    assert (tmp_path / "run" / "config.yaml").exists()
    cfg = to_run_config(raw)
    backend = backends.of(cfg)  # the report's rebuild and evaluation go there too
    task = backend.task(cfg)
    make = backend.model_builder(cfg, task)
    assert isinstance(make(), nn.Linear)
    assert backend.evaluate(cfg, task, make(), [], "cpu") == {"loss": 0.5, "acc": 1.0}
    assert counting.calls[-3:] == ["rebuild", "rebuild", "evaluate"]
    assert isinstance(counting, protocol.TrainerBackend)


def test_core_passes_any_name_on_and_the_registry_refuses_an_unknown_one(
        counting: Counting, tmp_path: Path) -> None:
    raw = _raw(tmp_path / "run", "tests.test_registries.UnknownTrainerTask",
               "tracking.enabled=false")
    assert trainer_name(to_run_config(raw).task) == "nobody"  # core knows no trainer
    with pytest.raises(ConfigError) as err:
        run_job(raw, say=print)
    assert str(err.value) == ("task._target_='tests.test_registries.UnknownTrainerTask' declares "
                              "trainer='nobody': allowed values are ours | lightning | hf | "
                              "counting (or no trainer attribute: our loop)")
    assert not (tmp_path / "run" / "config.yaml").exists()  # refused before the run
    raw = _raw(tmp_path / "run", "tests.test_registries.NotANameTask", "tracking.enabled=false")
    with pytest.raises(ConfigError, match=r"declares trainer=3: allowed values are a backend's "
                                          r"registered name"):
        trainer_name(to_run_config(raw).task)
    with pytest.raises(ValueError, match="'counting' is taken"):
        backends.register("counting", Counting())


def test_a_backend_lacking_a_method_is_refused_naming_it(tmp_path: Path) -> None:
    class Half:  # a backend written as far as its check
        REQUIRED = ("model",)

        def check(self, task: Task, cfg: RunConfig, device: str) -> None:
            raise AssertionError("a backend that lacks a method is never called")

    backends.register("counting", Half())
    try:
        raw = _raw(tmp_path / "run", "tests.test_registries.CountingTask",
                   "tracking.enabled=false")
        with pytest.raises(ConfigError, match=r"declares trainer='counting', whose backend lacks "
                                              r"prepare, rebuild, evaluate, example \(allowed"):
            run_job(raw, say=print)
    finally:
        del backends.BACKENDS["counting"]


def test_the_registries_import_no_trainer_and_no_scipy() -> None:
    """The built-ins are import paths: looking a name up loads them, importing the registry
    (every sweep worker and the Hydra plugin do) loads neither Lightning, transformers nor
    the adaptive strategy's scipy."""
    code = ("import sys\n"
            "import stability.integrations.study, stability.sweep.sweeper\n"
            "print(sorted(m for m in ('lightning', 'transformers', 'accelerate', 'scipy')"
            " if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"
