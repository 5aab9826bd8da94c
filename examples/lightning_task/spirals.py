"""A user's Lightning code: an MLP on two spirals, its optimizer and LR schedule its own.

Nothing here imports ``stability``. ``SpiralTask`` at the end is all a study needs: it says
the trainer is Lightning (``trainer = "lightning"``) and hands over the module (with the
study's learning rate), the data module and the sealed test split. ``task/spirals.yaml``
selects it: ``stability sweep -m --config-dir . task=spirals``.
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def spirals(n: int, noise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points on two interleaved spirals, float labels 0/1."""
    g = torch.Generator().manual_seed(seed)
    label = torch.randint(0, 2, (n,), generator=g).float()
    t = torch.rand(n, generator=g) * 3 * math.pi
    angle = t + label * math.pi
    x = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], 1) / (3 * math.pi)
    return x + noise * torch.randn(n, 2, generator=g), label


class SpiralData(pl.LightningDataModule):
    """2000 points (the data never depends on the training seed), 70/15/15 train/val/test."""

    def __init__(self, batch_size: int = 32, data_seed: int = 0) -> None:
        super().__init__()
        x, y = spirals(2000, 0.02, data_seed)
        self.train, self.val = TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:1700],
                                                                                y[1400:1700])
        self.test = TensorDataset(x[1700:], y[1700:])  # SpiralTask.sealed_test only
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=1024)


class SpiralMLP(pl.LightningModule):
    """MLP classifier; AdamW with a per-step exponential LR decay (the user's choice)."""

    def __init__(self, hidden: int = 64, lr: float = 3e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                 nn.Tanh(), nn.Linear(hidden, 1), nn.Flatten(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        x, y = batch
        out = self(x).float()
        return nn.functional.binary_cross_entropy_with_logits(out, y), out, y

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        return self._loss(batch)[0]

    def validation_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        loss, out, y = self._loss(batch)
        self.log("val_loss", loss)
        self.log("val_acc", ((out > 0).float() == y).float().mean())

    def configure_optimizers(self):  # noqa: ANN201
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.999)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class SpiralTask:
    """What ``stability sweep`` needs to study ``SpiralMLP`` under Lightning (no subclassing)."""

    trainer = "lightning"  # trained by lightning.pytorch.Trainer with StabilityCallback
    loss_name = "BCE"  # the figures' loss axis

    def __init__(self, hidden: int = 64, batch_size: int = 32, data_seed: int = 0) -> None:
        self.hidden, self.batch_size, self.data_seed = hidden, batch_size, data_seed

    def module(self, lr: float) -> SpiralMLP:
        """The user's module at the study's learning rate (train.lr); torch is seeded."""
        return SpiralMLP(self.hidden, lr)

    def datamodule(self) -> SpiralData:
        """Training and validation loaders."""
        return SpiralData(self.batch_size, self.data_seed)

    def sealed_test(self, *, winner: str) -> TensorDataset:
        """The test split: only the report opens it, for the winner chosen on validation."""
        if not winner:
            raise PermissionError("the test split is for the selected winner only")
        return SpiralData(self.batch_size, self.data_seed).test
