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
