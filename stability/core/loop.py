"""``train(RunConfig)``: build the task, its data and model, and ``TrainStep``; loop epochs.

The task (``stability.tasks``) is instantiated from ``cfg.task``; its model is built after the
training seed is set, one micro-batch is tried before training (bad input fails as a
``ConfigError`` naming ``task.*``), and the best-validation checkpoint is kept.

Records flow one way: ``TrainStep.step`` returns a ``StepLog``; this loop hands it to its
named step sinks (``core.sinks``) with one call each: the per-layer table, the diagnostics
(which own the run's and the epoch's counts), the CSV writer (the ground truth, flushed per
row), any extra sinks (e.g. the MLflow buffer) and, last, the skip-rate monitor. The step
itself never logs. The sinks, the epoch records, the best epoch and the summary are the run's
``core.assembly.RunAssembly``, as for every trainer: setup, then for each epoch: for each
window: step, record; the epoch's record; then finish.

With ``world_size > 1`` (under torchrun, see ``docs/distributed.md``) the model is wrapped in
``DistributedDataParallel``, each rank trains on its shard of every epoch's shuffled order,
validation sums are reduced over ranks, and only rank 0 writes files.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from stability.core import checkpoint, distributed
from stability.core.assembly import InitialLoss, RunAssembly, standard_sinks
from stability.core.batches import EvalSettings, evaluate_task, task_of, windows
from stability.core.config import RunConfig, to_yaml_dict
from stability.core.cost import CostMeter
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


def write_config(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config as YAML (``to_run_config`` reads it back)."""
    path.write_text(yaml.safe_dump(to_yaml_dict(cfg), sort_keys=False))


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

    # The step sinks, in the order they see each step (core.assembly.standard_sinks); the
    # monitor last: it may end the run once the step is recorded everywhere. Their state is
    # part of the resume checkpoint.
    diag = Diagnostics()
    initial = InitialLoss()
    csv_writer = CsvStepWriter(out / CSV_NAME) if main else None
    named = standard_sinks(diag, layers=layers, csv=csv_writer, extras=sinks,
                           loss_init=initial, monitor=SkipRateMonitor(cfg.monitor))
    run = RunAssembly(named, diag, CostMeter(device),
                      best_path=out / CHECKPOINT_NAME if main else None, model=model,
                      epoch_lines=cfg.train.epochs,
                      line_level=logging.INFO if main else logging.DEBUG)
    # A killed run's folder continues after its last whole epoch (core/checkpoint.py).
    parts = checkpoint.Parts(model, optimizer, trainer, shuffle, named)
    resumed = checkpoint.restore(out, cfg, parts) if main and not ddp else None
    # validation sums are reduced over ranks: the best epoch is the same on every rank
    evaluation = EvalSettings.of(cfg, device, sharded=ddp)
    if resumed is not None:
        run.resume(resumed.epochs, resumed.best, resumed.best_metrics)
    else:  # before the first step; a checkpoint from before it was kept: NaN
        initial.value = evaluate_task(task, model, val_set, evaluation)["loss"]
    status, reason = "finished", ""
    try:
        for epoch in range((resumed.epoch if resumed else 0) + 1, cfg.train.epochs + 1):
            te = time.perf_counter()
            for window in windows(train_set, cfg.train, shuffle, device, rank, world_size):
                ts = time.perf_counter()
                s = trainer.step(window)
                run.step(s, epoch, time.perf_counter() - ts)
            val = evaluate_task(task, model, val_set, evaluation)
            run.epoch(epoch, val["loss"], val.get("acc", math.nan), time.perf_counter() - te,
                      val)
            if csv_writer is not None and not ddp:  # the resume point of this epoch
                checkpoint.save(out, cfg, parts, run.epochs, run.best, run.best_metrics)
    except DivergedError as err:
        status, reason = "diverged", str(err)
        log.error("run diverged: %s", err)
    finally:
        run.close()
    if main:
        checkpoint.discard(out)  # the run ended (finished or diverged): nothing to resume

    summary = run.finish(trainer.scaler, cfg.train.batch_size * cfg.train.accum_steps * world_size,
                         trainer.grad_syncs, trainer.step_count, status)
    wall = time.perf_counter() - t0
    summary["wall_time_s"] = wall
    return RunResult(status=status, reason=reason, best_val_loss=run.best[0],
                     best_epoch=run.best[1], epochs=run.epochs, summary=summary, output_dir=out,
                     wall_time_s=wall)
