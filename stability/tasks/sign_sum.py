"""The default task: predict whether the sum of a length-30 sequence is positive.

``SignSumTask`` is the task (``conf/task/sign_sum.yaml``); ``SequenceClassifier`` is its model:
a one-layer recurrent encoder and a linear head on its last state.

The data and its stratified train/val/test split depend on ``data.seed`` alone; the
training seed never changes them. The test split is sealed: ``make_splits`` never
returns it, and ``open_test_split`` is the one guarded way in, used only by the
report's final evaluation of the selected winner.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from stability.core.task import require_winner
from stability.core.validation import positive_int, require

log = logging.getLogger(__name__)

CELLS = ("rnn", "gru", "lstm")


@dataclass(frozen=True)
class DataConfig:
    """The ``data`` section. Only ``seed`` decides the data and the split."""

    seed: int = 42
    num_samples: int = 3000
    seq_len: int = 30
    val_fraction: float = 0.15
    test_fraction: float = 0.15

    def __post_init__(self) -> None:
        require(isinstance(self.seed, int), "data.seed", self.seed, "an integer")
        require(
            isinstance(self.num_samples, int) and self.num_samples >= 20,
            "data.num_samples",
            self.num_samples,
            "an integer >= 20",
        )
        positive_int("data.seq_len", self.seq_len)
        for key, frac in (("data.val_fraction", self.val_fraction),
                          ("data.test_fraction", self.test_fraction)):
            require(0 < frac < 0.5, key, frac, "a fraction in (0, 0.5)")


@dataclass(frozen=True)
class ModelConfig:
    """The ``model`` section: the ``SequenceClassifier`` shape."""

    cell: str = "rnn"
    hidden_size: int = 48

    def __post_init__(self) -> None:
        require(self.cell in CELLS, "model.cell", self.cell, " | ".join(CELLS))
        positive_int("model.hidden_size", self.hidden_size)


class Split(TensorDataset):
    """Inputs ``x`` of shape (N, seq_len, 1) float32 and labels ``y`` of shape (N,) float32.

    A ``TensorDataset``, so the run loop indexes its tensors directly (no DataLoader).
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        super().__init__(x, y)

    @property
    def x(self) -> torch.Tensor:
        """The inputs."""
        return self.tensors[0]

    @property
    def y(self) -> torch.Tensor:
        """The labels."""
        return self.tensors[1]


@dataclass(frozen=True)
class TrainValSplits:
    """What training may see."""

    train: Split
    val: Split


