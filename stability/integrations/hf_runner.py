"""An HF task in a study: the user's model trained by the Hugging Face ``Trainer``.

An HF task (``trainer = "hf"``) provides::

    model() -> PreTrainedModel          # built from a config (nothing downloaded); seeded
    train_val() -> (Dataset, Dataset)   # items the model takes (dicts with labels)
    sealed_test(*, winner: str) -> Dataset
    training_arguments() -> dict        # optional: the TrainingArguments it wants

The point's settings become ``TrainingArguments`` (``hf.training_arguments``): clip ->
``max_grad_norm`` (0: off; value clipping refused), precision -> ``fp16`` / ``bf16`` (fp16 on
CPU refused: accelerate would train it in fp32), ``train.accum_steps`` ->
``gradient_accumulation_steps``, plus ``seed``, ``num_train_epochs`` = ``train.epochs``,
``learning_rate`` = ``train.lr``; evaluation every epoch (``eval_loss`` is the validation loss
the study selects on). The task's own arguments may set anything else (batch size, weight
decay, its schedule), not what the study sets.

Durable: after every epoch (evaluated, its record written) the Trainer saves its own
checkpoint (``hf/checkpoint-<step>``: model, optimizer, scheduler, scaler, random generators,
and the callback's state, ``hf.STATE_NAME``), then ``EpochCheckpoint`` writes our resume point
``checkpoints/last.pt`` naming that step and removes the older Trainer checkpoints. A point
killed in a sweep is resumed as our loop's are: ``claim`` keeps the folder, the ``TrackedRun``
reopens the MLflow run its journal names, and ``Trainer.train(resume_from_checkpoint=...)``
goes on from that epoch (``steps.csv`` cut back to the checkpoint and continued).
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging as hf_logging

from stability.core.config import ConfigError, RunConfig
from stability.core.sinks import StepSink
from stability.core.task import SEALED_TEST, Task
from stability.integrations.hf import StabilityCallback, training_arguments
from stability.integrations.hf_check import probe as probe  # the check adapter
from stability.integrations.protocol import EXAMPLE_ROWS, Fit
from stability.integrations.study import save_resume_point, trainer_checkpoint

REQUIRED = ("model", "train_val", SEALED_TEST)
log = logging.getLogger(__name__)
# Set by the study (the key each comes from) or by this runner: a task may not set them.
STUDY_KEYS = {"max_grad_norm": "clip.*", "fp16": "precision", "bf16": "precision",
              "gradient_accumulation_steps": "train.accum_steps", "use_cpu": "device",
              "learning_rate": "train.lr", "num_train_epochs": "train.epochs", "seed": "seed",
              "eval_strategy": "(evaluated every epoch)", "output_dir": "output_dir",
              "save_strategy": "(saved every epoch, to resume a killed point)",
              "save_total_limit": "(the study keeps the last epoch's checkpoint)",
              "save_only_model": "(a resumed point needs the optimizer and generators)"}
QUIET = {"report_to": "none", "disable_tqdm": True, "logging_strategy": "epoch"}
HF_DIR = "hf"  # the Trainer's output_dir inside the run folder: its checkpoints


def _quiet() -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="transformers")
    # its progress bars ("Writing model shards" at each epoch's checkpoint) on the sweep's
    # terminal: the study's status area says what is running
    hf_logging.disable_progress_bar()


def check(task: Task, cfg: RunConfig, device: str) -> dict[str, Any]:
    """What the Trainer cannot honour: fp16 on CPU, value clipping (``training_arguments``),
    a task's own argument that the study sets.

    Returns:
        The task's own ``TrainingArguments`` keywords.

    Raises:
        ConfigError: naming the key and the allowed values.
    """
    training_arguments(cfg.clip, cfg.precision, cfg.train.accum_steps, device)
    own = dict(getattr(task, "training_arguments", dict)())
    clash = sorted(set(own) & set(STUDY_KEYS))
    if clash:
        raise ConfigError(f"task._target_={cfg.task.target!r}: training_arguments() sets "
                          f"{clash[0]}, which the study sets from {STUDY_KEYS[clash[0]]} "
                          "(allowed: every other TrainingArguments key)")
    return own


def arguments(task: Task, cfg: RunConfig, device: str, folder: Path) -> TrainingArguments:
    """The task's ``training_arguments()`` with the point's settings on top (``check``)."""
    own = check(task, cfg, device)
    mapped = training_arguments(cfg.clip, cfg.precision, cfg.train.accum_steps, device)
    return TrainingArguments(output_dir=str(folder / HF_DIR), eval_strategy="epoch",
                             save_strategy="epoch", learning_rate=cfg.train.lr,
                             num_train_epochs=cfg.train.epochs, seed=cfg.seed,
                             **(QUIET | own), **mapped)


def compute_metrics(task: Task) -> Callable[[Any], dict[str, float]] | None:
    """The Trainer's ``compute_metrics`` for the task: its own ``compute_metrics`` (the HF
    signature), else its ``metrics(output, target)`` (per-batch sums, as our loop takes them)
    turned into means over the evaluated samples, ``acc`` named ``accuracy`` (the Trainer's
    ``eval_accuracy``, our ``val_acc``; ``loss`` is the Trainer's ``eval_loss``). None: the
    task has neither, so the Trainer keeps no predictions."""
    own = getattr(task, "compute_metrics", None)
    if callable(own):
        return own
    metrics = getattr(task, "metrics", None)
    if not callable(metrics):
        return None

    def means(pred: Any) -> dict[str, float]:
        out = pred.predictions[0] if isinstance(pred.predictions, tuple) else pred.predictions
        target = torch.as_tensor(pred.label_ids)
        sums = metrics(torch.as_tensor(out), target)
        n = max(int(target.shape[0]), 1)
        return {("accuracy" if k == "acc" else k): float(v) / n
                for k, v in sums.items() if k != "loss"}

    return means


def _checkpoint(folder: Path, step: int) -> Path:
    return folder / HF_DIR / f"{PREFIX_CHECKPOINT_DIR}-{step}"


class EpochCheckpoint(TrainerCallback):
    """After the Trainer saved an epoch's checkpoint: our ``last.pt`` naming its step, then
    the older Trainer checkpoints removed.

    Added after the ``StabilityCallback`` (the Trainer calls callbacks in order), so the
    recorder's state is beside the Trainer's checkpoint before ``last.pt`` names it; a kill at
    any point leaves a ``last.pt`` whose checkpoint exists.
    """

    def __init__(self, folder: Path, cfg: RunConfig, callback: StabilityCallback) -> None:
        self.folder, self.cfg, self.callback = folder, cfg, callback

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Write ``last.pt`` for ``state.global_step``; remove the other checkpoints."""
        rec = self.callback.recorder
        saved = _checkpoint(self.folder, state.global_step)
        if rec is None or not saved.is_dir():
            return
        save_resume_point(self.folder, self.cfg, kwargs["model"], kwargs["optimizer"],
                          state.global_step, rec)
        for old in (self.folder / HF_DIR).glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
            if old != saved:
                shutil.rmtree(old, ignore_errors=True)


def trainer_class(task: Task) -> type[Trainer]:
    """The task's own Trainer subclass (``trainer_class``: its ``compute_loss``), else
    ``Trainer``; ``stability check`` trains with the same (``hf_check.HFLoop``)."""
    return getattr(task, "trainer_class", None) or Trainer


def collator(task: Task) -> dict[str, Any]:
    """``data_collator=task.data_collator()`` when the task has one (dynamic padding)."""
    make = getattr(task, "data_collator", None)
    return {"data_collator": make()} if callable(make) else {}


def _remove_checkpoints(folder: Path) -> None:
    # The run ended (finished or diverged): nothing to resume, as our loop leaves it.
    shutil.rmtree(folder / HF_DIR, ignore_errors=True)


def prepare(task: Task, cfg: RunConfig, device: str, folder: Path,
            sinks: list[StepSink]) -> Fit:
    """The fit of one point: the seeded model, the attached callback, ``Trainer.train`` (from
    the point's last epoch checkpoint when it was killed before)."""
    _quiet()
    args = arguments(task, cfg, device, folder)
    train_set, val_set = task.train_val()
    torch.manual_seed(cfg.seed)  # the initialisation; the Trainer seeds its shuffling itself
    model = task.model()
    trainer = trainer_class(task)(model=model, args=args, train_dataset=train_set,
                                  eval_dataset=val_set, compute_metrics=compute_metrics(task),
                                  **collator(task))
    trainer.remove_callback(PrinterCallback)  # its log lines: steps.csv and MLflow have them
    cb = StabilityCallback(folder, per_layer=cfg.telemetry.per_layer, sinks=sinks,
                           underflow_every=cfg.monitor.underflow_every)
    cb.attach(trainer)
    trainer.add_callback(EpochCheckpoint(folder, cfg, cb))
    ckpt = trainer_checkpoint(folder, cfg,
                              lambda resume: _checkpoint(folder, int(resume.step)))
    if ckpt is not None:
        log.info("resuming the train from %s", ckpt)
    return Fit(model=model, callback=cb,
               run=lambda: trainer.train(
                   resume_from_checkpoint=None if ckpt is None else str(ckpt)),
               ended=lambda: _remove_checkpoints(folder))


def rebuild(task: Task, cfg: RunConfig) -> nn.Module:
    """A fresh model of the task (the caller loads the checkpoint's weights)."""
    return task.model()


def evaluate(task: Task, cfg: RunConfig, model: nn.Module, dataset: Any,
             device: str) -> dict[str, float]:
    """``Trainer.evaluate`` on ``dataset`` under the run's precision: ``eval_loss`` and, with
    the task's metrics (``compute_metrics``), ``eval_accuracy``."""
    _quiet()
    mapped = training_arguments(cfg.clip, cfg.precision, 1, device)
    own = dict(getattr(task, "training_arguments", dict)())
    batch = own.get("per_device_eval_batch_size", own.get("per_device_train_batch_size", 8))
    with tempfile.TemporaryDirectory(prefix="stability-hf-eval-") as tmp:
        args = TrainingArguments(output_dir=tmp, per_device_eval_batch_size=batch,
                                 bf16=mapped["bf16"], fp16=mapped["fp16"],
                                 use_cpu=mapped["use_cpu"], **QUIET)
        trainer = trainer_class(task)(model=model, args=args,
                                      compute_metrics=compute_metrics(task), **collator(task))
        trainer.remove_callback(PrinterCallback)
        got = trainer.evaluate(dataset)
    return {"loss": float(got["eval_loss"]), "acc": float(got.get("eval_accuracy", math.nan))}


class _Logits(nn.Module):
    """The model's logits from its main input (what the MLflow Model exports)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.key = getattr(model, "main_input_name", "input_ids")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.key: x}).logits


def example(task: Task, model: nn.Module) -> tuple[nn.Module, np.ndarray]:
    """Logits from the main input, and the first validation inputs (the test stays sealed)."""
    wrapped = _Logits(model)
    _, val = task.train_val()
    rows = [val[i][wrapped.key] for i in range(min(EXAMPLE_ROWS, len(val)))]
    return wrapped, torch.stack(rows).numpy()
