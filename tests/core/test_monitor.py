"""Skip-rate monitor (alert, abort as diverged) and per-run diagnostics."""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stability.core.config import (
    ClipConfig,
    FaultConfig,
    MonitorConfig,
    PrecisionConfig,
    RunConfig,
    TrainConfig,
)
from stability.core.loop import train
from stability.core.monitor import Diagnostics, DivergedError, SkipRateMonitor
from stability.core.steplog import StepLog
from stability.tasks.sign_sum import DataConfig


def test_alerts_only_when_rate_exceeds_threshold(caplog: pytest.LogCaptureFixture) -> None:
    """Rate == max_skip_rate is fine; strictly above alerts, once per excursion."""
    monitor = SkipRateMonitor(MonitorConfig(window=4, max_skip_rate=0.25, abort_after=100))
    with caplog.at_level(logging.WARNING, logger="stability.core.monitor"):
        # window after each update:  F / FF / FFF / FFFT=.25 / FFTT=.5 / FTTF / TTFF / TFFF=.25
        above = [monitor.update(s) for s in (False, False, False, True, True, False, False)]
        assert above == [False, False, False, False, True, True, True]
        assert monitor.alerts == 1
        assert monitor.update(False) is False
        assert monitor.rate == 0.25
        assert monitor.consecutive_above == 0
        assert monitor.update(True) is False  # FFFT = .25
        assert monitor.update(True) is True  # FFTT = .5: a new excursion
    assert monitor.alerts == 2
    assert len([r for r in caplog.records if "skip rate" in r.getMessage()]) == 2


def test_old_skips_roll_out_of_the_window() -> None:
    """The rate covers only the last ``window`` steps."""
    monitor = SkipRateMonitor(MonitorConfig(window=3, max_skip_rate=0.9, abort_after=100))
    for skipped in (True, True, True, False, False, False):
        monitor.update(skipped)
    assert monitor.rate == 0.0


def test_diverged_after_abort_after_consecutive_steps_above() -> None:
    """DivergedError on the abort_after-th consecutive step above; a dip resets the count."""
    monitor = SkipRateMonitor(MonitorConfig(window=4, max_skip_rate=0.5, abort_after=3))
    # window: T=1 / TF=.5 / TFF / TFFT=.5 / FFTT=.5 / FTTT=.75 / TTTT=1 / TTTT -> abort
    streaks = []
    for skipped in (True, False, False, True, True, True, True):
        monitor.update(skipped)
        streaks.append(monitor.consecutive_above)
    assert streaks == [1, 0, 0, 0, 0, 1, 2]
    with pytest.raises(DivergedError, match="monitor.abort_after=3"):
        monitor.update(True)


def _step(n: int, pre: float, clipped: bool = False, skipped: bool = False,
          reason: str = "", underflow: float = math.nan, param: str = "",
          skips: int = 0) -> StepLog:
    return StepLog(step=n, lr=1e-3, grad_l2_pre_clip=pre, grad_l2_post_clip=min(pre, 1.0),
                   loss=0.5, skipped=skipped, skip_reason=reason, scaler_scale=1.0,
                   clipped=clipped, micro_batches=1, samples=8, skips_cumulative=skips,
                   underflow_frac=underflow,
                   nonfinite_param=param)