def _generate(cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(cfg.seed)
    x = rng.standard_normal((cfg.num_samples, cfg.seq_len, 1), dtype=np.float32)
    y = (x.sum(axis=(1, 2)) > 0).astype(np.float32)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    # Stratified: split each class separately with the same fractions.
    for label in (0.0, 1.0):
        idx = rng.permutation(np.flatnonzero(y == label))
        n_test = round(len(idx) * cfg.test_fraction)
        n_val = round(len(idx) * cfg.val_fraction)
        parts["test"].append(idx[:n_test])
        parts["val"].append(idx[n_test : n_test + n_val])
        parts["train"].append(idx[n_test + n_val :])
    return x, y, {k: np.sort(np.concatenate(v)) for k, v in parts.items()}


def _split(x: np.ndarray, y: np.ndarray, idx: np.ndarray) -> Split:
    return Split(torch.from_numpy(x[idx].copy()), torch.from_numpy(y[idx].copy()))


def make_splits(cfg: DataConfig) -> TrainValSplits:
    """Train and validation splits; the test split is not returned.

    Args:
        cfg: data configuration; ``cfg.seed`` fully determines data and split.

    Returns:
        The training and validation splits as CPU tensors.
    """
    x, y, idx = _generate(cfg)
    return TrainValSplits(train=_split(x, y, idx["train"]), val=_split(x, y, idx["val"]))


def split_sizes(cfg: DataConfig) -> dict[str, int]:
    """Sizes of the three splits (reading sizes does not open the test data)."""
    _, _, idx = _generate(cfg)
    return {k: len(v) for k, v in idx.items()}


def open_test_split(cfg: DataConfig, *, winner: str) -> Split:
    """The sealed test split. Only the report's evaluation of the selected winner calls this.

    Args:
        cfg: data configuration of the winning runs.
        winner: fingerprint of the config chosen on validation loss; must be non-empty,
            which forces the caller to have made the selection first.

    Returns:
        The test split.

    Raises:
        PermissionError: no winner was named.
    """
    require_winner(winner)
    log.info("opening the sealed test split for winner %s", winner)
    x, y, idx = _generate(cfg)
    return _split(x, y, idx["test"])

_CELLS: dict[str, type[nn.RNNBase]] = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


class SequenceClassifier(nn.Module):
    """Binary classifier over sequences of shape (batch, seq_len, 1); returns logits (batch,)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        kwargs = {"nonlinearity": "tanh"} if cfg.cell == "rnn" else {}
        self.rnn = _CELLS[cfg.cell](
            input_size=1, hidden_size=cfg.hidden_size, num_layers=1, batch_first=True, **kwargs
        )
        self.head = nn.Linear(cfg.hidden_size, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            out = self._rnn_cpu_low_precision(x, torch.get_autocast_dtype("cpu"))
        else:
            out, _ = self.rnn(x)
        return self.head(out[:, -1]).squeeze(-1)

    def _rnn_cpu_low_precision(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # CPU autocast runs nn.RNN in the low-precision dtype, but leaves nn.GRU in float32
        # (an "fp16" GRU run would silently be fp32) and crashes nn.LSTM in float16 (oneDNN
        # "could not create a primitive descriptor"). Do what autocast does for nn.RNN, for
        # every cell: cast input and weights (gradients still flow to the fp32 parameters)
        # and run the cell with autocast off. For nn.RNN this is bit-identical to autocast.
        weights = {name: p.to(dtype) for name, p in self.rnn.named_parameters()}
        with torch.autocast("cpu", enabled=False):
            out, _ = torch.func.functional_call(self.rnn, weights, (x.to(dtype),))
        return out


class SignSumTask:
    """The default task: ``SequenceClassifier`` on the sign-of-sum data, BCE loss.

    Args:
        data: the ``data`` section (``DataConfig`` keys).
        model: the ``model`` section (``ModelConfig`` keys).
    """

    loss_name: ClassVar[str] = "BCE"
    # Logits near zero at init on balanced classes: BCE = log 2 (``stability check``).
    expected_init_loss: ClassVar[float] = 0.6931471805599453
    # Typed sections: the run config validates them with the rest, all mistakes at once.
    section_types: ClassVar[dict[str, type]] = {"data": DataConfig, "model": ModelConfig}
    # Runs of this task were fingerprinted before ``task._target_`` existed: leaving it out of
    # the hash keeps their ids (resume, de-duplication) valid.
    hash_target: ClassVar[bool] = False

    def __init__(self, data: Mapping[str, Any] | None = None,
                 model: Mapping[str, Any] | None = None) -> None:
        self.data = data if isinstance(data, DataConfig) else DataConfig(**(data or {}))
        self.model_cfg = model if isinstance(model, ModelConfig) else ModelConfig(**(model or {}))
        self._bce = nn.BCEWithLogitsLoss()
        self._bce_sum = nn.BCEWithLogitsLoss(reduction="sum")

    def model(self) -> nn.Module:
        """A fresh ``SequenceClassifier`` (initialised from the caller's torch seed)."""
        return SequenceClassifier(self.model_cfg)

    def train_val(self) -> tuple[Split, Split]:
        """The training and validation splits."""
        splits = make_splits(self.data)
        return splits.train, splits.val

    def sealed_test(self, *, winner: str) -> Split:
        """The sealed test split (``open_test_split``), for the selected winner only."""
        return open_test_split(self.data, winner=winner)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean binary cross-entropy on logits."""
        return self._bce(output, target)

    def metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Summed BCE and the count of correct signs."""
        output = output.float()
        return {"loss": self._bce_sum(output, target),
                "acc": ((output > 0).float() == target).sum()}
