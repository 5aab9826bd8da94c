"""A run's cost on its device: median seconds per optimizer step and peak memory."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from stability.core.config import RunConfig, TrainConfig
from stability.core.cost import COST_METRICS, CostMeter
from stability.core.loop import train
from stability.tasks.sign_sum import DataConfig


def test_median_step_time_ignores_a_slow_first_step() -> None:
    """The median is the typical step: one cold-start step does not move it."""
    meter = CostMeter("cpu")
    for seconds in (5.0, 0.010, 0.012, 0.011):
        meter.on_step(seconds)
    assert meter.summary()["step_time_median_s"] == pytest.approx(0.0115)
    assert math.isnan(CostMeter("cpu").summary()["step_time_median_s"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_cpu_peak_is_this_runs_peak_not_the_process_lifetime() -> None:
    """A big allocation before the meter starts does not count; one during the run does."""
    before = torch.ones(64 * 2**20 // 4)  # 64 MiB, freed before the run
    before.add_(1)
    del before
    quiet = CostMeter("cpu").summary()["peak_memory_mb"]
    meter = CostMeter("cpu")
    during = torch.ones(128 * 2**20 // 4)  # 128 MiB touched during the "run"
    during.add_(1)
    loud = meter.summary()["peak_memory_mb"]
    del during
    assert loud - quiet > 100


def test_a_run_records_its_cost(tmp_path: Path) -> None:
    """train() puts both cost metrics into the run's summary (logged to MLflow as metrics)."""
    cfg = RunConfig(seed=0, device="cpu", output_dir=str(tmp_path),
                    data=DataConfig(num_samples=200), train=TrainConfig(epochs=1, batch_size=16))
    summary = train(cfg).summary
    assert set(COST_METRICS) <= set(summary)
    assert 0 < summary["step_time_median_s"] < summary["wall_time_s"]
    if sys.platform.startswith("linux"):
        assert summary["peak_memory_mb"] > 0
