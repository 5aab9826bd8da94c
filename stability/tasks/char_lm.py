"""A small causal character Transformer on a corpus generated from ``data.seed``.

The corpus needs no download and is the same on every machine: a seeded "language" of
pseudo-words (letters drawn at random, lengths 2-8) whose order follows a sparse random word
bigram table (each word is followed by one of a few words), written out with spaces and
periods. A model must learn spelling (the rest of a word from its start) and which words
follow which: a real next-character prediction task whose entropy is well below log(vocab).
Text shipped inside an installed package was the alternative; none is both long enough and
guaranteed present (docstrings change with every Python release), so generated it is.

Targets are one-hot distributions over the vocabulary (float), and the loss is the per-token
cross-entropy against them: equal to the usual index form, and a target spike
(``fault.loss_spike_at_step`` multiplies targets by 1e8) becomes a 1e8 times larger loss
instead of an out-of-range token id.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 (the PyTorch convention)
from torch.utils.data import TensorDataset

from stability.core.config import ConfigError
from stability.core.task import require_winner

ALPHABET = string.ascii_lowercase + " ."


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: allowed values are {allowed}")


@dataclass(frozen=True)
class CorpusConfig:
    """The ``data`` section: the corpus and its windows."""

    seed: int = 42
    num_samples: int = 1000  # windows of seq_len + 1 characters (conf/task/char_lm.yaml)
    seq_len: int = 32  # context length
    words: int = 300  # pseudo-words in the language
    val_fraction: float = 0.15
    test_fraction: float = 0.15

    def __post_init__(self) -> None:
        _check(isinstance(self.seed, int), "data.seed", self.seed, "an integer")
        _check(isinstance(self.num_samples, int) and self.num_samples >= 20, "data.num_samples",
               self.num_samples, "an integer >= 20")
        _check(isinstance(self.seq_len, int) and self.seq_len >= 2, "data.seq_len",
               self.seq_len, "an integer >= 2")
        _check(isinstance(self.words, int) and self.words >= 2, "data.words", self.words,
               "an integer >= 2")
        for key in ("val_fraction", "test_fraction"):
            v = getattr(self, key)
            _check(0 < v < 0.5, f"data.{key}", v, "a fraction in (0, 0.5)")


@dataclass(frozen=True)
class TransformerConfig:
    """The ``model`` section: a pre-LayerNorm causal Transformer."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4

    def __post_init__(self) -> None:
        for key in ("d_model", "n_layers", "n_heads"):
            v = getattr(self, key)
            _check(isinstance(v, int) and v >= 1, f"model.{key}", v, "an integer >= 1")
        _check(self.d_model % self.n_heads == 0, "model.n_heads", self.n_heads,
               f"a divisor of model.d_model={self.d_model}")


def corpus(cfg: CorpusConfig) -> str:
    """The generated text: at least ``num_samples * (seq_len + 1)`` characters."""
    rng = np.random.default_rng(cfg.seed)
    letters = np.array(list(string.ascii_lowercase))
    vocab = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(cfg.words)]
    follow = rng.integers(0, cfg.words, size=(cfg.words, 4))  # each word: 4 possible successors
    weights = rng.dirichlet(np.ones(4), size=cfg.words)
    need = cfg.num_samples * (cfg.seq_len + 1)
    out, length, w = [], 0, int(rng.integers(cfg.words))
    while length < need:
        sentence = []
        for _ in range(int(rng.integers(4, 12))):
            sentence.append(vocab[w])
            w = int(follow[w, rng.choice(4, p=weights[w])])
        text = " ".join(sentence) + ". "
        out.append(text)
        length += len(text)
    return "".join(out)[:need]


class CausalTransformer(nn.Module):
    """Token + position embeddings, ``n_layers`` pre-LN blocks, a vocabulary head."""

    def __init__(self, vocab: int, seq_len: int, cfg: TransformerConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, cfg.d_model)
        self.pos = nn.Embedding(seq_len, cfg.d_model)
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, 4 * cfg.d_model,
                                           dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))  # (batch, seq_len, vocab) logits


class CharLMTask:
    """Next-character prediction (``conf/task/char_lm.yaml``): per-token cross-entropy.

    Args:
        data: ``CorpusConfig`` keys.
        model: ``TransformerConfig`` keys.
    """

    loss_name: ClassVar[str] = "cross-entropy"

    def __init__(self, data: Mapping[str, Any] | None = None,
                 model: Mapping[str, Any] | None = None) -> None:
        self.data = CorpusConfig(**(data or {}))
        self.arch = TransformerConfig(**(model or {}))
        ids = torch.tensor([ALPHABET.index(c) for c in corpus(self.data)], dtype=torch.long)
        windows = ids.view(self.data.num_samples, self.data.seq_len + 1)
        self._x = windows[:, :-1].contiguous()
        self._y = F.one_hot(windows[:, 1:], len(ALPHABET)).float()
        rng = np.random.default_rng(self.data.seed + 1)  # the split: data.seed alone
        perm = torch.from_numpy(rng.permutation(self.data.num_samples))
        n_test = round(self.data.num_samples * self.data.test_fraction)
        n_val = round(self.data.num_samples * self.data.val_fraction)
        self._idx = {"test": perm[:n_test], "val": perm[n_test : n_test + n_val],
                     "train": perm[n_test + n_val :]}

    def _part(self, name: str) -> TensorDataset:
        i = self._idx[name].sort().values
        return TensorDataset(self._x[i], self._y[i])

    def model(self) -> nn.Module:
        """A fresh causal Transformer."""
        return CausalTransformer(len(ALPHABET), self.data.seq_len, self.arch)

    def train_val(self) -> tuple[TensorDataset, TensorDataset]:
        """Training and validation windows."""
        return self._part("train"), self._part("val")

    def sealed_test(self, *, winner: str) -> TensorDataset:
        """The sealed test windows, for the selected winner only."""
        require_winner(winner)
        return self._part("test")

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean per-token cross-entropy (float32) against the one-hot targets."""
        return F.cross_entropy(output.float().flatten(0, 1), target.flatten(0, 1))

    def metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-window mean cross-entropy and token accuracy, summed over windows."""
        logits = output.float()
        ce = -(target * F.log_softmax(logits, -1)).sum(-1).mean(-1)
        acc = (logits.argmax(-1) == target.argmax(-1)).float().mean(-1)
        return {"loss": ce.sum(), "acc": acc.sum()}

    def derived(self, means: Mapping[str, float]) -> dict[str, float]:
        """Perplexity of the mean per-token cross-entropy (nats): ``best_val_perplexity``."""
        loss = means["loss"]
        return {"perplexity": math.exp(loss) if loss < 700 else math.inf}
