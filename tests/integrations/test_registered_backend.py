"""A backend registered with ``register()`` is swept, reported and checked like a built-in.

``mirror`` is a whole backend (``protocol.Backend``) registered here: our own loop under another
name (it hands every member to ``integrations.ours`` and counts the calls), so what it trains,
rebuilds, evaluates and checks is real. Its task is the default task declaring
``trainer = "mirror"`` on tiny data. The point goes through the real job (``run_job``, an
embedded SQLite store), the winner through the report's ``evaluate_winner`` and
``load_winner``, the check through ``check.run.run_check``: none of them names a backend.
A trainer's half written to the documented protocol without a check adapter is refused by the
check with one line naming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from torch import nn

from stability.core.config import ConfigError, RunConfig, to_run_config
from stability.core.identity import fingerprint
from stability.core.loop import RunResult
from stability.core.sinks import StepSink
from stability.core.task import Task
from stability.integrations import backends, ours
from stability.integrations.protocol import Probe
from stability.sweep.job import run_job
from stability.tasks.sign_sum import SignSumTask
from tests.helpers.stores import sqlite_store
from tests.integrations.test_study import _raw
from tests.test_registries import Counting

TARGET = "tests.integrations.test_registered_backend.MirrorTask"
TINY = ("data.num_samples=300", "model.hidden_size=8", "train.epochs=2", "seed=3")


class MirrorTask(SignSumTask):
    """The default task, trained by the ``mirror`` backend."""

    trainer: ClassVar[str] = "mirror"
    hash_target: ClassVar[bool] = True


class Mirror:
    """Our loop under another name: every member is ``integrations.ours``'s, counted."""

    unused_params: ClassVar[tuple[str, ...]] = ("telemetry.update_ratio",)

    def __init__(self) -> None:
        self.calls: list[str] = []

    def preflight(self, cfg: RunConfig, world_size: int = 1) -> None:
        self.calls.append("preflight")

    def train(self, cfg: RunConfig, sinks: Sequence[StepSink] = (),
              world_size: int = 1) -> RunResult:
        self.calls.append("train")
        return ours.train(cfg, sinks, world_size)

    def task(self, cfg: RunConfig) -> Task:
        self.calls.append("task")
        return ours.task(cfg)

    def model_builder(self, cfg: RunConfig, task: Task) -> Callable[[], nn.Module]:
        self.calls.append("model_builder")
        return ours.model_builder(cfg, task)

    def evaluate(self, cfg: RunConfig, task: Task, model: nn.Module, dataset: Any,
                 device: str) -> dict[str, float]:
        self.calls.append("evaluate")
        return ours.evaluate(cfg, task, model, dataset, device)

    def example(self, cfg: RunConfig, task: Task, model: nn.Module) -> tuple[nn.Module, Any]:
        self.calls.append("example")
        return ours.example(cfg, task, model)

    def probe(self, cfg: RunConfig, task: Task) -> Probe:
        self.calls.append("probe")
        return ours.probe(cfg, task)


@pytest.fixture
def mirror() -> Iterator[Mirror]:
    backend = Mirror()
    backends.register("mirror", backend)
    yield backend
    del backends.BACKENDS["mirror"]


def test_a_registered_backend_is_swept_reported_and_checked(mirror: Mirror,
                                                           tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from stability.check.result import Status
    from stability.check.run import CheckConfig, run_check
    from stability.report.evidence.fetch import fetch_runs, find_sweep
    from stability.report.sealed.evaluate import evaluate_winner, load_winner

    uri = sqlite_store(tmp_path / "mlflow.db")
    raw = _raw(tmp_path / "run", TARGET, *TINY, f"tracking.uri={uri}",
               "tracking.experiment=mirror", "tracking.sweep_id=m-1")
    best = run_job(raw)  # the sweep's job: backends.of -> preflight -> train, tracked
    assert math.isfinite(best) and mirror.calls == ["preflight", "train"]
    assert (tmp_path / "run" / "steps.csv").exists()
    cfg = to_run_config(raw)
    assert backends.of(cfg) is mirror

    c = MlflowClient(uri)
    runs = fetch_runs(c, find_sweep(c, "mirror", "m-1"), [TARGET], workers=1)
    [run] = runs.to_dict("records")
    params = c.get_run(run["run_id"]).data.params
    assert params["trainer"] == "mirror"  # the backend's name, and its unused params left out
    assert "telemetry.update_ratio" not in params and params["train.batch_size"] == "64"
    winner = fingerprint(cfg)
    assert run["fingerprint"] == winner

    mirror.calls.clear()  # the report: the winner rebuilt and tested by its backend
    got = evaluate_winner(c, runs, winner, tmp_path / "report", device="cpu", workers=1,
                          allowed=[TARGET])
    [seed] = got.seeds
    assert seed.logged and math.isfinite(seed.test_loss) and 0.0 <= seed.test_acc <= 1.0
    assert mirror.calls == ["task", "model_builder", "evaluate"]
    assert "test_loss" in c.get_run(run["run_id"]).data.metrics
    loadable = load_winner(c, run["run_id"], tmp_path / "load", winner, [TARGET])
    assert loadable.example.shape[0] == ours.EXAMPLE_ROWS and "example" in mirror.calls

    mirror.calls.clear()  # the check: its probes on the backend's adapter
    results, _ = run_check(cfg, CheckConfig(output=str(tmp_path / "check.json")))
    assert mirror.calls == ["task", "probe"]
    assert results and not [r.name for r in results if r.status is Status.FAIL]


def test_a_backend_without_a_check_adapter_is_refused_naming_it(tmp_path: Path) -> None:
    """A trainer's half written to the documented protocol (no ``probe``) is swept and
    reported (tests/test_registries.py); the check refuses it in one line."""
    from stability.check.run import CheckConfig, run_check

    backends.register("counting", Counting())
    try:
        cfg = to_run_config(_raw(tmp_path / "run", "tests.test_registries.CountingTask",
                                 "tracking.enabled=false"))
        with pytest.raises(ConfigError) as err:
            run_check(cfg, CheckConfig())
    finally:
        del backends.BACKENDS["counting"]
    assert str(err.value) == (
        "task._target_='tests.test_registries.CountingTask' declares trainer='counting', whose "
        "backend has no check adapter: allowed values are a backend defining probe(task, cfg) "
        "(docs/integrations.md)")
