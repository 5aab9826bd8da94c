"""stability.compat: every dependency whose internals we touch is gated to the versions tested.

The first test fails loudly when an installed torch, mlflow, transformers or accelerate is
outside the range its compat module was read against: re-read the internals that module names,
then widen its ``GATE``. The rest pin what each module does, on the real dependency.
"""

from __future__ import annotations

import logging
import sqlite3
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from packaging.requirements import Requirement

from stability.compat import gate as gate_module
from stability.compat import hydra as compat_hydra
from stability.compat import mlflow as compat_mlflow
from stability.compat import torch as compat_torch
from stability.compat import transformers as compat_transformers
from stability.compat.gate import VersionGate, release
from stability.tracking.direct import DirectMetrics

ROOT = Path(__file__).resolve().parents[2]
GATES = [compat_torch.GATE, compat_mlflow.GATE, compat_hydra.GATE, compat_transformers.GATE,
         compat_transformers.ACCELERATE_GATE]


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.package)
def test_the_installed_version_is_one_the_compat_module_was_tested_with(
        gate: VersionGate) -> None:
    """An upgrade outside a gate fails here, naming the module and the internals to re-read."""
    assert gate.why_not() is None, gate.why_not()


def _declared() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values()
                                         for r in extra)]
    reqs = [Requirement(line) for line in lines]
    return {r.name: r for r in reqs if not r.extras}


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.package)
def test_pyproject_admits_no_version_the_gate_does_not(gate: VersionGate) -> None:
    """Widening a dependency in pyproject.toml fails here until its gate is widened too."""
    spec = _declared()[gate.package].specifier
    assert spec.contains(gate.low), f"{gate.package}: pyproject {spec} excludes {gate.low}"
    for beyond in (gate.below, f"{gate.below}.1", f"{gate.below}.99"):
        assert not spec.contains(beyond), f"{gate.package}: pyproject {spec} admits {beyond}"


@pytest.mark.parametrize(("version", "admitted"), [
    ("2.13", True), ("2.13.0", True), ("2.13.0+cpu", True), ("2.13.9", True),
    ("2.12.9", False), ("2.14", False), ("2.14.0", False), ("2.14.0rc1", False),
    ("2.14.0.dev20260101", False), ("3.0", False),
])
def test_a_gate_admits_its_range_only(version: str, admitted: bool) -> None:
    gate = VersionGate(package="torch", low="2.13", below="2.14",
                       module="stability/compat/torch.py", reads="x")
    assert gate.admits(version) is admitted
    assert (gate.why_not(version) is None) is admitted


def test_an_untested_version_is_said_once_in_one_line(caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate_module, "_warned", set())
    gate = VersionGate(package="torch", low="0.1", below="0.2",
                       module="stability/compat/torch.py", reads="the internals")
    with caplog.at_level(logging.WARNING, logger="stability.compat.gate"):
        assert gate.check() is False
        assert gate.check() is False
    assert [r.getMessage() for r in caplog.records] == [
        f"torch {torch.__version__} is outside >=0.1,<0.2, the range "
        "stability/compat/torch.py was tested with; it reads the internals"]


def test_release_refuses_what_is_not_a_version() -> None:
    assert release("1.16.0") == (1, 16, 0)
    with pytest.raises(ValueError, match="not a version"):
        release("main")


def _fp16_step(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer,
               w: torch.nn.Parameter) -> None:
    opt.zero_grad()
    scaler.scale((w * 2.0).sum()).backward()
    scaler.step(opt)
    scaler.update()


def test_restart_growth_streak_makes_the_scaler_wait_a_whole_interval_again() -> None:
    """After a restart, the scale grows only after ``growth_interval`` more clean steps."""
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
    _fp16_step(scaler, opt, w)  # one clean step of the two a growth needs
    compat_torch.restart_growth_streak(scaler)
    _fp16_step(scaler, opt, w)
    assert scaler.get_scale() == 8.0  # without the restart it would have doubled here
    _fp16_step(scaler, opt, w)
    assert scaler.get_scale() == 16.0


def test_restart_growth_streak_names_a_scaler_without_the_internal() -> None:
    with pytest.raises(RuntimeError, match="no _growth_tracker tensor"):
        compat_torch.restart_growth_streak(SimpleNamespace())


class _Trainer:
    """Stands in for a transformers ``Trainer``: the two bound methods
    ``wrap_measuring_points`` replaces, recording their calls (the real Trainer path is
    tests/integrations/test_hf.py)."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.accelerator = SimpleNamespace(unscale_gradients=self._unscale)

    def _unscale(self, optimizer: Any = None) -> str:
        self.calls.append(("unscale", optimizer))
        return "unscaled"

    def training_step(self, model: Any, inputs: Any, num_items: Any = None) -> float:
        self.calls.append(("step", inputs))
        return 0.5


def test_wrap_measuring_points_calls_back_after_each_method() -> None:
    trainer, seen = _Trainer(), []
    compat_transformers.wrap_measuring_points(
        trainer, lambda: seen.append(("after_unscale", trainer.calls[-1][0])),
        lambda loss, inputs: seen.append(("loss", loss, inputs)))
    assert trainer.accelerator.unscale_gradients("opt") == "unscaled"
    assert trainer.training_step("model", {"x": 1}) == 0.5
    assert trainer.training_step("model", inputs={"x": 2}) == 0.5
    assert seen == [("after_unscale", "unscale"), ("loss", 0.5, {"x": 1}),
                    ("loss", 0.5, {"x": 2})]
    assert trainer.calls == [("unscale", "opt"), ("step", {"x": 1}), ("step", {"x": 2})]


def test_wrap_measuring_points_refuses_a_trainer_without_them() -> None:
    with pytest.raises(RuntimeError, match="unscale_gradients or training_step"):
        compat_transformers.wrap_measuring_points(SimpleNamespace(), lambda: None,
                                                  lambda loss, inputs: None)


def test_an_untested_mlflow_sends_metrics_through_mlflow(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside the gate the direct writer never touches the tables: ``fallback`` gets all."""
    monkeypatch.setattr(gate_module, "_warned", set())
    monkeypatch.setattr(compat_mlflow, "GATE", VersionGate(
        package="mlflow", low="0.1", below="0.2", module="stability/compat/mlflow.py",
        reads="its SQL tables"))
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:  # the columns it knows: only the gate says no
        con.execute("CREATE TABLE metrics (key, value, timestamp, run_uuid, step, is_nan)")
        con.execute("CREATE TABLE latest_metrics (key, value, timestamp, step, is_nan, "
                    "run_uuid)")
    sent: list[tuple[str, list[Any]]] = []
    direct = DirectMetrics(db, lambda rid, pts: sent.append((rid, pts)))
    direct.log("r1", [("loss", 0.5, 1, 1000)])
    direct.close()
    assert direct.direct is False and sent == [("r1", [("loss", 0.5, 1, 1000)])]
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM metrics").fetchone() == (0,)
