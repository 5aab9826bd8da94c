"""Tiny trainer tasks for tests: a Lightning task and an HF task that train in about a second.

Imported by path (``task._target_=tests.helpers.trainer_tasks.TinyLightningTask``); each
module-level import of Lightning/transformers is inside the class that needs it, so this file
imports without either.
"""

from __future__ import annotations

import math
import os
import signal
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, (x.sum(1) > 0).float()


# A test sets "epoch" (0-based) and "batch": training_step sends this process SIGTERM there,
# as a sweep's worker being killed (outside the config, so the resumed run is the same point).
# "forwards" (the HF model): SIGTERM at the start of that many-th training forward from now.
SIGTERM_AT: dict[str, int | None] = {"epoch": None, "batch": None, "forwards": None}
# Training micro-batches run by either tiny task (a resumed fit runs fewer than a new one).
TRAINED = {"micro_batches": 0}


class TinyLightningTask:
    """A 4-16-1 MLP as a LightningModule with a per-step StepLR (decays on every step)."""

    trainer = "lightning"
    loss_name = "BCE"

    def __init__(self, n: int = 256, batch_size: int = 16, gamma: float = 0.98) -> None:
        self.n, self.batch_size, self.gamma = n, batch_size, gamma

    def module(self, lr: float) -> nn.Module:
        import lightning.pytorch as pl

        gamma = self.gamma

        class Module(pl.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1),
                                         nn.Flatten(0))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.net(x)

            def training_step(self, batch: Any, i: int) -> torch.Tensor:
                TRAINED["micro_batches"] += 1
                if (self.current_epoch, i) == (SIGTERM_AT["epoch"], SIGTERM_AT["batch"]):
                    os.kill(os.getpid(), signal.SIGTERM)
                x, y = batch
                return nn.functional.binary_cross_entropy_with_logits(self(x).float(), y)

            def validation_step(self, batch: Any, i: int) -> None:
                x, y = batch
                out = self(x).float()
                self.log("val_loss", nn.functional.binary_cross_entropy_with_logits(out, y))
                self.log("val_acc", ((out > 0).float() == y).float().mean())

            def configure_optimizers(self) -> Any:
                opt = torch.optim.AdamW(self.parameters(), lr=lr)
                sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=gamma)
                return {"optimizer": opt, "lr_scheduler": {"scheduler": sched,
                                                           "interval": "step"}}

        return Module()

    def datamodule(self) -> Any:
        import lightning.pytorch as pl

        x, y = _data(self.n)
        cut, bs = int(0.75 * self.n), self.batch_size
        train, val = TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])
        return pl.LightningDataModule.from_datasets(
            train_dataset=train, val_dataset=val, batch_size=bs)

    def sealed_test(self, *, winner: str) -> Dataset:
        if not winner:
            raise PermissionError("the test split is for the selected winner only")
        x, y = _data(64, seed=1)
        return TensorDataset(x, y)



class Pairs(Dataset):
    """``{"x", "labels"}`` items, the form an HF model takes."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def hf_model_class() -> type:
    """A ``PreTrainedModel`` whose loss is BCE (built from a config, nothing downloaded)."""
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import SequenceClassifierOutput

    class TinyConfig(PretrainedConfig):
        model_type = "tiny-test"

        def __init__(self, hidden: int = 16, **kw: Any) -> None:
            super().__init__(**kw)
            self.hidden = hidden

    class TinyModel(PreTrainedModel):
        config_class = TinyConfig
        main_input_name = "x"

        def __init__(self, config: TinyConfig) -> None:
            super().__init__(config)
            self.net = nn.Sequential(nn.Linear(4, config.hidden), nn.Tanh(),
                                     nn.Linear(config.hidden, 1), nn.Flatten(0))
            self.post_init()

        def _init_weights(self, module: nn.Module) -> None:
            pass  # torch's own initialisation, under the run's seed

        def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
            TRAINED["micro_batches"] += self.training
            if self.training and SIGTERM_AT["forwards"] is not None:
                SIGTERM_AT["forwards"] -= 1
                if SIGTERM_AT["forwards"] == 0:
                    os.kill(os.getpid(), signal.SIGTERM)
            logits = self.net(x)
            loss = (None if labels is None else
                    nn.functional.binary_cross_entropy_with_logits(logits.float(), labels))
            return SequenceClassifierOutput(loss=loss, logits=logits)

    return TinyModel


class TinyHFTask:
    """The same data for the HF Trainer; ``own`` are extra TrainingArguments."""

    trainer = "hf"
    loss_name = "BCE"

    def __init__(self, n: int = 256, batch_size: int = 16,
                 own: dict[str, Any] | None = None) -> None:
        self.n, self.batch_size, self.own = n, batch_size, dict(own or {})

    def model(self) -> nn.Module:
        model = hf_model_class()
        return model(model.config_class())

    def train_val(self) -> tuple[Dataset, Dataset]:
        x, y = _data(self.n)
        cut = int(0.75 * self.n)
        return Pairs(x[:cut], y[:cut]), Pairs(x[cut:], y[cut:])

    def sealed_test(self, *, winner: str) -> Dataset:
        if not winner:
            raise PermissionError("the test split is for the selected winner only")
        return Pairs(*_data(64, seed=1))

    def metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Batch sums as our loop takes them: the correct signs (``val_acc``)."""
        return {"acc": ((output > 0).float() == target).sum()}

    def training_arguments(self) -> dict[str, Any]:
        return {"per_device_train_batch_size": self.batch_size, "weight_decay": 0.0,
                "lr_scheduler_type": "constant", **self.own}


class NotATrainerTask:
    """Declares a trainer nobody knows."""

    trainer = "keras"

    def __init__(self) -> None:
        self.n = math.nan
