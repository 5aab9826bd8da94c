"""What the probes run on: the task's seeded model, its first micro-batches and the loop.

Our loop or a plain step function on a built-in or user task (``task.model`` / ``task.loss``,
``train.batch_size``); a Lightning task (``trainer = "lightning"``: ``task.module(lr)``, the
datamodule's training loader and its batch size) or an HF task (``trainer = "hf"``:
``task.model()``, ``task.train_val()``, ``per_device_train_batch_size`` from its
``training_arguments``), each stepped by its own trainer (``lightning_loop``, ``hf_loop``).
The micro-batches are the training data's first ``k * b`` samples in order (no shuffling).

Dropout is switched off in the probed model (``p = 0``): every probe compares forwards from the
same weights, and two forwards under dropout differ by their masks, not by the mechanics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from stability.check.rig import StepFn, Template, ours
from stability.core.batches import task_of
from stability.core.config import RunConfig
from stability.core.task import first_batch, trainer_of
from stability.core.validation import ConfigError, require


@dataclass(frozen=True)
class Subject:
    """The task, its loop and its data, ready for the probes.

    Attributes:
        template: the seeded initial weights and the task's loss.
        build: builds the model afresh (the caller seeds torch first).
        micro: ``k`` micro-batches.
        step: the loop under check.
        baseline: a correct unclipped step (the clip probe's reference norm).
        trainer: ``ours`` | ``plain`` | ``lightning`` | ``hf``.
        task: the task object (its ``expected_init_loss``).
        not_applicable: probe name -> why it cannot run for this trainer here.
    """

    template: Template
    build: Callable[[], nn.Module]
    micro: list[Any]
    step: StepFn
    baseline: StepFn
    trainer: str
    task: Any
    not_applicable: dict[str, str] = field(default_factory=dict)


def no_dropout(model: nn.Module) -> nn.Module:
    """``model`` with every dropout module's ``p`` set to 0 (see the module docstring)."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
    return model


def _samples(dataset: Any, k: int, b: int, collate: Callable = default_collate) -> list[Any]:
    n = len(dataset)
    require(n >= k * b, "check.accum_steps", k,
            f"at most {n // max(b, 1)} (the task's {n} training samples make "
            f"{n // max(b, 1)} micro-batches of {b})")
    return [collate([dataset[i] for i in range(j * b, (j + 1) * b)]) for j in range(k)]


def subject(cfg: RunConfig, loop: str, step: StepFn, k: int) -> Subject:
    """The probes' subject for ``cfg``'s task; ``loop`` is ``check.loop`` (``step`` its
    function).

    Raises:
        ConfigError: a loop named for a trainer task (its trainer is the loop), or too little
            data for ``k`` micro-batches.
    """
    trainer = trainer_of(cfg.task)
    if trainer is None:
        task = task_of(cfg)
    else:
        from stability.integrations.study import runner, trainer_task

        task = trainer_task(cfg, runner(cfg))
    if trainer is not None and loop != "ours":
        raise ConfigError(f"check.loop={loop!r} is invalid for a {trainer} task: its trainer is "
                          "the loop under check (allowed values: ours)")

    def seeded(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
        return lambda: no_dropout(make())

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        if trainer == "lightning":
            from stability.check import lightning_loop

            build = seeded(lambda: task.module(lr=cfg.train.lr))
            template = Template(build(), _unused, cfg.seed, lightning_loop.module_loss,
                                lightning_loop.trainer_gradient)
            data = task.datamodule()
            if hasattr(data, "setup"):
                data.setup("fit")
            loader = data.train_dataloader()
            micro = _samples(loader.dataset, k, int(loader.batch_size), loader.collate_fn)
            if not getattr(template.model, "automatic_optimization", True):
                # its accumulation is its own code: a failure is never Lightning's
                return Subject(template, build, micro, lightning_loop.step, lightning_loop.step,
                               "lightning-manual", task,
                               {"clip.unscaled": lightning_loop.MANUAL_CLIP})
            return Subject(template, build, micro, lightning_loop.step, lightning_loop.step,
                           trainer, task)
        if trainer == "hf":
            from stability.check import hf_loop

            hf_loop.quiet()
            collator = getattr(task, "data_collator", None)
            hf = hf_loop.HFLoop(getattr(task, "trainer_class", None),
                                collator() if callable(collator) else None)
            build = seeded(task.model)
            template = Template(build(), _unused, cfg.seed, hf.loss, join=hf.join)
            wanted = getattr(task, "training_arguments", dict)()
            b = int(wanted.get("per_device_train_batch_size", cfg.train.batch_size))
            micro = _samples(task.train_val()[0], k, b, hf.collator or default_collate)
            na = {"clip.unscaled": hf_loop.CPU_FP16, "skip.is_skip": hf_loop.CPU_FP16}
            return Subject(template, build, micro, hf.step, hf.step, trainer, task, na)
        build = seeded(task.model)
        template = Template(build(), task.loss, cfg.seed)
    train, _ = task.train_val()
    b = cfg.train.batch_size
    n = len(train)
    require(n >= k * b, "check.accum_steps", k,
            f"at most {n // max(b, 1)} (the task's {n} training samples make {n // max(b, 1)} "
            f"micro-batches of train.batch_size={b})")
    x, y = first_batch(train, k * b)
    micro = [(x[i : i + b], y[i : i + b]) for i in range(0, len(y), b)][:k]
    return Subject(template, build, micro, step, ours, "ours" if loop == "ours" else "plain",
                   task)


def _unused(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # a trainer task's loss is its own (Template.loss_of); nothing calls this
    raise TypeError("a trainer task's loss is its training_step / model output")
