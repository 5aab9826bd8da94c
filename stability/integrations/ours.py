"""``ours``: our own loop as a backend, beside ``lightning`` and ``hf`` (``backends``).

A task without a ``trainer`` attribute is trained by ``core.loop.train`` (every setting of the
config is ours to honour: DDP, resume, faults, our optimizers and schedules), built by
``core.batches.task_of`` (``model``, ``train_val``, ``loss``, ``metrics``, ``sealed_test``),
evaluated by ``core.batches.evaluate_task`` under the run's autocast (the evaluation whose
validation loss selected the winner), and checked with the loop ``check.loop`` names (ours, or a
user's step function) on ``task.model`` / ``task.loss`` and ``train.batch_size``.

This module is a ``protocol.Backend`` (the names below); registered as ``ours``, first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from stability.core.batches import EvalSettings, evaluate_task, task_of
from stability.core.config import RunConfig
from stability.core.loop import RunResult
from stability.core.loop import train as _train
from stability.core.sinks import StepSink
from stability.core.task import Task, first_batch
from stability.integrations.protocol import EXAMPLE_ROWS, Probe

unused_params: tuple[str, ...] = ()  # our loop uses every setting


def preflight(cfg: RunConfig, world_size: int = 1) -> None:
    """Nothing to refuse before the run: ``core.loop.train`` checks what it cannot honour."""


def train(cfg: RunConfig, sinks: Sequence[StepSink] = (), world_size: int = 1) -> RunResult:
    """``core.loop.train``."""
    return _train(cfg, sinks, world_size=world_size)


def task(cfg: RunConfig) -> Task:
    """The run's task (``core.batches.task_of``)."""
    return task_of(cfg)


def model_builder(cfg: RunConfig, task: Task) -> Callable[[], nn.Module]:
    """``task.model``."""
    return task.model


def evaluate(cfg: RunConfig, task: Task, model: nn.Module, dataset: Any,
             device: str) -> dict[str, float]:
    """The task's loss and metrics under the run's precision (``evaluate_task``)."""
    return evaluate_task(task, model.to(device), dataset, EvalSettings.of(cfg, device))


def example(cfg: RunConfig, task: Task, model: nn.Module) -> tuple[nn.Module, Any]:
    """The model itself and its first ``EXAMPLE_ROWS`` validation inputs."""
    _, val = task.train_val()
    return model, first_batch(val, EXAMPLE_ROWS)[0].numpy()


def probe(cfg: RunConfig, task: Task) -> Probe:
    """The task's model and loss, its training samples in micro-batches of
    ``train.batch_size``; the loop under check is ``check.loop``."""
    model = task.model()
    train_set, _ = task.train_val()
    b = cfg.train.batch_size
    return Probe(model=model, build=task.model, samples=train_set, batch_size=b,
                 batch_key=f"train.batch_size={b}", loss_fn=task.loss)
