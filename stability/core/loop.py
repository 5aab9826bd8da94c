"""``train(RunConfig)``: build data, model and ``TrainStep``; loop epochs; keep the best checkpoint.

Records flow one way: ``TrainStep.step`` returns a ``StepLog``; this loop hands it to the
CSV writer (the ground truth, flushed per row), the diagnostics, the skip-rate monitor and
any extra sinks (e.g. the MLflow buffer). The step itself never logs.

With ``world_size > 1`` (under torchrun, see ``docs/distributed.md``) the model is wrapped in
``DistributedDataParallel``, each rank trains on its shard of every epoch's shuffled order,
validation sums are reduced over ranks, and only rank 0 writes files.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from stability.core import checkpoint, distributed
from stability.core.config import RunConfig
from stability.core.faults import FaultInjector
from stability.core.monitor import Diagnostics, DivergedError, SkipRateMonitor
from stability.core.precision import autocast, check_precision_supported, resolve_device
from stability.core.step import MicroBatch, TrainStep
from stability.core.steplog import CsvStepWriter, EpochLog, StepSink
from stability.tasks.sign_sum import SequenceClassifier, Split, make_splits

log = logging.getLogger(__name__)

CSV_NAME = "steps.csv"
CONFIG_NAME = "config.yaml"
CHECKPOINT_NAME = "checkpoints/best.pt"


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


@torch.no_grad()
def evaluate(model: nn.Module, split: Split, precision: str, device: str,
             batch_size: int = 1024, sharded: bool = False) -> tuple[float, float]:
    """Mean BCE loss and accuracy of ``model`` on ``split``, under the run's autocast policy.

    Args:
        model: the classifier.
        split: the data to evaluate on.
        precision: the run's precision (``fp32`` | ``fp16`` | ``bf16``).
        device: ``cpu`` or ``cuda``.
        batch_size: evaluation batch size.
        sharded: data-parallel: each rank evaluates every world_size-th sample (no padding)
            and the sums are all-reduced, so every rank returns the whole split's numbers.

    Returns:
        ``(loss, accuracy)``.
    """
    if sharded:
        r, w = distributed.rank(), distributed.world_size()
        split = Split(split.x[r::w], split.y[r::w])
    model.eval()
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
    total, correct = 0.0, 0
    for i in range(0, len(split), batch_size):
        x = split.x[i : i + batch_size].to(device)
        y = split.y[i : i + batch_size].to(device)
        with autocast(precision, device):
            logits = model(x).float()
        total += float(loss_fn(logits, y))
        correct += int(((logits > 0).float() == y).sum())
    model.train()
    count = len(split)
    if sharded:
        total, correct, count = distributed.all_reduce_sum([total, correct, count], device)
    return total / count, correct / count


def windows(split: Split, batch_size: int, accum_steps: int, generator: torch.Generator,
            device: str, rank: int = 0, world_size: int = 1) -> Iterator[list[MicroBatch]]:
    """One epoch of shuffled micro-batches grouped into windows of ``accum_steps``.

    The last window may be shorter; it is still stepped (with its own divisor). With
    ``world_size > 1`` every rank draws the same permutation (same generator state) and takes
    its ``DistributedSampler`` share of it, so ranks see disjoint data and the same number of
    windows.
    """
    perm = distributed.shard_indices(torch.randperm(len(split), generator=generator),
                                     rank, world_size)
    batches = [perm[i : i + batch_size] for i in range(0, len(perm), batch_size)]
    for w in range(0, len(batches), accum_steps):
        yield [(split.x[idx].to(device), split.y[idx].to(device))
               for idx in batches[w : w + accum_steps]]


def write_config(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config as YAML."""
    path.write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))


