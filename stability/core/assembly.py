"""One run's assembly, for our loop and every trainer: its sinks, its epochs, its summary.

``standard_sinks`` names the step sinks every run has, in the order they see a record:
``layers`` (the per-layer table, optional), ``diagnostics`` (the run's and the epoch's counts),
``csv`` (``steps.csv``, the ground truth), the caller's ``extra0``, ``extra1``... (e.g. the
MLflow buffer), ``loss_init`` (our loop's) and ``monitor`` last: it may end the run once the
step is recorded everywhere. Their names are the keys of their state in a resume checkpoint.

``RunAssembly`` holds them for a run: ``step`` hands a record to each sink, ``epoch`` makes the
epoch's record, hands it on and keeps the best epoch (its weights as ``checkpoints/best.pt``
when a model is given: what the report rebuilds a winner from), ``finish`` closes the files
and returns the run's summary. A torchtune recipe's setup / train / cleanup, in one place.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stability.core import checkpoint
from stability.core.cost import CostMeter, run_costs
from stability.core.layers import LayerNormRecorder
from stability.core.monitor import Diagnostics, SkipRateMonitor
from stability.core.signals import raise_if_terminated
from stability.core.sinks import StepSink, load_states, state_of
from stability.core.steplog import CsvStepWriter, EpochLog, StepLog

# Every run's epoch lines under one name, our loop's, whoever trains: a filter on the run's log
# (a sweep's ``<n>/sweep.log``) selects them all.
log = logging.getLogger("stability.core.loop")


class InitialLoss:
    """``loss_init``: the validation loss before the first step, kept across a resume.

    The reference of the LR sensitivity (Wortsman et al. 2023): a learning rate whose final
    loss is above it counts as having learned nothing. Evaluating draws no random numbers, so
    the steps are the same with or without it. A sink only for its place in the checkpoint.
    """

    def __init__(self) -> None:
        self.value = math.nan

    def on_step(self, log: object, epoch: int) -> None:
        """Nothing per step."""

    def on_epoch(self, log: object) -> None:
        """Nothing per epoch."""

    def state_dict(self) -> dict[str, Any]:
        """The measured value (NaN until measured)."""
        return {"loss_init": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The value measured before the run was stopped."""
        self.value = float(state["loss_init"])


def standard_sinks(diagnostics: Diagnostics, *, layers: LayerNormRecorder | None = None,
                   csv: CsvStepWriter | None = None, extras: Sequence[StepSink] = (),
                   loss_init: InitialLoss | None = None,
                   monitor: SkipRateMonitor | None = None) -> dict[str, StepSink]:
    """The run's named step sinks in the order they see each record (None: left out)."""
    named: dict[str, StepSink] = {} if layers is None else {"layers": layers}
    named["diagnostics"] = diagnostics
    if csv is not None:
        named["csv"] = csv
    named |= {f"extra{i}": sink for i, sink in enumerate(extras)}
    if loss_init is not None:
        named["loss_init"] = loss_init
    if monitor is not None:
        named["monitor"] = monitor
    return named


def log_epoch(record: EpochLog, epochs: int, level: int = logging.INFO) -> None:
    """The run's per-epoch line (in a sweep: in the run's log), for our loop and trainers."""
    log.log(level, "epoch %2d/%d  train_loss %.4f  val_loss %.4f  val_acc %.3f  clip %.2f  "
            "skips %d", record.epoch, epochs, record.train_loss, record.val_loss,
            record.val_acc, record.clip_fraction, record.skip_count)


class BestCheckpoint:
    """The best validation loss so far, its weights kept as ``checkpoints/best.pt`` (a plain
    ``state_dict``: the report rebuilds the winner from it); nan never wins. A step sink too,
    for a trainer that hands its epochs to sinks (``integrations.study``).

    Args:
        path: where the weights go (None: nowhere, the loss is still kept).
        model: whose weights (the unwrapped module: keys load into a fresh model; settable
            once the trainer has built it).
    """

    def __init__(self, path: Path | None, model: nn.Module | None = None) -> None:
        self.path, self.model = path, model
        self.best = math.inf

    def offer(self, val_loss: float) -> bool:
        """Whether ``val_loss`` beats the best so far (then its weights are saved)."""
        if not val_loss < self.best:
            return False
        self.best = val_loss
        if self.path is not None and self.model is not None:
            checkpoint.save_atomic(self.model.state_dict(), self.path)
        return True

    def on_step(self, log: StepLog, epoch: int) -> None:
        """Nothing per step."""

    def on_epoch(self, log: EpochLog) -> None:
        """The epoch's validation loss, offered."""
        self.offer(log.val_loss)


class EpochLines:
    """A step sink that writes the per-epoch line (``log_epoch``) out of ``epochs``."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_step(self, log: StepLog, epoch: int) -> None:
        """Nothing per step."""

    def on_epoch(self, log: EpochLog) -> None:
        """The epoch's line."""
        log_epoch(log, self.epochs)


