"""``train(RunConfig)``: build the task, its data and model, and ``TrainStep``; loop epochs.

The task (``stability.tasks``) is instantiated from ``cfg.task``; its model is built after the
training seed is set, one micro-batch is tried before training (bad input fails as a
``ConfigError`` naming ``task.*``), and the best-validation checkpoint is kept.

Records flow one way: ``TrainStep.step`` returns a ``StepLog``; this loop hands it to its
named step sinks (``core.sinks``) with one call each: the per-layer table, the diagnostics
(which own the run's and the epoch's counts), the CSV writer (the ground truth, flushed per
row), any extra sinks (e.g. the MLflow buffer) and, last, the skip-rate monitor. The step
itself never logs.

With ``world_size > 1`` (under torchrun, see ``docs/distributed.md``) the model is wrapped in
``DistributedDataParallel``, each rank trains on its shard of every epoch's shuffled order,
validation sums are reduced over ranks, and only rank 0 writes files.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from stability.core import checkpoint, distributed
from stability.core.batches import evaluate_task, task_of, windows
from stability.core.config import RunConfig, to_yaml_dict
from stability.core.cost import CostMeter, run_costs
from stability.core.faults import FaultInjector
from stability.core.layers import LayerNormRecorder
from stability.core.monitor import Diagnostics, DivergedError, SkipRateMonitor
from stability.core.optim import build_optimizer, build_scheduler, total_steps
from stability.core.precision import check_precision_supported, resolve_device
from stability.core.rundir import (
    CHECKPOINT_NAME,
    CONFIG_NAME,
    CSV_NAME,
    LAYER_NORMS_NAME,
    LAYER_UPDATES_NAME,
)
from stability.core.sinks import StepSink
from stability.core.step import TrainStep
from stability.core.steplog import CsvStepWriter, EpochLog
from stability.core.task import check_task

log = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_NAME", "CONFIG_NAME", "CSV_NAME", "RunResult", "train", "write_config"]


@dataclass
class RunResult:
    """What a run produced. ``status`` is ``finished`` or ``diverged`` (failures raise)."""

    status: str
    reason: str
    best_val_loss: float
    best_epoch: int
    epochs: list[EpochLog]
    summary: dict[str, Any]
    output_dir: Path
    wall_time_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def csv_path(self) -> Path:
        """The run's ``steps.csv``."""
        return self.output_dir / CSV_NAME

    @property
    def checkpoint_path(self) -> Path:
        """The best-validation checkpoint (a plain ``state_dict``)."""
        return self.output_dir / CHECKPOINT_NAME


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