def train(cfg: RunConfig, sinks: Sequence[StepSink] = (), world_size: int = 1) -> RunResult:
    """Train one configuration.

    Args:
        cfg: the validated run configuration.
        sinks: extra consumers of ``StepLog``/``EpochLog`` records (the CSV is always written).
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

    splits = make_splits(cfg.data)
    torch.manual_seed(cfg.seed)  # the training seed: initialisation and shuffling only
    model = SequenceClassifier(cfg.model).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr,
                                  weight_decay=cfg.train.weight_decay)
    net = distributed.wrap(model, device) if ddp else model
    faults = FaultInjector(cfg.fault)
    trainer = TrainStep.for_run(cfg, net, optimizer, nn.BCEWithLogitsLoss(), device,
                                hooks=[faults] if faults.active else [])
    # Same seed on every rank: the same permutation each epoch, of which each takes its share.
    shuffle = torch.Generator().manual_seed(cfg.seed)

    monitor = SkipRateMonitor(cfg.monitor)
    diag = Diagnostics()
    # --- resume (core/checkpoint.py): a killed run's folder continues after its last epoch
    parts = checkpoint.Parts(model, optimizer, trainer, shuffle, monitor, diag)
    resumed = checkpoint.restore(out, cfg, parts) if main and not ddp else None
    resume_at = resumed.csv_bytes if resumed else None
    csv_writer = CsvStepWriter(out / CSV_NAME, resume_at=resume_at) if main else None
    # --- end resume
    all_sinks: list[StepSink] = [] if csv_writer is None else [csv_writer]
    all_sinks.extend(sinks)
    epochs: list[EpochLog] = resumed.epochs if resumed else []
    best_val, best_epoch, best_acc = resumed.best if resumed else (math.inf, 0, math.nan)
    status, reason = "finished", ""
    try:
        for epoch in range((resumed.epoch if resumed else 0) + 1, cfg.train.epochs + 1):
            te = time.perf_counter()
            losses, norms, clipped, skipped, n_steps = [], [], 0, 0, 0
            for window in windows(splits.train, cfg.train.batch_size, cfg.train.accum_steps,
                                  shuffle, device, rank, world_size):
                s = trainer.step(window)
                diag.on_step(s)
                for sink in all_sinks:
                    sink.on_step(s, epoch)
                n_steps += 1
                clipped += s.clipped
                skipped += s.skipped
                if not s.skipped:
                    losses.append(s.loss)
                    norms.append(s.grad_l2_pre_clip)
                monitor.update(s.skipped)  # raises DivergedError
            val_loss, val_acc = evaluate(model, splits.val, cfg.precision.name, device, sharded=ddp)
            record = EpochLog(
                epoch=epoch,
                train_loss=sum(losses) / len(losses) if losses else math.nan,
                val_loss=val_loss,
                val_acc=val_acc,
                clip_fraction=clipped / n_steps,
                max_grad_norm=max(norms) if norms else math.nan,
                skip_count=skipped,
                steps=n_steps,
                seconds=time.perf_counter() - te,
            )
            epochs.append(record)
            for sink in all_sinks:
                sink.on_epoch(record)
            if val_loss < best_val:  # nan never wins; identical on every rank (reduced)
                best_val, best_epoch, best_acc = val_loss, epoch, val_acc
                if main:  # the unwrapped module: keys load into SequenceClassifier
                    torch.save(model.state_dict(), out / CHECKPOINT_NAME)
            if csv_writer is not None and not ddp:  # resume point (core/checkpoint.py)
                checkpoint.save(out, cfg, parts, epochs, (best_val, best_epoch, best_acc),
                                csv_writer.position)
            log.log(logging.INFO if main else logging.DEBUG,
                "epoch %2d/%d  train_loss %.4f  val_loss %.4f  val_acc %.3f  clip %.2f  "
                "skips %d", epoch, cfg.train.epochs, record.train_loss, val_loss, val_acc,
                record.clip_fraction, skipped,
            )
    except DivergedError as err:
        status, reason = "diverged", str(err)
        log.error("run diverged: %s", err)
    finally:
        if csv_writer is not None:
            csv_writer.close()
    if main:
        checkpoint.discard(out)  # the run ended (finished or diverged): nothing to resume

    summary: dict[str, Any] = diag.summary() | {
        "best_val_loss": best_val,
        "best_epoch": best_epoch,
        "best_val_acc": best_acc,
        "final_scaler_scale": trainer.scaler.get_scale() if trainer.scaler.is_enabled() else 1.0,
        "diverged": int(status == "diverged"),
        "effective_batch": cfg.train.batch_size * cfg.train.accum_steps * world_size,
        "optimizer_steps": trainer.step_count,
        "grad_syncs": trainer.grad_syncs,
        "skip_alerts": monitor.alerts,
    }
    wall = time.perf_counter() - t0
    summary["wall_time_s"] = wall
    return RunResult(status, reason, best_val, best_epoch, epochs, summary, out, wall)