class RunAssembly:
    """One run's sinks, epochs and best epoch, from setup to summary.

    Args:
        sinks: the named step sinks (``standard_sinks``); each record goes to all of them.
        diagnostics: the ``diagnostics`` sink (it makes each epoch's record).
        cost: the run's step timer and memory peak (``core.cost``).
        best_path: where a better epoch's weights go (None: nowhere).
        model: whose weights (the unwrapped module: keys load into a fresh model).
        epoch_lines: write each epoch's line (``log_epoch``) out of this many epochs.
        line_level: the level of that line (DEBUG on the ranks that do not write files).
    """

    def __init__(self, sinks: Mapping[str, StepSink], diagnostics: Diagnostics,
                 cost: CostMeter, *, best_path: Path | None = None,
                 model: nn.Module | None = None, epoch_lines: int | None = None,
                 line_level: int = logging.INFO) -> None:
        self.sinks = dict(sinks)
        self.diagnostics, self.cost = diagnostics, cost
        self.keeper = BestCheckpoint(best_path, model)
        self.epoch_lines, self.line_level = epoch_lines, line_level
        self.epochs: list[EpochLog] = []
        self.best: tuple[float, int, float] = (math.inf, 0, math.nan)  # val_loss, epoch, acc
        self.best_metrics: Mapping[str, float] = {}  # the task's validation metrics there
        self._all = list(self.sinks.values())

    def resume(self, epochs: list[EpochLog], best: tuple[float, int, float],
               best_metrics: Mapping[str, float]) -> None:
        """Continue after the epochs of a resume point (the sinks load their own state)."""
        self.epochs, self.best, self.best_metrics = list(epochs), best, dict(best_metrics)
        self.keeper.best = best[0]  # best.pt holds that epoch's weights already

    def step(self, record: StepLog, epoch: int, seconds: float) -> None:
        """One optimizer step took ``seconds``: its record to every sink, in order."""
        raise_if_terminated()  # a SIGTERM whose exception a finalizer swallowed ends it here
        self.cost.on_step(seconds)
        for sink in self._all:
            sink.on_step(record, epoch)  # the monitor raises DivergedError

    def epoch(self, epoch: int, val_loss: float, val_acc: float, seconds: float,
              metrics: Mapping[str, float] | None = None) -> EpochLog:
        """The epoch's record (after validation) to every sink; a better validation loss is
        the best epoch (nan never wins) and its weights are saved.

        Args:
            epoch: the 1-based epoch.
            val_loss: its validation loss.
            val_acc: its validation accuracy (nan when the task has none).
            seconds: its wall time.
            metrics: the task's validation metrics (``best_val_<name>`` in the summary).
        """
        record = self.diagnostics.epoch_record(epoch, val_loss, val_acc, seconds)
        self.epochs.append(record)
        for sink in self._all:  # the per-layer table reaches the disk here
            sink.on_epoch(record)
        if self.keeper.offer(val_loss):
            self.best, self.best_metrics = (val_loss, epoch, val_acc), dict(metrics or {})
        if self.epoch_lines is not None:
            log_epoch(record, self.epoch_lines, self.line_level)
        return record

    def state_dict(self) -> dict[str, Any]:
        """Every sink's state, the best epoch and the epochs so far (plain containers)."""
        return {"sinks": state_of(self.sinks), "best": list(self.best),
                "epochs": [asdict(e) for e in self.epochs]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict``: each sink from its own state (files cut back to it)."""
        load_states(self.sinks, state["sinks"])
        loss, epoch, acc = state["best"]
        self.best = (float(loss), int(epoch), float(acc))
        self.keeper.best = self.best[0]
        # the epochs before the checkpoint (absent from a state saved before they were kept)
        self.epochs = [EpochLog(**e) for e in state.get("epochs", [])]

    def close(self) -> None:
        """Close ``steps.csv`` and write the per-layer rows still held (idempotent): the rows
        of an epoch cut short (diverged or failed) are kept."""
        csv, layers = self.sinks.get("csv"), self.sinks.get("layers")
        if isinstance(csv, CsvStepWriter):
            csv.close()
        if isinstance(layers, LayerNormRecorder):
            layers.flush()

    def finish(self, scaler: torch.amp.GradScaler | None, effective_batch: float,
               grad_syncs: int, optimizer_steps: int, status: str) -> dict[str, Any]:
        """The run ended (finished or diverged): close the files; its ``summary``."""
        self.close()
        return self.summary(scaler, effective_batch, grad_syncs, optimizer_steps, status)

    def summary(self, scaler: torch.amp.GradScaler | None, effective_batch: float,
                grad_syncs: int, optimizer_steps: int,
                status: str | None = None) -> dict[str, Any]:
        """The run's summary: the diagnostics, the cost metrics (``core.cost.run_costs``), the
        per-layer update ratio, the best epoch, ``loss_init`` and ``skip_alerts`` where the run
        has those sinks, ``diverged`` given a ``status``.

        Args:
            scaler: the run's GradScaler (None: no loss scaling).
            effective_batch: samples per optimizer step (NaN when unknown).
            grad_syncs: backward passes that synchronised gradients.
            optimizer_steps: optimizer steps taken.
            status: ``finished`` or ``diverged`` (None: not said).
        """
        layers, initial = self.sinks.get("layers"), self.sinks.get("loss_init")
        monitor = self.sinks.get("monitor")
        best_val, best_epoch, best_acc = self.best
        summary: dict[str, Any] = self.diagnostics.summary() | run_costs(
            self.cost, scaler, effective_batch, grad_syncs) | (
            layers.summary() if isinstance(layers, LayerNormRecorder) else {}) | {
            "best_val_loss": best_val, "best_epoch": best_epoch}
        if isinstance(initial, InitialLoss):  # validation loss before training
            summary["loss_init"] = initial.value
        summary["best_val_acc"] = best_acc
        # The task's own metrics at the best epoch (val_mse, val_perplexity...).
        summary |= {f"best_val_{k}": v for k, v in self.best_metrics.items()
                    if k not in ("loss", "acc")}
        if status is not None:
            summary["diverged"] = int(status == "diverged")
        summary["optimizer_steps"] = optimizer_steps
        if isinstance(monitor, SkipRateMonitor):
            summary["skip_alerts"] = monitor.alerts
        return summary