def write_config(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config as YAML (``to_run_config`` reads it back)."""
    path.write_text(yaml.safe_dump(to_yaml_dict(cfg), sort_keys=False))


def log_epoch(record: EpochLog, epochs: int, level: int = logging.INFO) -> None:
    """The run's per-epoch line (in a sweep: in the run's log), for our loop and trainers."""
    log.log(level, "epoch %2d/%d  train_loss %.4f  val_loss %.4f  val_acc %.3f  clip %.2f  "
            "skips %d", record.epoch, epochs, record.train_loss, record.val_loss,
            record.val_acc, record.clip_fraction, record.skip_count)


def train(cfg: RunConfig, sinks: Sequence[StepSink] = (), world_size: int = 1) -> RunResult:
    """Train one configuration.

    Args:
        cfg: the validated run configuration.
        sinks: extra consumers of ``StepLog``/``EpochLog`` records (the CSV is always written);
            the resume checkpoint keeps the state of those that have one.
        world_size: number of data-parallel ranks: the effective batch is
            ``batch_size * accum_steps * world_size``. Above 1 it must equal the size of the
            initialised process group (``distributed.setup``); training then uses DDP and
            only rank 0 writes ``steps.csv``, ``config.yaml`` and the checkpoint (the caller
            decides which ranks get ``sinks``).

    Returns:
        The ``RunResult``; a run ended by the skip-rate monitor has ``status == "diverged"``.

    Raises:
        ConfigError: the device cannot run the requested precision.
        ValueError: ``world_size`` does not match the process group.
    """
    t0 = time.perf_counter()
    ddp = world_size > 1
    if world_size != (distributed.world_size() if ddp else 1):
        raise ValueError(
            f"world_size={world_size} is invalid: allowed values are 1 or the size of the "
            f"initialised process group ({distributed.world_size()}); start ranks with torchrun"
        )
    rank = distributed.rank() if ddp else 0
    main = rank == 0
    device = resolve_device(cfg.device)
    check_precision_supported(cfg.precision.name, device)
    torch.set_num_threads(cfg.train.threads)
    out = Path(cfg.output_dir)
    if main:
        (out / CHECKPOINT_NAME).parent.mkdir(parents=True, exist_ok=True)
        write_config(cfg, out / CONFIG_NAME)

    task = task_of(cfg)
    train_set, val_set = task.train_val()
    torch.manual_seed(cfg.seed)  # the training seed: initialisation and shuffling only
    model = task.model().to(device)
    check_task(task, model, train_set, cfg.train.batch_size, device, cfg.task.target)
    # optim/schedule (core.optim): the default is AdamW(params, lr, weight_decay), constant lr
    optimizer = build_optimizer(cfg.optim.target, cfg.optim.options, model.parameters(),
                                cfg.train.lr, cfg.train.weight_decay)
    scheduler = build_scheduler(
        cfg.schedule.target, cfg.schedule.options, optimizer,
        total_steps(len(train_set), cfg.train.batch_size, cfg.train.accum_steps, world_size,
                    cfg.train.epochs))
    net = distributed.wrap(model, device) if ddp else model
    faults = FaultInjector(cfg.fault)  # fault.* exercises the skip path; none by default
    ratio_on = cfg.telemetry.update_ratio and cfg.telemetry.per_layer
    layers = (LayerNormRecorder(model, cfg.clip.enabled and cfg.clip.method == "norm",
                                out / LAYER_NORMS_NAME,
                                out / LAYER_UPDATES_NAME if ratio_on else None)
              if cfg.telemetry.per_layer and main else None)
    # The recorder copies theta before the optimizer step (update ratio): a step hook too.
    hooks = ([faults] if faults.active else []) + ([layers] if layers and ratio_on else [])
    trainer = TrainStep.for_run(cfg, net, optimizer, task.loss, device, hooks=hooks,
                                scheduler=scheduler)
    # Same seed on every rank: the same permutation each epoch, of which each takes its share.
    shuffle = torch.Generator().manual_seed(cfg.seed)

    # The step sinks, in the order they see each step; the monitor last: it may end the run
    # once the step is recorded everywhere. Their state is part of the resume checkpoint.
    diag = Diagnostics()
    monitor = SkipRateMonitor(cfg.monitor)
    csv_writer = CsvStepWriter(out / CSV_NAME) if main else None
    named: dict[str, StepSink] = {} if layers is None else {"layers": layers}
    named["diagnostics"] = diag
    if csv_writer is not None:
        named["csv"] = csv_writer
    named |= {f"extra{i}": sink for i, sink in enumerate(sinks)}
    initial = named["loss_init"] = InitialLoss()
    named["monitor"] = monitor
    all_sinks = list(named.values())
    cost = CostMeter(device)
    # A killed run's folder continues after its last whole epoch (core/checkpoint.py).
    parts = checkpoint.Parts(model, optimizer, trainer, shuffle, named)
    resumed = checkpoint.restore(out, cfg, parts) if main and not ddp else None
    epochs: list[EpochLog] = resumed.epochs if resumed else []
    best_val, best_epoch, best_acc = resumed.best if resumed else (math.inf, 0, math.nan)
    best_metrics: Mapping[str, float] = resumed.best_metrics if resumed else {}
    if resumed is None:  # before the first step; a checkpoint from before it was kept: NaN
        initial.value = evaluate_task(task, model, val_set, cfg.precision.name, device,
                                      sharded=ddp, num_workers=cfg.train.num_workers)["loss"]
    status, reason = "finished", ""
    try:
        for epoch in range((resumed.epoch if resumed else 0) + 1, cfg.train.epochs + 1):
            te = time.perf_counter()
            for window in windows(train_set, cfg.train.batch_size, cfg.train.accum_steps,
                                  shuffle, device, rank, world_size, cfg.train.num_workers):
                ts = time.perf_counter()
                s = trainer.step(window)
                cost.on_step(time.perf_counter() - ts)
                for sink in all_sinks:
                    sink.on_step(s, epoch)  # the monitor raises DivergedError
            val = evaluate_task(task, model, val_set, cfg.precision.name, device, sharded=ddp,
                                num_workers=cfg.train.num_workers)
            val_loss, val_acc = val["loss"], val.get("acc", math.nan)
            record = diag.epoch_record(epoch, val_loss, val_acc, time.perf_counter() - te)
            epochs.append(record)
            for sink in all_sinks:  # the per-layer table reaches the disk here
                sink.on_epoch(record)
            if val_loss < best_val:  # nan never wins; identical on every rank (reduced)
                best_val, best_epoch, best_acc = val_loss, epoch, val_acc
                best_metrics = val
                if main:  # the unwrapped module: keys load into the task's fresh model
                    checkpoint.save_atomic(model.state_dict(), out / CHECKPOINT_NAME)
            if csv_writer is not None and not ddp:  # the resume point of this epoch
                checkpoint.save(out, cfg, parts, epochs, (best_val, best_epoch, best_acc),
                                best_metrics)
            log_epoch(record, cfg.train.epochs, logging.INFO if main else logging.DEBUG)
    except DivergedError as err:
        status, reason = "diverged", str(err)
        log.error("run diverged: %s", err)
    finally:
        if csv_writer is not None:
            csv_writer.close()
        if layers is not None:  # the rows of an epoch cut short (diverged or failed)
            layers.flush()
    if main:
        checkpoint.discard(out)  # the run ended (finished or diverged): nothing to resume

    costs = run_costs(cost, trainer.scaler,
                      cfg.train.batch_size * cfg.train.accum_steps * world_size, trainer.grad_syncs)
    summary: dict[str, Any] = diag.summary() | costs | (
        layers.summary() if layers is not None else {}) | {
        "best_val_loss": best_val,
        "best_epoch": best_epoch,
        "loss_init": initial.value,  # validation loss before training (LR sensitivity)
        "best_val_acc": best_acc,
        # The task's own metrics at the best epoch (val_mse, val_perplexity...).
        **{f"best_val_{k}": v for k, v in best_metrics.items() if k not in ("loss", "acc")},
        "diverged": int(status == "diverged"),
        "optimizer_steps": trainer.step_count,
        "skip_alerts": monitor.alerts,
    }
    wall = time.perf_counter() - t0
    summary["wall_time_s"] = wall
    return RunResult(status, reason, best_val, best_epoch, epochs, summary, out, wall)
