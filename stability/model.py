"""``SequenceClassifier``: a one-layer recurrent encoder and a linear head on its last state."""

from __future__ import annotations

import torch
from torch import nn

from stability.config import ModelConfig

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
        out, _ = self.rnn(x)
        return self.head(out[:, -1]).squeeze(-1)
