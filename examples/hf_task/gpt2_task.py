"""A tiny GPT-2 (2 layers, built from a config: nothing is downloaded) for the HF Trainer.

``GPT2Task`` is all a study needs: it says the trainer is the Hugging Face ``Trainer``
(``trainer = "hf"``) and hands over the model, the datasets, the sealed test split and the
``TrainingArguments`` it wants. ``task/gpt2.yaml`` selects it:
``stability sweep -m --config-dir . task=gpt2``. The text is the generated character corpus of
``stability.tasks.char_lm`` (seeded by its own data seed).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel

from stability.tasks.char_lm import ALPHABET, CorpusConfig, corpus


class Windows(Dataset):
    """Windows of character ids; the model shifts the labels itself."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class GPT2Task:
    """Next-character prediction with a 2-layer GPT-2, trained by the HF Trainer."""

    trainer = "hf"  # trained by transformers.Trainer with StabilityCallback attached
    loss_name = "cross-entropy"

    def __init__(self, num_samples: int = 600, seq_len: int = 32, n_layer: int = 2,
                 n_embd: int = 64, batch_size: int = 32) -> None:
        text = corpus(CorpusConfig(num_samples=num_samples, seq_len=seq_len - 1))
        ids = torch.tensor([ALPHABET.index(c) for c in text[:num_samples * seq_len]])
        self.ids = ids.view(num_samples, seq_len)
        self.seq_len, self.n_layer, self.n_embd = seq_len, n_layer, n_embd
        self.batch_size = batch_size
        self.cuts = int(0.7 * num_samples), int(0.85 * num_samples)

    def model(self) -> GPT2LMHeadModel:
        """A fresh GPT-2 from a config; stability has seeded torch with the run's seed."""
        return GPT2LMHeadModel(GPT2Config(vocab_size=len(ALPHABET), n_positions=self.seq_len,
                                          n_embd=self.n_embd, n_layer=self.n_layer, n_head=4,
                                          bos_token_id=ALPHABET.index("."),
                                          eos_token_id=ALPHABET.index(".")))

    def train_val(self) -> tuple[Windows, Windows]:
        """Training and validation windows (70% / 15%)."""
        a, b = self.cuts
        return Windows(self.ids[:a]), Windows(self.ids[a:b])

    def sealed_test(self, *, winner: str) -> Windows:
        """The last 15%: only the report opens it, for the winner chosen on validation."""
        if not winner:
            raise PermissionError("the test split is for the selected winner only")
        return Windows(self.ids[self.cuts[1]:])

    def training_arguments(self) -> dict[str, Any]:
        """What this model wants of the Trainer; the study sets clip, precision, accumulation,
        seed, epochs and lr."""
        return {"per_device_train_batch_size": self.batch_size,
                "per_device_eval_batch_size": 64, "weight_decay": 0.0}
