"""Run health: a rolling skip-rate monitor that can end a run as diverged, and the run's counts.

Both are step sinks (``core.sinks.StepSink``): the loop feeds them every ``StepLog``, and
their ``state_dict`` goes into the resume checkpoint.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stability.core.config import MonitorConfig
from stability.core.steplog import EpochLog, StepLog

log = logging.getLogger(__name__)


MIN_STEPS_TO_ALERT = 50


class DivergedError(RuntimeError):
    """The skip rate stayed above ``monitor.max_skip_rate`` for ``monitor.abort_after`` steps."""


class SkipRateMonitor:
    """Rolling skip rate over the last ``window`` optimizer steps.

    Alerts (once per excursion) when the rate exceeds ``max_skip_rate`` and raises
    ``DivergedError`` when it stays above for ``abort_after`` consecutive steps.
    """

    def __init__(self, cfg: MonitorConfig) -> None:
        self.cfg = cfg
        self._window: deque[bool] = deque(maxlen=cfg.window)
        self._skips_in_window = 0
        self.consecutive_above = 0
        self.alerts = 0
        self._alerted = False  # this excursion above the threshold has been reported
        # One skip in the first five steps is a 20% "rate": no alert until the window holds
        # enough steps for a rate to mean something (the abort count runs from the start).
        self._min_steps_to_alert = min(cfg.window, MIN_STEPS_TO_ALERT)

    @property
    def rate(self) -> float:
        """Skip rate over the current window."""
        return self._skips_in_window / len(self._window) if self._window else 0.0

    def on_step(self, log: StepLog, epoch: int = 0) -> None:
        """``StepSink``: record the step (raises ``DivergedError``)."""
        self.update(log.skipped)

    def on_epoch(self, log: EpochLog) -> None:
        """``StepSink``: the window runs across epochs."""

    def state_dict(self) -> dict[str, Any]:
        """The window and the excursion state (``load_state_dict`` continues them)."""
        return {"window": [bool(x) for x in self._window], "consecutive_above":
                self.consecutive_above, "alerts": self.alerts, "alerted": self._alerted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict`` (the window keeps this monitor's ``cfg.window``)."""
        self._window = deque((bool(x) for x in state["window"]), maxlen=self.cfg.window)
        self._skips_in_window = sum(self._window)
        self.consecutive_above = int(state["consecutive_above"])
        self.alerts = int(state["alerts"])
        self._alerted = bool(state["alerted"])

    def update(self, skipped: bool) -> bool:
        """Record one step; returns True if the rate is above the threshold now."""
        if len(self._window) == self._window.maxlen:
            self._skips_in_window -= self._window[0]
        self._window.append(skipped)
        self._skips_in_window += skipped
        above = self.rate > self.cfg.max_skip_rate
        if above:
            if not self._alerted and len(self._window) >= self._min_steps_to_alert:
                self._alerted = True
                self.alerts += 1
                log.warning("skip rate %.3f > %.3f over the last %d steps",
                            self.rate, self.cfg.max_skip_rate, len(self._window))
            self.consecutive_above += 1
            if self.consecutive_above >= self.cfg.abort_after:
                raise DivergedError(
                    f"skip rate {self.rate:.3f} above monitor.max_skip_rate="
                    f"{self.cfg.max_skip_rate} for {self.consecutive_above} consecutive steps "
                    f"(monitor.abort_after={self.cfg.abort_after})"
                )
        else:
            self.consecutive_above = 0
            self._alerted = False
        return above


@dataclass
class _EpochCounts:
    """One epoch's steps: the losses and pre-clip norms of those taken, clips and skips."""

    steps: int = 0
    clipped: int = 0
    skipped: int = 0
    losses: list[float] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)

    def add(self, s: StepLog) -> None:
        self.steps += 1
        self.clipped += s.clipped
        self.skipped += s.skipped
        if not s.skipped:
            self.losses.append(s.loss)
            self.norms.append(s.grad_l2_pre_clip)