def test_diagnostics_summary() -> None:
    """Clip count/fraction, norm percentiles over finite norms, skips by reason, first bad param."""
    diag = Diagnostics()
    norms = [0.5, 2.0, 3.0, 0.1, 8.0]
    for i, pre in enumerate(norms, start=1):
        diag.on_step(_step(i, pre, clipped=pre > 1.0, underflow=0.2 if i == 1 else math.nan))
    diag.on_step(_step(6, math.inf, skipped=True, reason="nonfinite_grad", param="rnn.bias_hh_l0",
                       skips=1))
    diag.on_step(_step(7, math.nan, skipped=True, reason="nonfinite_loss", skips=2))
    diag.on_step(_step(8, math.inf, skipped=True, reason="nonfinite_grad", param="head.weight",
                       skips=3))

    s = diag.summary()
    assert s["clip_count"] == 3
    assert s["clip_fraction"] == pytest.approx(3 / 8)
    assert s["skip_count"] == 3
    assert s["skip_nonfinite_grad"] == 2 and s["skip_nonfinite_loss"] == 1
    assert s["grad_norm_max"] == 8.0
    for q in (50, 90, 99):
        assert s[f"grad_norm_p{q}"] == pytest.approx(float(np.percentile(norms, q)))
    assert s["fp16_underflow_fraction"] == pytest.approx(0.2)
    assert s["first_nonfinite_param"] == "rnn.bias_hh_l0"
    assert s["first_nonfinite_step"] == 6


def test_empty_diagnostics_are_nan_not_errors() -> None:
    """No steps: fractions 0, norms nan, underflow nan."""
    s = Diagnostics().summary()
    assert s["clip_fraction"] == 0.0
    assert math.isnan(s["grad_norm_max"]) and math.isnan(s["fp16_underflow_fraction"])


def _run(tmp: Path, precision: str, init_scale: float = 2.0**16, **sections: Any) -> RunConfig:
    return RunConfig(
        seed=0, device="cpu", output_dir=str(tmp), data=DataConfig(num_samples=300),
        precision=PrecisionConfig(precision, init_scale=init_scale),
        train=TrainConfig(epochs=1, batch_size=16), **sections,
    )


def test_run_that_skips_every_step_ends_diverged(tmp_path: Path) -> None:
    """fp16 with an absurd initial scale overflows every step: the monitor ends the run."""
    cfg = _run(tmp_path, "fp16", init_scale=2.0**100,
               monitor=MonitorConfig(window=5, max_skip_rate=0.5, abort_after=3))
    result = train(cfg)
    assert result.status == "diverged"
    assert "monitor.abort_after=3" in result.reason
    assert result.summary["diverged"] == 1
    assert result.summary["skip_count"] == 3 == result.summary["optimizer_steps"]
    with result.csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert [r["skipped"] for r in rows] == ["1", "1", "1"]
    assert [float(r["scaler_scale"]) for r in rows] == [2.0**100, 2.0**99, 2.0**98]
    assert result.epochs == []


@pytest.mark.parametrize("precision", ["fp16", "fp32", "bf16"])
def test_run_diagnostics(tmp_path: Path, precision: str) -> None:
    """A run's summary: clip stats, fp16-only underflow share, first non-finite param."""
    cfg = _run(tmp_path, precision, clip=ClipConfig(enabled=True, max_norm=0.2),
               fault=FaultConfig(inf_grad_at_step=2), monitor=MonitorConfig(underflow_every=3))
    result = train(cfg)
    s = result.summary
    assert result.status == "finished"
    assert 0 < s["clip_count"] <= s["optimizer_steps"]
    assert s["clip_fraction"] == pytest.approx(s["clip_count"] / s["optimizer_steps"])
    assert s["grad_norm_p50"] <= s["grad_norm_p90"] <= s["grad_norm_p99"] <= s["grad_norm_max"]
    assert math.isfinite(s["grad_norm_max"])
    assert s["skip_nonfinite_grad"] == 1
    assert s["first_nonfinite_param"] == "rnn.weight_ih_l0"
    assert s["first_nonfinite_step"] == 2
    # The summary is the mean of the shares sampled in steps.csv (step 1 and every
    # monitor.underflow_every-th step), fp16 only; the share itself is pinned on a gradient
    # built to be half sub-fp16 in core/test_step.py.
    with result.csv_path.open() as f:
        sampled = [float(r["underflow_frac"]) for r in csv.DictReader(f)
                   if r["underflow_frac"] != "nan"]
    if precision == "fp16":
        assert len(sampled) >= 2
        assert s["fp16_underflow_fraction"] == pytest.approx(sum(sampled) / len(sampled))
    else:
        assert sampled == [] and math.isnan(s["fp16_underflow_fraction"])


