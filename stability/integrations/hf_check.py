"""The HF backend's check adapter (``probe``): each step is a ``transformers.Trainer.train``.

``stability check`` (``check.subject``) reaches it through ``hf_runner.probe``, as it reaches
every backend's. The probes hand this step function a ``Rig`` (``check.rig``) whose model is the
task's ``PreTrainedModel``; the step trains it over the window's samples in order
(``train_sampling_strategy="sequential"``, ``per_device_train_batch_size`` = the micro-batch)
with the study's own mapping of the settings (``integrations.hf.training_arguments``):
``gradient_accumulation_steps`` = the rig's configured window, ``max_grad_norm`` = its
``max_norm``. So the loss normalisation under accumulation (``num_items_in_batch``), the clip
and the schedule step are the Trainer's own. A window shorter than the configured accumulation
is the epoch's short last window: the Trainer steps on it.

A task may declare its own Trainer subclass (``trainer_class``, e.g. its ``compute_loss``) and
its ``data_collator()`` (dynamic padding): the steps train with them, the accumulation probe's
reference is that ``compute_loss`` over the window's samples collated together (``HFLoop``).
Each micro-batch keeps the raw samples it was collated from (``Collated``): the Trainer gets
those and collates them once, with the task's collator, as a plain run does. ``HFLoop.known``
gives the gradient scale each of the Trainer's own known faults would produce on a window
(``check.upstream``: ``hf.num_items_shift``, ``hf.loss_kwargs_ignored``).

The one stand-in: ``optimizers=(rig.optimizer, rig.scheduler)``, because the probes need plain
SGD to see a gradient's scale in the parameters; the mechanics under test are the Trainer's.
fp16 on CPU is refused (accelerate would train fp32 without a scaler), so the clip-on-unscaled
and skip probes are n/a for this trainer on CPU.
"""

from __future__ import annotations

import inspect
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from stability.core.config import ClipConfig, PrecisionConfig, RunConfig
from stability.core.task import Task
from stability.integrations.protocol import Probe

CPU_FP16 = ("accelerate refuses fp16 on CPU (the study's mapping says so: it would train fp32 "
            "without a GradScaler), so there is no scaler to probe; run the check on a GPU")


def size(batch: Any) -> int:
    """The number of samples in a batch (its first tensor's length; a ``BatchEncoding`` is a
    mapping, not a dict)."""
    if isinstance(batch, Collated):
        return len(batch.samples)
    if isinstance(batch, Mapping):
        return len(next(iter(batch.values())))
    return len(batch[0]) if isinstance(batch, list | tuple) else len(batch)


class Collated(dict):
    """A micro-batch as the task's collator made it, and the raw samples it made it of.

    The probes' forwards read the tensors; the Trainer gets the raw samples and collates them
    itself, once, with the same collator, as in a plain run (collating a collated batch again
    crashes a stock collator and turns a hand-written one's padding into targets).
    """

    samples: list[Any]

    def __init__(self, batch: Mapping[str, Any], samples: Sequence[Any]) -> None:
        super().__init__(batch)
        self.samples = list(samples)


def collated(collator: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Collated]:
    """``collator`` keeping the raw samples beside its batch (``Collated``)."""
    def collate(samples: list[Any]) -> Collated:
        return Collated(collator(list(samples)), samples)
    return collate


class _Samples(Dataset):
    """The window's samples in order: the raw ones a ``Collated`` micro-batch was made of
    (else each collated micro-batch cut into one dict per sample)."""

    def __init__(self, window: Sequence[Any]) -> None:
        self.items = [s for mb in window for s in (
            mb.samples if isinstance(mb, Collated) else
            [{k: v[i] for k, v in mb.items()} for i in range(size(mb))])]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def quiet() -> None:
    """Only transformers' errors: the probes train a dozen one-step runs."""
    import transformers

    transformers.logging.set_verbosity_error()


def items(window: Sequence[Any]) -> list[Any]:
    """The window's samples in order (raw, where the micro-batches kept them)."""
    return _Samples(window).items


