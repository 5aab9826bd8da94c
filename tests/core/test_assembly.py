"""One run's assembly (``core.assembly``): the sinks' order, the best epoch, resume, summary.

Real sinks (``Diagnostics``, ``CsvStepWriter``, ``SkipRateMonitor``) on a tiny model; the
loop's and the trainers' end-to-end runs are in tests/core/test_resume.py and tests/integrations/.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from stability.core.assembly import InitialLoss, RunAssembly, standard_sinks
from stability.core.config import MonitorConfig
from stability.core.cost import CostMeter
from stability.core.monitor import Diagnostics, SkipRateMonitor
from stability.core.steplog import CsvStepWriter


class Extra:
    """A caller's sink without state (a plain callback)."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def on_step(self, log: object, epoch: int) -> None:
        """Nothing per step."""

    def on_epoch(self, log: object) -> None:
        self.epochs.append(log.epoch)  # type: ignore[attr-defined]


def _run(tmp: Path, model: nn.Module, *extras: object) -> RunAssembly:
    diag = Diagnostics()
    named = standard_sinks(diag, csv=CsvStepWriter(tmp / "steps.csv"), extras=list(extras),
                           loss_init=InitialLoss(), monitor=SkipRateMonitor(MonitorConfig()))
    return RunAssembly(named, diag, CostMeter("cpu"), best_path=tmp / "best.pt", model=model)


def test_the_sinks_are_named_in_our_loops_order(tmp_path: Path) -> None:
    run = _run(tmp_path, nn.Linear(2, 1), Extra(), Extra())
    assert list(run.sinks) == ["diagnostics", "csv", "extra0", "extra1", "loss_init", "monitor"]
    run.close()


def test_only_a_better_loss_is_the_best_epoch_and_nan_never_wins(tmp_path: Path) -> None:
    model, extra = nn.Linear(2, 1), Extra()
    run = _run(tmp_path, model, extra)
    run.epoch(1, 0.5, 0.9, 1.0, {"loss": 0.5, "mse": 0.25})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    run.epoch(2, math.nan, math.nan, 1.0)
    run.epoch(3, 0.7, 0.8, 1.0)
    assert run.best == (0.5, 1, 0.9) and [e.epoch for e in run.epochs] == [1, 2, 3]
    assert extra.epochs == [1, 2, 3]
    on_disk = torch.load(tmp_path / "best.pt")
    assert all(torch.equal(on_disk[k], saved[k]) for k in saved)
    summary = run.finish(None, 16.0, 0, 0, "diverged")
    assert summary["best_val_loss"] == 0.5 and summary["best_val_mse"] == 0.25
    assert summary["diverged"] == 1 and summary["skip_alerts"] == 0
    assert math.isnan(summary["loss_init"])


def test_a_resumed_run_keeps_its_best_weights_against_a_worse_epoch(tmp_path: Path) -> None:
    model = nn.Linear(2, 1)
    first = _run(tmp_path, model)
    first.epoch(1, 0.5, 0.9, 1.0)
    state = first.state_dict()
    first.close()
    before = (tmp_path / "best.pt").read_bytes()
    for restore in ("load_state_dict", "resume"):
        again = _run(tmp_path, model)
        if restore == "load_state_dict":
            again.load_state_dict(state)
        else:
            again.resume(list(first.epochs), first.best, {})
        again.epoch(2, 0.6, 0.95, 1.0)
        assert again.best == (0.5, 1, 0.9) and [e.epoch for e in again.epochs] == [1, 2]
        assert (tmp_path / "best.pt").read_bytes() == before
        again.close()


def test_a_trainer_summary_has_no_sink_it_lacks(tmp_path: Path) -> None:
    diag = Diagnostics()
    run = RunAssembly(standard_sinks(diag, csv=CsvStepWriter(tmp_path / "steps.csv")), diag,
                      CostMeter("cpu"))
    run.epoch(1, 0.5, 0.9, 1.0)
    summary = run.finish(None, math.nan, 0, 0, "finished")
    assert summary["diverged"] == 0 and summary["best_epoch"] == 1
    assert not {"loss_init", "skip_alerts"} & set(summary)
    assert not (tmp_path / "best.pt").exists()