@dataclass
class Diagnostics:
    """The run's counts from ``StepLog`` records, and the current epoch's (one owner).

    The run's (``summary``): clips, skips by reason, the first non-finite parameter, the
    pre-clip norms and fp16 underflow shares; the step and skip totals are the step's own
    (``StepLog.step``, ``skips_cumulative``, counted once by ``StepMeter``). The epoch's
    (``epoch_record``): the losses and norms of the steps taken, clips, skips and steps;
    ``on_epoch`` starts the next one.
    """

    steps: int = 0
    clip_count: int = 0
    skip_count: int = 0
    skip_reasons: dict[str, int] = field(default_factory=dict)
    first_nonfinite_param: str = ""
    first_nonfinite_step: int = 0
    _norms: list[float] = field(default_factory=list)
    _underflow: list[float] = field(default_factory=list)
    _epoch: _EpochCounts = field(default_factory=lambda: _EpochCounts())

    def on_step(self, s: StepLog, epoch: int = 0) -> None:
        """Fold one step in."""
        self.steps, self.skip_count = s.step, s.skips_cumulative
        self.clip_count += s.clipped
        if s.skipped:
            self.skip_reasons[s.skip_reason] = self.skip_reasons.get(s.skip_reason, 0) + 1
            if s.nonfinite_param and not self.first_nonfinite_param:
                self.first_nonfinite_param = s.nonfinite_param
                self.first_nonfinite_step = s.step
        if math.isfinite(s.grad_l2_pre_clip):
            self._norms.append(s.grad_l2_pre_clip)
        if not math.isnan(s.underflow_frac):
            self._underflow.append(s.underflow_frac)
        self._epoch.add(s)

    def epoch_record(self, epoch: int, val_loss: float, val_acc: float,
                     seconds: float) -> EpochLog:
        """The ``EpochLog`` of the steps since the last ``on_epoch``, with its validation."""
        e = self._epoch
        return EpochLog(
            epoch=epoch,
            train_loss=sum(e.losses) / len(e.losses) if e.losses else math.nan,
            val_loss=val_loss,
            val_acc=val_acc,
            clip_fraction=e.clipped / e.steps if e.steps else math.nan,
            max_grad_norm=max(e.norms) if e.norms else math.nan,
            skip_count=e.skipped,
            steps=e.steps,
            seconds=seconds,
        )

    def on_epoch(self, log: EpochLog) -> None:
        """The epoch ended: its counts start again."""
        self._epoch = _EpochCounts()

    def state_dict(self) -> dict[str, Any]:
        """The run's counts (a checkpoint is taken between epochs: the epoch's are empty)."""
        return {"steps": self.steps, "clip_count": self.clip_count,
                "skip_count": self.skip_count,
                # plain str keys: a SkipReason would not load with weights_only=True
                "skip_reasons": {str(k): v for k, v in self.skip_reasons.items()},
                "first_nonfinite_param": self.first_nonfinite_param,
                "first_nonfinite_step": self.first_nonfinite_step,
                "norms": list(self._norms), "underflow": list(self._underflow)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the run's counts of ``state_dict``."""
        self.steps, self.clip_count = int(state["steps"]), int(state["clip_count"])
        self.skip_count = int(state["skip_count"])
        self.skip_reasons = {str(k): int(v) for k, v in state["skip_reasons"].items()}
        self.first_nonfinite_param = str(state["first_nonfinite_param"])
        self.first_nonfinite_step = int(state["first_nonfinite_step"])
        self._norms = [float(x) for x in state["norms"]]
        self._underflow = [float(x) for x in state["underflow"]]
        self._epoch = _EpochCounts()
    def summary(self) -> dict[str, float | int | str]:
        """Clip count/fraction, pre-clip norm max and percentiles, fp16 underflow share."""
        norms = np.asarray(self._norms) if self._norms else np.asarray([math.nan])
        p50, p90, p99 = np.percentile(norms, [50, 90, 99])
        return {
            "clip_count": self.clip_count,
            "clip_fraction": self.clip_count / self.steps if self.steps else 0.0,
            "skip_count": self.skip_count,
            "skip_nonfinite_loss": self.skip_reasons.get("nonfinite_loss", 0),
            "skip_nonfinite_grad": self.skip_reasons.get("nonfinite_grad", 0),
            "grad_norm_max": float(np.max(norms)),
            "grad_norm_p50": float(p50),
            "grad_norm_p90": float(p90),
            "grad_norm_p99": float(p99),
            "fp16_underflow_fraction": (
                float(np.mean(self._underflow)) if self._underflow else math.nan
            ),
            "first_nonfinite_param": self.first_nonfinite_param,
            "first_nonfinite_step": self.first_nonfinite_step,
        }
