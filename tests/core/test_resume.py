"""Resume in-process: a run stopped after an epoch continues from ``checkpoints/last.pt``.

The checkpoint holds ``{name: state_dict()}`` of the trainer and of every step sink
(``core.sinks``); the resumed run's ``steps.csv`` and ``layer_norms.csv`` are byte-identical to
an uninterrupted run's, from today's checkpoint format and from the previous one (format 1).
The killed-process version of this (SIGKILL of a real worker) is in
tests/tracking/test_durability.py.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from stability.core import rundir
from stability.core.config import RunConfig, to_run_config
from stability.core.loop import train
from stability.core.steplog import EpochLog, StepLog


class Stop(Exception):
    """Ends a run the way a kill would: no ``finished``, the checkpoint stays."""


class StopAtEpoch:
    """A caller's sink (no state) that stops the run at the first step of ``epoch``."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_step(self, log: StepLog, epoch: int) -> None:
        if epoch == self.epoch:
            raise Stop

    def on_epoch(self, log: EpochLog) -> None:
        pass


def _cfg(out: Path) -> RunConfig:
    # fp16 with an injected inf gradient and a window: the scaler, the skip counters, the
    # monitor's window and the diagnostics all carry state across the resume point.
    return to_run_config({
        "seed": 4, "device": "cpu", "output_dir": str(out),
        "data": {"num_samples": 200}, "train": {"epochs": 4, "batch_size": 32, "accum_steps": 2},
        "precision": {"name": "fp16"}, "clip": {"enabled": True, "max_norm": 0.5},
        "fault": {"inf_grad_at_step": 3}, "telemetry": {"per_layer": True},
    })


def _to_format_1(state: dict[str, Any]) -> dict[str, Any]:
    """Today's checkpoint written the way format 1 (main before issue 20) wrote it."""
    t, sinks, rng = state["trainer"], state["sinks"], state["rng"]
    m, d = sinks["monitor"], sinks["diagnostics"]
    return {
        "format": 1, "identity": state["identity"], "epoch": state["epoch"],
        "step": t["step"], "grad_syncs": t["grad_syncs"], "csv_bytes": sinks["csv"]["bytes"],
        "skips": t["skips"], "epochs": state["epochs"], "best": state["best"],
        "best_metrics": state["best_metrics"], "model": state["model"],
        "optimizer": state["optimizer"], "scaler": t["scaler"], "scheduler": t["scheduler"],
        "shuffle": rng["shuffle"], "torch_rng": rng["torch"], "cuda_rng": rng["cuda"],
        "numpy_rng": rng["numpy"], "python_rng": rng["python"],
        "monitor": {"_window": m["window"], "_skips_in_window": sum(m["window"]),
                    "consecutive_above": m["consecutive_above"], "alerts": m["alerts"],
                    "_alerted": m["alerted"], "_min_steps_to_alert": 50},
        "diag": {k: d[k] for k in ("steps", "clip_count", "skip_count", "skip_reasons",
                                   "first_nonfinite_param", "first_nonfinite_step")}
        | {"_norms": d["norms"], "_underflow": d["underflow"]},
    }


@pytest.mark.parametrize("fmt", [2, 1])
def test_stopped_run_resumes_byte_identical(tmp_path: Path, fmt: int,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """Stopped in epoch 3, run again: the same steps.csv, per-layer table and summary."""
    whole = train(_cfg(tmp_path / "whole"))
    out = tmp_path / "stopped"
    with pytest.raises(Stop):
        train(_cfg(out), sinks=[StopAtEpoch(3)])
    last = out / rundir.RESUME_NAME
    state = torch.load(last, weights_only=True)
    assert state["format"] == 2 and state["epoch"] == 2
    assert set(state["sinks"]) == {"layers", "diagnostics", "csv", "loss_init", "monitor"}
    assert state["trainer"]["skips"] == 1 and state["sinks"]["diagnostics"]["skip_count"] == 1
    if fmt == 1:
        torch.save(_to_format_1(state), last)
    with caplog.at_level(logging.INFO, logger="stability.core.checkpoint"):
        resumed = train(_cfg(out))
    assert "resuming after epoch 2" in caplog.text
    for name in (rundir.CSV_NAME, rundir.LAYER_NORMS_NAME, rundir.LAYER_UPDATES_NAME):
        assert (out / name).read_bytes() == (whole.output_dir / name).read_bytes(), name
    assert [e.epoch for e in resumed.epochs] == [1, 2, 3, 4]
    drop = {"wall_time_s", "step_time_median_s", "step_cpu_median_s", "peak_memory_mb"}
    if fmt == 1:  # a checkpoint from before loss_init and the update ratios cannot know them
        assert math.isnan(resumed.summary["loss_init"]) and whole.summary["loss_init"] > 0
        drop |= {"loss_init", "update_ratio_p50", "update_ratio_max"}
    for key, value in whole.summary.items():
        if key not in drop:
            assert resumed.summary[key] == value, key
    assert [e.train_loss for e in resumed.epochs] == [e.train_loss for e in whole.epochs]
    assert not last.exists()


def test_checkpoint_of_another_format_is_ignored(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """An unknown format starts over (with a warning) instead of failing or misreading."""
    out = tmp_path / "run"
    with pytest.raises(Stop):
        train(_cfg(out), sinks=[StopAtEpoch(2)])
    last = out / rundir.RESUME_NAME
    torch.save(torch.load(last, weights_only=True) | {"format": 99}, last)
    with caplog.at_level(logging.WARNING, logger="stability.core.checkpoint"):
        result = train(_cfg(out))
    assert "ignoring" in caplog.text and "format" in caplog.text
    assert [e.epoch for e in result.epochs] == [1, 2, 3, 4]
    steps = [int(line.split(",")[0]) for line in
             (out / rundir.CSV_NAME).read_text().splitlines()[1:]]
    assert steps == list(range(1, result.summary["optimizer_steps"] + 1))  # started over