def test_no_alert_before_the_window_holds_enough_steps(caplog: pytest.LogCaptureFixture) -> None:
    """One early skip is a 20% 'rate' over 5 steps: counted, but not alerted until 50 steps."""
    monitor = SkipRateMonitor(MonitorConfig(window=1000, max_skip_rate=0.05, abort_after=100))
    with caplog.at_level(logging.WARNING, logger="stability.core.monitor"):
        for skipped in (False,) * 4 + (True,):
            monitor.update(skipped)
        assert monitor.consecutive_above == 1 and monitor.alerts == 0
        for _ in range(44):  # the excursion lasts; at 50 steps the rate 1/50 is not above
            monitor.update(False)
        assert monitor.alerts == 0
        for _ in range(10):  # a real excursion after the window has 50+ steps is reported
            monitor.update(True)
    assert monitor.alerts == 1
    assert len([r for r in caplog.records if "skip rate" in r.getMessage()]) == 1


def test_monitor_state_dict_continues_the_window_and_the_excursion(
        caplog: pytest.LogCaptureFixture) -> None:
    """A monitor restored from ``state_dict`` behaves as the one never interrupted."""
    cfg = MonitorConfig(window=4, max_skip_rate=0.25, abort_after=5)
    whole, first = SkipRateMonitor(cfg), SkipRateMonitor(cfg)
    for skipped in (False, True, True):  # above twice, too few steps to alert yet
        whole.update(skipped)
        first.update(skipped)
    resumed = SkipRateMonitor(cfg)
    resumed.load_state_dict(first.state_dict())
    assert resumed.state_dict() == first.state_dict() == {
        "window": [False, True, True], "consecutive_above": 2, "alerts": 0, "alerted": False}
    with caplog.at_level(logging.WARNING, logger="stability.core.monitor"):
        # FTTF: above, the window is full: one alert; TTFF: still above (4 in a row)
        assert [resumed.update(s) for s in (False, False)] == [True, True]
        assert [whole.update(s) for s in (False, False)] == [True, True]
        assert resumed.state_dict() == whole.state_dict()
        assert resumed.rate == 0.5 and resumed.alerts == 1
        for m in (whole, resumed):  # TFFT: the fifth consecutive step above ends both alike
            with pytest.raises(DivergedError, match="for 5 consecutive steps"):
                m.update(True)
    assert len([r for r in caplog.records if "skip rate" in r.getMessage()]) == 2


def test_diagnostics_state_dict_round_trip_and_epoch_counts() -> None:
    """The run's counts survive ``state_dict``; the epoch's restart at every ``on_epoch``."""
    diag = Diagnostics()
    diag.on_step(_step(1, 2.0, clipped=True), epoch=1)
    diag.on_step(_step(2, math.inf, skipped=True, reason="nonfinite_grad", param="w", skips=1),
                 epoch=1)
    e1 = diag.epoch_record(1, val_loss=0.4, val_acc=0.9, seconds=1.0)
    assert (e1.steps, e1.skip_count, e1.clip_fraction, e1.max_grad_norm, e1.train_loss) == (
        2, 1, 0.5, 2.0, 0.5)
    diag.on_epoch(e1)
    resumed = Diagnostics()
    resumed.load_state_dict(diag.state_dict())
    for d in (diag, resumed):
        d.on_step(_step(3, 3.0, skips=1), epoch=2)
        e2 = d.epoch_record(2, val_loss=0.3, val_acc=0.95, seconds=1.0)
        assert (e2.steps, e2.skip_count, e2.max_grad_norm) == (1, 0, 3.0)
    assert resumed.summary() == diag.summary()
    assert resumed.summary()["first_nonfinite_param"] == "w"
    assert resumed.summary()["skip_count"] == 1 and resumed.summary()["grad_norm_max"] == 3.0
