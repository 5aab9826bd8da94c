"""A tiny GPT-2 (2 layers, built from a config: nothing is downloaded) trained by the HF
Trainer on a generated character corpus, over precision x clipping x seeds, each run tracked.

    python study.py                 # 8 runs into ./mlflow.db (experiment hf-gpt2)
    stability ui

Each run is the Trainer as its user would set it up, with ``StabilityCallback`` attached
(every optimizer step, not every ``logging_steps``) and a ``TrackedRun``. Our settings reach
``TrainingArguments`` through ``training_arguments``, which refuses fp16 on CPU (accelerate
would train it in fp32) and value clipping, one line naming the key.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from stability.core.config import ClipConfig, PrecisionConfig, TrackingConfig
from stability.core.validation import ConfigError
from stability.integrations.hf import StabilityCallback, training_arguments
from stability.integrations.record import trainer_record
from stability.tasks.char_lm import ALPHABET, CorpusConfig, corpus
from stability.tracking.run import TrackedRun

SEQ = 32


class Windows(Dataset):
    """Windows of ``SEQ`` character ids; the model shifts the labels itself."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def data(num_samples: int = 600) -> tuple[Windows, Windows]:
    """The corpus of ``stability.tasks.char_lm`` (seeded by its own data seed), 85/15."""
    text = corpus(CorpusConfig(num_samples=num_samples, seq_len=SEQ - 1))
    ids = torch.tensor([ALPHABET.index(c) for c in text]).view(num_samples, SEQ)
    cut = int(0.85 * num_samples)
    return Windows(ids[:cut]), Windows(ids[cut:])


def model() -> GPT2LMHeadModel:
    """A 2-layer GPT-2 from a config (random initialisation under the run's seed)."""
    return GPT2LMHeadModel(GPT2Config(vocab_size=len(ALPHABET), n_positions=SEQ, n_embd=64,
                                      n_layer=2, n_head=4))


def run_point(precision: str, max_norm: float | None, seed: int, epochs: int, out: Path,
              tracking: TrackingConfig) -> dict:
    """One (settings, seed) run; its summary."""
    clip = ClipConfig(enabled=max_norm is not None, max_norm=max_norm or 1.0)
    mapped = training_arguments(clip, PrecisionConfig(precision), 1, "cpu")  # may refuse
    settings = {"precision.name": precision, "clip.enabled": clip.enabled,
                "clip.max_norm": max_norm, "train.accum_steps": 1, "train.epochs": epochs}
    folder = out / f"{precision}-clip{max_norm}-s{seed}"
    record = trainer_record(folder, target="transformers.GPT2LMHeadModel", trainer="hf",
                            settings=settings, seed=seed, sweep_id="hf-gpt2",
                            loss_name="cross-entropy", tracking=tracking)
    train, val = data()
    with TrackedRun(record) as tracked:
        torch.manual_seed(seed)
        args = TrainingArguments(output_dir=str(folder / "hf"), num_train_epochs=epochs,
                                 per_device_train_batch_size=32, learning_rate=3e-3,
                                 eval_strategy="epoch", save_strategy="no", report_to="none",
                                 logging_strategy="epoch", seed=seed, disable_tqdm=True,
                                 **mapped)
        trainer = Trainer(model=model(), args=args, train_dataset=train, eval_dataset=val)
        cb = StabilityCallback(folder, per_layer=True, sinks=[tracked.sink]).attach(trainer)
        trainer.train()
        summary = cb.summary()
        tracked.finish(summary, "finished")
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--out", type=Path, default=Path("runs"))
    p.add_argument("--uri", default=f"sqlite:///{Path('mlflow.db').resolve()}")
    a = p.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    tracking = TrackingConfig(uri=a.uri, experiment="hf-gpt2")
    try:
        for precision in a.precisions:
            for max_norm in (None, 0.5):
                for seed in a.seeds:
                    s = run_point(precision, max_norm, seed, a.epochs, a.out, tracking)
                    print(f"{precision} clip={max_norm} seed={seed}: best eval loss "
                          f"{s['best_val_loss']:.4f}, clipped {s['clip_fraction']:.0%} of "
                          f"{s['optimizer_steps']} steps, skipped {s['skip_count']}")
    except ConfigError as err:  # a setting the Trainer cannot honour: before any training
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
