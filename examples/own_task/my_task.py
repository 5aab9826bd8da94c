"""A user's own task: a small MLP on two interleaved spirals (the kind of file you write).

Nothing here imports or subclasses ``stability``: a task is any class with these five methods,
built from ``task/my_task.yaml`` by ``hydra.utils.instantiate``. See docs/tasks.md.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset


def spirals(n: int, noise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points on two spirals, labels 0/1 as float (a float target keeps the x1e8
    ``fault.loss_spike_at_step`` a finite loss spike)."""
    g = torch.Generator().manual_seed(seed)
    label = torch.randint(0, 2, (n,), generator=g).float()
    t = torch.rand(n, generator=g) * 3 * math.pi
    angle = t + label * math.pi
    x = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], 1) / (3 * math.pi)
    return x + noise * torch.randn(n, 2, generator=g), label


class MyTask:
    """Binary classification of spiral points with an MLP."""

    def __init__(self, num_samples: int = 2000, noise: float = 0.02, hidden: int = 64,
                 data_seed: int = 0) -> None:
        x, y = spirals(num_samples, noise, data_seed)  # the data never depends on the run seed
        a, b = int(0.7 * num_samples), int(0.85 * num_samples)
        self.hidden = hidden
        self._train, self._val = TensorDataset(x[:a], y[:a]), TensorDataset(x[a:b], y[a:b])
        self._test = TensorDataset(x[b:], y[b:])

    def model(self) -> nn.Module:
        """A fresh model; stability has already seeded torch with the run's seed."""
        h = self.hidden
        return nn.Sequential(nn.Linear(2, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh(),
                             nn.Linear(h, 1), nn.Flatten(0))

    def train_val(self) -> tuple[Dataset, Dataset]:
        """Training and validation data: (input, target) pairs."""
        return self._train, self._val

    def sealed_test(self, *, winner: str) -> Dataset:
        """Test data: only the report opens it, for the winner chosen on validation."""
        assert winner, "the test split is for the selected winner only"
        return self._test

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean over the micro-batch (float32 even under autocast)."""
        return nn.functional.binary_cross_entropy_with_logits(output.float(), target)

    def metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Sums over the batch; ``acc`` becomes val_acc / test_acc."""
        return {"acc": ((output.float() > 0).float() == target).sum()}
