"""The update-to-weight ratio ||delta theta|| / ||theta|| (core/layers.py): values and keep."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from stability.core import rundir
from stability.core.config import (
    ClipConfig,
    FaultConfig,
    PrecisionConfig,
    TelemetryConfig,
    to_run_config,
)
from stability.core.faults import FaultInjector
from stability.core.layers import LayerNormRecorder
from stability.core.loop import train
from stability.core.step import TrainStep
from stability.tasks.sign_sum import ModelConfig, SequenceClassifier


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 12, 1, generator=g)
    return x, (x.sum(dim=(1, 2)) > 0).float()


def _table(path: Path) -> list[list[str]]:
    with path.open() as f:
        return list(csv.reader(f))


def test_plain_sgd_moves_each_parameter_by_lr_times_its_gradient(tmp_path: Path) -> None:
    """SGD without momentum: delta theta = -lr * g, so the ratio is lr * ||g|| / ||theta||."""
    torch.manual_seed(0)
    model = SequenceClassifier(ModelConfig(hidden_size=8))
    lr = 0.1
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    rec = LayerNormRecorder(model, False, tmp_path / "n.csv", tmp_path / "u.csv")
    ts = TrainStep(model, opt, nn.BCEWithLogitsLoss(), precision=PrecisionConfig(),
                   clip=ClipConfig(), hooks=[FaultInjector(FaultConfig(inf_grad_at_step=2)),
                                             rec])
    names = [n for n, _ in model.named_parameters()]
    for i in range(3):
        before = [p.detach().clone() for p in model.parameters()]
        rec.on_step(ts.step([_batch(i)]))
        if i == 1:  # skipped: nothing moved
            assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(),
                                                          strict=True))
            continue
        grads = [p.grad for p in model.parameters()]
        after = [p.detach() for p in model.parameters()]  # ||theta|| after the step
        want = [lr * float(g.norm()) / float(a.norm()) for g, a in zip(grads, after,
                                                                       strict=True)]
        glob = (lr * math.sqrt(sum(float(g.norm()) ** 2 for g in grads))
                / math.sqrt(sum(float(a.norm()) ** 2 for a in after)))
        assert rec.rows  # reads the steps the device holds (the table reads them at its flush)
        row = rec.updates.rows[-1]
        assert row[0] == i + 1
        assert row[1] == pytest.approx(glob, rel=1e-4)
        assert row[2:] == pytest.approx(want, rel=1e-4)
    rec.flush()
    table = _table(tmp_path / "u.csv")
    assert table[0] == ["step", "global", *names]
    assert [float(v) for v in table[2][1:]] == [0.0] * (len(names) + 1)  # the skipped step
    assert len(rec.ratios) == 2  # the summary is over the steps taken
    summary = rec.summary()
    assert summary["update_ratio_max"] == max(rec.ratios) > 0


def _cfg(out: Path, update_ratio: bool) -> object:
    cfg = to_run_config({"seed": 1, "device": "cpu", "output_dir": str(out),
                         "data": {"num_samples": 200}, "train": {"epochs": 2, "batch_size": 32},
                         "fault": {"inf_grad_at_step": 3}})
    return dataclasses.replace(cfg, telemetry=TelemetryConfig(update_ratio=update_ratio))


def test_the_ratio_changes_no_step_and_lands_in_the_summary(tmp_path: Path) -> None:
    on = train(_cfg(tmp_path / "on", True))
    off = train(_cfg(tmp_path / "off", False))
    assert on.csv_path.read_bytes() == off.csv_path.read_bytes()
    assert (on.output_dir / rundir.LAYER_NORMS_NAME).read_bytes() == (
        off.output_dir / rundir.LAYER_NORMS_NAME).read_bytes()
    assert not (off.output_dir / rundir.LAYER_UPDATES_NAME).exists()
    assert "update_ratio_p50" not in off.summary
    table = _table(on.output_dir / rundir.LAYER_UPDATES_NAME)
    steps = _table(on.csv_path)
    assert len(table) == len(steps) and table[0][:2] == ["step", "global"]
    skipped = [r[0] for r in steps[1:] if r[5] == "1"]
    assert skipped == ["3"] and float(table[3][1]) == 0.0
    glob = [float(r[1]) for r in table[1:] if r[0] not in skipped]
    assert all(0 < g < 1 for g in glob)
    assert on.summary["update_ratio_max"] == pytest.approx(max(glob), rel=1e-6)
    assert 0 < on.summary["update_ratio_p50"] <= on.summary["update_ratio_max"]
