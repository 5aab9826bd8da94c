"""An HF Trainer task under the probes: each step is a ``transformers.Trainer.train``.

The probes hand this step function a ``Rig`` whose model is the task's ``PreTrainedModel``; the
step trains it over the window's samples in order (``train_sampling_strategy="sequential"``,
``per_device_train_batch_size`` = the micro-batch) with the study's own mapping of the settings
(``integrations.hf.training_arguments``): ``gradient_accumulation_steps`` = the rig's configured
window, ``max_grad_norm`` = its ``max_norm``. So the loss normalisation under accumulation
(``num_items_in_batch``), the clip and the schedule step are the Trainer's own. A window shorter
than the configured accumulation is the epoch's short last window: the Trainer steps on it.

The one stand-in: ``optimizers=(rig.optimizer, rig.scheduler)``, because the probes need plain
SGD to see a gradient's scale in the parameters; the mechanics under test are the Trainer's.
fp16 on CPU is refused (accelerate would train fp32 without a scaler), so the clip-on-unscaled
and skip probes are n/a for this trainer on CPU.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from stability.check.rig import Rig, size
from stability.core.config import ClipConfig, PrecisionConfig

CPU_FP16 = ("accelerate refuses fp16 on CPU (the study's mapping says so: it would train fp32 "
            "without a GradScaler), so there is no scaler to probe; run the check on a GPU")


class _Samples(Dataset):
    """The window's samples, one dict each, in order."""

    def __init__(self, window: Sequence[dict[str, torch.Tensor]]) -> None:
        self.items = [{k: v[i] for k, v in mb.items()} for mb in window for i in range(size(mb))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def quiet() -> None:
    """Only transformers' errors: the probes train a dozen one-step runs."""
    import transformers

    transformers.logging.set_verbosity_error()


def model_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """The model's own loss on ``batch`` (labels inside it), as the Trainer computes it."""
    return model(**batch).loss


def step(rig: Rig, window: Sequence[Any]) -> bool:
    """One optimizer step of the rig's model by ``Trainer.train`` over ``window``.

    Returns:
        Whether the optimizer stepped.
    """
    from transformers import PrinterCallback, Trainer, TrainingArguments

    from stability.integrations.hf import training_arguments

    quiet()
    clip = (ClipConfig(enabled=True, max_norm=rig.max_norm) if rig.max_norm is not None
            else ClipConfig())
    mapped = training_arguments(clip, PrecisionConfig(name=rig.precision), rig.accum_steps, "cpu")
    sched = rig.scheduler or rig.extra.setdefault(
        "constant", torch.optim.lr_scheduler.LambdaLR(rig.optimizer, lambda _: 1.0))
    taken: list[int] = []
    handle = rig.optimizer.register_step_post_hook(lambda *_: taken.append(1))
    try:
        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(
                output_dir=out, per_device_train_batch_size=size(window[0]), num_train_epochs=1,
                train_sampling_strategy="sequential", report_to="none", disable_tqdm=True,
                save_strategy="no", logging_strategy="no", dataloader_num_workers=0, **mapped)
            trainer = Trainer(model=rig.model, args=args, train_dataset=_Samples(window),
                              optimizers=(rig.optimizer, sched))
            trainer.remove_callback(PrinterCallback)  # its per-train log lines
            trainer.train()
    finally:
        handle.remove()
    return bool(taken)
