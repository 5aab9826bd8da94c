"""A Lightning task in a study: the user's ``LightningModule`` fit by ``lightning.pytorch.Trainer``.

A Lightning task (``trainer = "lightning"``) provides::

    module(lr: float) -> LightningModule   # the user's module; its configure_optimizers uses lr
    datamodule() -> LightningDataModule    # train and val loaders (the batch size is its own)
    sealed_test(*, winner: str) -> Dataset # opened by the report for the winner alone

``validation_step`` logs ``val_loss`` (and ``val_acc``) per epoch, what the study selects on.
The point's settings become the Trainer's own arguments (``lightning.trainer_settings``):
clip -> ``gradient_clip_val`` / ``gradient_clip_algorithm``, precision -> ``"32-true"`` |
``"bf16-mixed"`` | a fp16 ``MixedPrecision`` plugin with our GradScaler settings (Lightning
turns ``"16-mixed"`` on CPU into bf16), ``train.accum_steps`` -> ``accumulate_grad_batches``,
``train.epochs`` -> ``max_epochs``, ``seed`` -> ``seed_everything``, ``train.lr`` -> ``module(lr)``.

Durable: after every epoch (its record written) ``EpochCheckpoint`` saves Lightning's own
checkpoint (``checkpoints/lightning-epoch<N>.ckpt``: the module, optimizer, schedulers,
scaler, loops and the callback's state) and then our resume point ``checkpoints/last.pt``
(``core.checkpoint.save``: the run's identity, epochs, step and best). A point killed in a
sweep is therefore resumed as our loop's are: ``claim`` keeps the folder, the ``TrackedRun``
reopens the MLflow run its journal names, and the fit goes on from that epoch with Lightning's
``ckpt_path`` (``steps.csv`` cut back to the checkpoint and continued).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from stability.core import checkpoint
from stability.core.config import RunConfig
from stability.core.sinks import StepSink
from stability.core.task import SEALED_TEST, Task
from stability.integrations.lightning import StabilityCallback, trainer_settings
from stability.integrations.lightning_check import probe as probe  # the check adapter
from stability.integrations.protocol import EXAMPLE_ROWS, Fit
from stability.integrations.study import save_resume_point, trainer_checkpoint

REQUIRED = ("module", "datamodule", SEALED_TEST)
LIGHTNING_CKPT = "checkpoints/lightning-epoch{epoch}.ckpt"  # Lightning's, beside last.pt
# What a fit in a study leaves to us: no logger, no checkpoint of its own, no progress bar.
QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
         "enable_model_summary": False}


log = logging.getLogger(__name__)


def _quiet() -> None:
    # One process trains many points: Lightning's per-fit notices would fill the job's log.
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    for notice in (".*does not have many workers.*", ".*srun.*", ".*LeafSpec.*"):
        warnings.filterwarnings("ignore", notice)


def check(task: Task, cfg: RunConfig, device: str) -> None:
    """Every setting maps onto the Trainer (``trainer_settings``): nothing to refuse here."""
    trainer_settings(cfg.clip, cfg.precision, cfg.train.accum_steps, device)


class EpochCheckpoint(pl.Callback):
    """After each epoch's record: Lightning's checkpoint, then our ``last.pt`` naming its epoch.

    Listed after the ``StabilityCallback`` (Lightning calls callbacks in order), so the
    checkpoint holds the callback's state with this epoch's record. Each file is written under
    a temporary name and renamed; the older Lightning checkpoint is removed only after
    ``last.pt`` names the new one, so a kill at any point leaves a pair that belongs together.
    """

    def __init__(self, folder: Path, cfg: RunConfig, callback: StabilityCallback,
                 resuming: bool = False) -> None:
        self.folder, self.cfg, self.callback = folder, cfg, callback
        self.resuming = resuming

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A resumed fit: the random generators as they were at the checkpoint (Lightning's
        checkpoint does not hold them), so the next epoch shuffles as it would have: the
        fit loop creates that epoch's loader iterator (the draws) after this hook and after
        the sanity check (``FitLoop.setup_data``)."""
        if self.resuming:
            checkpoint.restore_rng(self.folder, self.cfg)

    def on_sanity_check_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The sanity check's loader drew from the generators: set them back."""
        self.on_fit_start(trainer, pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Save both checkpoints of the epoch just recorded."""
        rec = self.callback.recorder
        if rec is None or trainer.sanity_checking:
            return
        epoch = trainer.current_epoch + 1
        path = self.folder / LIGHTNING_CKPT.format(epoch=epoch)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        trainer.save_checkpoint(tmp)
        tmp.replace(path)
        save_resume_point(self.folder, self.cfg, pl_module, trainer.optimizers[0],
                          rec.meter.step_count, rec)
        for old in self.folder.glob(LIGHTNING_CKPT.format(epoch="*")):
            if old != path:
                old.unlink(missing_ok=True)


def prepare(task: Task, cfg: RunConfig, device: str, folder: Path,
            sinks: list[StepSink]) -> Fit:
    """The fit of one point: the seeded module, the callbacks, ``Trainer.fit`` (from the
    point's last epoch checkpoint when it was killed before)."""
    _quiet()
    settings = trainer_settings(cfg.clip, cfg.precision, cfg.train.accum_steps, device)
    pl.seed_everything(cfg.seed, verbose=False)
    module = task.module(lr=cfg.train.lr)
    data = task.datamodule()
    cb = StabilityCallback(folder, per_layer=cfg.telemetry.per_layer, sinks=sinks,
                           underflow_every=cfg.monitor.underflow_every)
    ckpt = trainer_checkpoint(
        folder, cfg, lambda resume: folder / LIGHTNING_CKPT.format(epoch=resume.epoch))
    saver = EpochCheckpoint(folder, cfg, cb, resuming=ckpt is not None)
    trainer = pl.Trainer(max_epochs=cfg.train.epochs, callbacks=[cb, saver], **QUIET, **settings)
    if ckpt is not None:
        log.info("resuming the fit from %s", ckpt)
    # weights_only explicitly: Lightning's None defers to torch's default, which an
    # environment variable (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD) can turn into unpickling
    return Fit(model=module, callback=cb,
               run=lambda: trainer.fit(module, datamodule=data,
                                       ckpt_path=None if ckpt is None else str(ckpt),
                                       weights_only=True),
               ended=lambda: _remove_checkpoints(folder))


def _remove_checkpoints(folder: Path) -> None:
    # The run ended (finished or diverged): nothing to resume, as our loop leaves it.
    for path in folder.glob(LIGHTNING_CKPT.format(epoch="*")):
        path.unlink(missing_ok=True)


def rebuild(task: Task, cfg: RunConfig) -> nn.Module:
    """A fresh module of the task (the caller loads the checkpoint's weights)."""
    return task.module(lr=cfg.train.lr)


def evaluate(task: Task, cfg: RunConfig, model: nn.Module, dataset: Any,
             device: str) -> dict[str, float]:
    """The module's own ``validation_step`` over ``dataset`` under the run's precision."""
    _quiet()
    settings = trainer_settings(cfg.clip, cfg.precision, 1, device)
    trainer = pl.Trainer(**QUIET, **{k: v for k, v in settings.items()
                                     if k in ("accelerator", "precision", "plugins")})
    got = trainer.validate(model, dataloaders=DataLoader(dataset, batch_size=1024),
                           verbose=False)[0]
    return {"loss": float(got["val_loss"]), "acc": float(got.get("val_acc", float("nan")))}


class _Forward(nn.Module):
    """The module's ``forward`` as a plain ``nn.Module`` (what the MLflow Model exports)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def example(task: Task, model: nn.Module) -> tuple[nn.Module, np.ndarray]:
    """The module's forward and the first validation inputs (the test split stays sealed)."""
    data = task.datamodule()
    data.setup("validate")
    batch = next(iter(data.val_dataloader()))
    x = batch[0] if isinstance(batch, list | tuple) else batch
    return _Forward(model), x[:EXAMPLE_ROWS].numpy()
