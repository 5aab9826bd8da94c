"""The adding problem (Hochreiter & Schmidhuber 1997), where exploding gradients are real.

Each input is a sequence of ``seq_len`` steps with two channels: a value drawn uniformly from
[0, 1] and a marker that is 1 at exactly two steps (one in each half of the sequence) and 0
elsewhere. The target is the sum of the two marked values; the loss is the mean squared error.
Predicting the constant 1.0 scores the variance of the target, 1/6 ~ 0.167: a model below it
has learnt to carry information across the sequence. Pascanu, Mikolov & Bengio (2013) used it
with a tanh RNN to show exploding gradients and the effect of norm clipping.

Data and split depend on ``data.seed`` alone; the test split is sealed (``sealed_test``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from stability.core.config import ConfigError
from stability.core.task import require_winner

BASELINE_MSE = 1 / 6  # variance of the sum of two U(0, 1): the constant predictor's MSE


SPECTRAL_RADIUS = 1.2  # the exploding regime; conf/task/adding.yaml has the measurements


@dataclass(frozen=True)
class AddingData:
    """The ``data`` section of the adding task."""

    seed: int = 42
    num_samples: int = 4000
    seq_len: int = 50  # conf/task/adding.yaml says why (a test keeps the two equal)
    val_fraction: float = 0.15
    test_fraction: float = 0.15

    def __post_init__(self) -> None:
        for key, ok, allowed in (
            ("seed", isinstance(self.seed, int), "an integer"),
            ("num_samples", isinstance(self.num_samples, int) and self.num_samples >= 20,
             "an integer >= 20"),
            ("seq_len", isinstance(self.seq_len, int) and self.seq_len >= 2, "an integer >= 2"),
            ("val_fraction", 0 < self.val_fraction < 0.5, "a fraction in (0, 0.5)"),
            ("test_fraction", 0 < self.test_fraction < 0.5, "a fraction in (0, 0.5)"),
        ):
            if not ok:
                raise ConfigError(f"data.{key}={getattr(self, key)!r} is invalid: allowed "
                                  f"values are {allowed}")


def generate(cfg: AddingData) -> tuple[torch.Tensor, torch.Tensor, dict[str, np.ndarray]]:
    """Inputs (N, seq_len, 2), targets (N,) and the train/val/test indices, from ``cfg.seed``."""
    rng = np.random.default_rng(cfg.seed)
    n, t = cfg.num_samples, cfg.seq_len
    values = rng.uniform(0.0, 1.0, size=(n, t)).astype(np.float32)
    half = t // 2
    first = rng.integers(0, half, size=n)
    second = rng.integers(half, t, size=n)
    marker = np.zeros((n, t), dtype=np.float32)
    rows = np.arange(n)
    marker[rows, first] = 1.0
    marker[rows, second] = 1.0
    x = np.stack([values, marker], axis=-1)
    y = values[rows, first] + values[rows, second]
    perm = rng.permutation(n)
    n_test, n_val = round(n * cfg.test_fraction), round(n * cfg.val_fraction)
    idx = {"test": perm[:n_test], "val": perm[n_test : n_test + n_val],
           "train": perm[n_test + n_val :]}
    return torch.from_numpy(x), torch.from_numpy(y), {k: np.sort(v) for k, v in idx.items()}


class SequenceRegressor(nn.Module):
    """A one-layer tanh RNN over (batch, seq_len, channels) and a linear head: (batch,).

    Args:
        channels: input channels.
        hidden_size: recurrent width.
        spectral_radius: ``None`` keeps PyTorch's uniform init (spectral radius ~0.58, the
            vanishing regime); a number draws the recurrent matrix orthogonal and scales it,
            so every eigenvalue has exactly that modulus (above 1: the exploding regime).
    """

    def __init__(self, channels: int = 2, hidden_size: int = 64,
                 spectral_radius: float | None = None) -> None:
        super().__init__()
        self.rnn = nn.RNN(channels, hidden_size, num_layers=1, nonlinearity="tanh",
                          batch_first=True)
        if spectral_radius is not None:
            with torch.no_grad():
                nn.init.orthogonal_(self.rnn.weight_hh_l0)
                self.rnn.weight_hh_l0.mul_(spectral_radius)
        self.head = nn.Linear(hidden_size, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1]).squeeze(-1)


class AddingTask:
    """The adding problem with a tanh RNN and MSE (``conf/task/adding.yaml``).

    Args:
        data: ``AddingData`` keys.
        model: ``hidden_size``.
    """

    loss_name: ClassVar[str] = "MSE"

    def __init__(self, data: Mapping[str, Any] | None = None,
                 model: Mapping[str, Any] | None = None) -> None:
        self.data = AddingData(**(data or {}))
        model = dict(model or {})
        self.hidden_size = model.pop("hidden_size", 64)
        self.spectral_radius = model.pop("spectral_radius", SPECTRAL_RADIUS)
        if model:
            raise ConfigError(f"unknown key model.{sorted(model)[0]}: allowed keys are "
                              "hidden_size, spectral_radius")
        if self.spectral_radius is not None and not (
                isinstance(self.spectral_radius, int | float) and self.spectral_radius > 0):
            raise ConfigError(f"model.spectral_radius={self.spectral_radius!r} is invalid: "
                              "allowed values are null or a number > 0")
        if not isinstance(self.hidden_size, int) or self.hidden_size < 1:
            raise ConfigError(f"model.hidden_size={self.hidden_size!r} is invalid: allowed "
                              "values are an integer >= 1")
        self._x, self._y, self._idx = generate(self.data)
        self._mse_sum = nn.MSELoss(reduction="sum")

    def _part(self, name: str) -> TensorDataset:
        i = torch.from_numpy(self._idx[name])
        return TensorDataset(self._x[i], self._y[i])

    def model(self) -> nn.Module:
        """A fresh tanh RNN regressor."""
        return SequenceRegressor(2, self.hidden_size, self.spectral_radius)

    def train_val(self) -> tuple[TensorDataset, TensorDataset]:
        """Training and validation splits (in-memory tensors)."""
        return self._part("train"), self._part("val")

    def sealed_test(self, *, winner: str) -> TensorDataset:
        """The sealed test split, for the selected winner only."""
        require_winner(winner)
        return self._part("test")

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean squared error (in float32 under autocast)."""
        return nn.functional.mse_loss(output.float(), target)

    def metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Summed squared error, and how many predictions land within 0.04 of the target."""
        err = output.float() - target
        # "Solved" in Hochreiter & Schmidhuber: absolute error below 0.04.
        return {"loss": self._mse_sum(output.float(), target), "acc": (err.abs() < 0.04).sum()}
