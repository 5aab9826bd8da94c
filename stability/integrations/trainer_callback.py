"""What both trainers' ``StabilityCallback`` share: the params of what the trainer built,
the ``RecordingCallback`` state (its ``StepRecorder``, the window being accumulated) and the
samples of a micro-batch. The step's measurement and records are ``step_recorder``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stability.core.config import ClipConfig
from stability.core.sinks import StepSink
from stability.integrations.step_recorder import StepRecorder


def class_path(cls: type) -> str:
    """``torch.optim.AdamW`` rather than ``torch.optim.adamw.AdamW`` where torch exports it."""
    if getattr(torch.optim, cls.__name__, None) is cls:
        return f"torch.optim.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def optimizer_params(optimizer: torch.optim.Optimizer) -> dict[str, str]:
    """The params of the optimizer a trainer built: ``optim._target_`` (its class),
    ``optim.<name>`` for each hyperparameter it takes (from its first parameter group: what a
    trainer passed per group, e.g. the HF Trainer's weight decay, is there), ``optim.lr`` (the
    initial lr, before any schedule), and ``train.weight_decay``."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    group = inner.param_groups[0]
    params = {"optim._target_": class_path(type(inner)),
              "optim.lr": str(group.get("initial_lr", group["lr"])),
              "train.weight_decay": str(group.get("weight_decay", 0.0))}
    for key in inner.defaults:
        if key not in ("lr", "weight_decay", "params"):
            params[f"optim.{key}"] = str(group.get(key, inner.defaults[key]))
    return params


def schedule_params(scheduler: Any) -> dict[str, str]:
    """``schedule._target_``: the class of the LR scheduler a trainer built (``None``: none)."""
    inner = getattr(scheduler, "scheduler", scheduler)  # accelerate's AcceleratedScheduler
    return {"schedule._target_": "None" if inner is None else class_path(type(inner))}


class RecordingCallback:
    """What both trainers' ``StabilityCallback`` hold (mixed into each trainer's callback
    class): where and what to record, the ``StepRecorder`` once training starts, and the
    micro-batches of the optimizer step being accumulated.

    Args:
        folder: the run folder.
        per_layer: also write ``layer_norms.csv``.
        sinks: more step sinks (e.g. ``TrackedRun.sink``).
        val_loss_key: the trainer's metric that is the validation loss.
        val_acc_key: the trainer's metric that is the validation accuracy (nan when absent).
        underflow_every: sample the fp16 underflow share on step 1 and every N steps.
    """

    def __init__(self, folder: str | Path, *, per_layer: bool, sinks: Sequence[StepSink],
                 val_loss_key: str, val_acc_key: str, underflow_every: int) -> None:
        self.folder = Path(folder)
        self.per_layer = per_layer
        self.extra_sinks = tuple(sinks)
        self.val_loss_key, self.val_acc_key = val_loss_key, val_acc_key
        self.underflow_every = underflow_every
        self.recorder: StepRecorder | None = None
        self._window_loss: torch.Tensor | float = 0.0
        self._micro, self._samples = 0, 0
        self._sched_before = 0
        self._epoch_t0 = 0.0

    def start_recorder(self, clip: ClipConfig, model: nn.Module,
                       derive_norm_clip: bool = True) -> StepRecorder:
        """The run's ``StepRecorder`` (when the trainer starts: its clip setting, its model)."""
        self.recorder = StepRecorder(self.folder, clip, model, per_layer=self.per_layer,
                                     sinks=self.extra_sinks,
                                     underflow_every=self.underflow_every,
                                     derive_norm_clip=derive_norm_clip)
        return self.recorder

    def add_micro_batch(self, loss: torch.Tensor | float, batch: Any) -> None:
        """One micro-batch of the step: its loss (summed as given) and its samples."""
        # The window's first loss is taken as it is (0.0 + loss would be one more tensor op)
        self._window_loss = loss if self._micro == 0 else self._window_loss + loss
        self._micro += 1
        self._samples += batch_samples(batch)

    def take_window(self) -> tuple[torch.Tensor | float, int, int]:
        """The step's summed loss, micro-batches and samples; the next step starts at zero."""
        window = self._window_loss, self._micro, self._samples
        self._window_loss, self._micro, self._samples = 0.0, 0, 0
        return window

    def summary(self) -> dict[str, Any]:
        """The run's summary (for ``TrackedRun.finish``)."""
        assert self.recorder is not None
        return self.recorder.summary()


def batch_samples(batch: Any) -> int:
    """Samples in a micro-batch (a tensor, or a tuple/list/dict holding tensors): the leading
    size of its first tensor (0 when it holds none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, list | tuple) and batch and isinstance(batch[0], torch.Tensor):
        # the common (inputs, targets): no Mapping check (an ABC isinstance) on every step
        return batch_samples(batch[0]) or batch_samples(batch[1:])
    # dict first: the HF Trainer's inputs (every micro-batch) skip the slower ABC check
    if isinstance(batch, dict | Mapping):  # dict, HF BatchEncoding
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        for item in batch:
            n = batch_samples(item)
            if n:
                return n
    return 0