@dataclass
class HFLoop:
    """The task's Trainer: its class (a subclass with its own ``compute_loss``) and its
    ``data_collator`` (dynamic padding), as the task declares them (``trainer_class``,
    ``data_collator()``); the stock ``Trainer`` and its default collator otherwise.

    Attributes:
        trainer_class: a ``transformers.Trainer`` (sub)class, or None for ``Trainer``.
        collator: the task's data collator, or None.
    """

    trainer_class: type | None = None
    collator: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]] | None = None
    _bound: dict[str, Any] = field(default_factory=dict)  # one Trainer for compute_loss

    def cls(self) -> type:
        """The Trainer class the task trains with."""
        from transformers import Trainer

        return self.trainer_class or Trainer

    def join(self, window: Sequence[Any]) -> Collated:
        """The window's raw samples as one batch, collated as the task collates (padded to the
        window's longest sample by a dynamic-padding collator)."""
        return collated(self.collator or default_collate)(items(window))

    def trainer(self, model: nn.Module) -> Any:
        """One Trainer of the task's class around ``model`` (its ``compute_loss``, and what it
        decides about the model: ``model_accepts_loss_kwargs``, ``_loss_shifts_labels``)."""
        if "trainer" not in self._bound:
            from transformers import TrainingArguments

            args = TrainingArguments(output_dir=tempfile.mkdtemp(), report_to="none",
                                     use_cpu=True)
            self._bound["trainer"] = self.cls()(model=model, args=args)
        return self._bound["trainer"]

    def known(self, model: nn.Module, window: Sequence[Any]) -> dict[str, float]:
        """The gradient scale (against the larger batch's) each of the Trainer's own known
        faults would give on ``window`` (``check.upstream``: ``hf.*``); empty when none can.

        ``hf.num_items_shift``: the model's loss is the causal-LM loss (it shifts the labels)
        but the Trainer counts ``num_items_in_batch`` over the unshifted labels (its
        ``_loss_shifts_labels`` reads the model's ``loss_type``, None for GPT-2's LM head):
        the shifted count over the unshifted. ``hf.loss_kwargs_ignored``: a transformers head
        whose ``forward`` takes ``**kwargs`` (so the Trainer passes ``num_items_in_batch`` and
        stops dividing by the accumulation) but whose loss ignores it: the window's
        micro-batch count (each micro-batch's mean, summed).
        """
        from transformers.loss.loss_utils import LOSS_MAPPING

        trainer = self.trainer(model)
        if not trainer.model_accepts_loss_kwargs:
            return {}
        out: dict[str, float] = {}
        labels = [mb["labels"] for mb in window if isinstance(mb, Mapping) and "labels" in mb]
        causal = getattr(model, "loss_function", None) is LOSS_MAPPING["ForCausalLM"]
        if causal and not trainer._loss_shifts_labels and len(labels) == len(window):
            shifted = sum(int(y[..., 1:].ne(-100).sum()) for y in labels)
            counted = sum(int(y.ne(-100).sum()) for y in labels)
            if counted and shifted != counted:
                out["hf.num_items_shift"] = shifted / counted
        own_loss = type(trainer).compute_loss is _stock_compute_loss()
        if not causal and own_loss and trainer.compute_loss_func is None and _ours(model):
            out["hf.loss_kwargs_ignored"] = float(len(window))
        return out

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The task's loss on ``batch``: its Trainer's ``compute_loss`` without
        ``num_items_in_batch`` (the mean over the batch's own items; the stock Trainer:
        ``model(**batch).loss``)."""
        if self.trainer_class is None:
            return model(**batch).loss
        return self.trainer(model).compute_loss(model, dict(batch))

    def step(self, rig: Any, window: Sequence[Any]) -> bool:
        """One optimizer step of the rig's model by ``Trainer.train`` over ``window``.

        Returns:
            Whether the optimizer stepped.
        """
        from transformers import PrinterCallback, TrainingArguments

        from stability.integrations.hf import training_arguments

        quiet()
        clip = (ClipConfig(enabled=True, max_norm=rig.max_norm) if rig.max_norm is not None
                else ClipConfig())
        mapped = training_arguments(clip, PrecisionConfig(name=rig.precision), rig.accum_steps,
                                    "cpu")
        sched = rig.scheduler or rig.extra.setdefault(
            "constant", torch.optim.lr_scheduler.LambdaLR(rig.optimizer, lambda _: 1.0))
        taken: list[int] = []
        handle = rig.optimizer.register_step_post_hook(lambda *_: taken.append(1))
        extra = {"data_collator": self.collator} if self.collator is not None else {}
        try:
            with tempfile.TemporaryDirectory() as out:
                args = TrainingArguments(
                    output_dir=out, per_device_train_batch_size=size(window[0]),
                    num_train_epochs=1, train_sampling_strategy="sequential", report_to="none",
                    disable_tqdm=True, save_strategy="no", logging_strategy="no",
                    dataloader_num_workers=0, **mapped)
                trainer = self.cls()(model=rig.model, args=args,
                                     train_dataset=_Samples(window),
                                     optimizers=(rig.optimizer, sched), **extra)
                trainer.remove_callback(PrinterCallback)  # its per-train log lines
                trainer.train()
        finally:
            handle.remove()
        return bool(taken)


STOCK = HFLoop()


def _stock_compute_loss() -> Any:
    from transformers import Trainer

    return Trainer.compute_loss


def _ours(model: nn.Module) -> bool:
    # the model's class is transformers' own (its module's file resolved, not its name)
    import transformers

    home = Path(inspect.getfile(transformers)).resolve().parent
    try:
        return Path(inspect.getfile(type(model))).resolve().is_relative_to(home)
    except TypeError:
        return False


def model_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """The model's own loss on ``batch`` (labels inside it), as the Trainer computes it."""
    return STOCK.loss(model, batch)


def step(rig: Any, window: Sequence[Any]) -> bool:
    """One optimizer step by the stock ``Trainer.train`` over ``window`` (``HFLoop.step``)."""
    return STOCK.step(rig, window)


def probe(task: Task, cfg: RunConfig) -> Probe:
    """The task's ``model()`` built now, its training split's first samples in micro-batches of
    its ``per_device_train_batch_size`` (collated by its ``data_collator()``), stepped by
    ``HFLoop.step`` with its ``trainer_class``."""
    quiet()
    collator = getattr(task, "data_collator", None)
    hf = HFLoop(getattr(task, "trainer_class", None), collator() if callable(collator) else None)
    model = task.model()
    wanted = getattr(task, "training_arguments", dict)()
    b = int(wanted.get("per_device_train_batch_size", cfg.train.batch_size))
    return Probe(model=model, build=task.model, samples=task.train_val()[0], batch_size=b,
                 batch_key=f"per_device_train_batch_size={b}",
                 collate=collated(hf.collator or default_collate),
                 loss_of=hf.loss, join=hf.join, step=hf.step, label="hf", known=hf.known,
                 not_applicable={"clip.unscaled": CPU_FP16, "skip.is_skip": CPU_FP16})
