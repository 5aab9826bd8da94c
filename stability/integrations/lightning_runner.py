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

from stability.core.config import RunConfig
from stability.core.sinks import StepSink
from stability.core.task import SEALED_TEST, Task
from stability.integrations.lightning import StabilityCallback, trainer_settings
from stability.integrations.study import Fit

REQUIRED = ("module", "datamodule", SEALED_TEST)
EXAMPLE_ROWS = 5
# What a fit in a study leaves to us: no logger, no checkpoint of its own, no progress bar.
QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
         "enable_model_summary": False}


def _quiet() -> None:
    # One process trains many points: Lightning's per-fit notices would fill the job's log.
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    for notice in (".*does not have many workers.*", ".*srun.*", ".*LeafSpec.*"):
        warnings.filterwarnings("ignore", notice)


def check(task: Task, cfg: RunConfig, device: str) -> None:
    """Every setting maps onto the Trainer (``trainer_settings``): nothing to refuse here."""
    trainer_settings(cfg.clip, cfg.precision, cfg.train.accum_steps, device)


def prepare(task: Task, cfg: RunConfig, device: str, folder: Path,
            sinks: list[StepSink]) -> Fit:
    """The fit of one point: the seeded module, the callback, ``Trainer.fit``."""
    _quiet()
    settings = trainer_settings(cfg.clip, cfg.precision, cfg.train.accum_steps, device)
    pl.seed_everything(cfg.seed, verbose=False)
    module = task.module(lr=cfg.train.lr)
    data = task.datamodule()
    cb = StabilityCallback(folder, per_layer=cfg.telemetry.per_layer, sinks=sinks,
                           underflow_every=cfg.monitor.underflow_every)
    trainer = pl.Trainer(max_epochs=cfg.train.epochs, callbacks=[cb], **QUIET, **settings)
    return Fit(module, cb, lambda: trainer.fit(module, datamodule=data))


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
