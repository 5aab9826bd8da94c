"""What a backend is: the members the sweep, the report and ``stability check`` use.

``Backend`` is a whole backend (``integrations.ours``; ``study.Trainer`` around a trainer's
half); ``TrainerBackend`` is the half of a trainer we do not own (``lightning_runner``,
``hf_runner``, or yours), whose ``prepare`` returns a ``Fit``; ``Probe`` is a backend's check
adapter. The registry that maps a task's ``trainer`` name to one is ``integrations.backends``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from torch import nn

from stability.core.config import RunConfig
from stability.core.loop import RunResult
from stability.core.sinks import StepSink
from stability.core.task import OUR_LOOP, Task

EXAMPLE_ROWS = 5  # validation inputs in a logged model's input example (every ``example``)


@dataclass
class Fit:
    """A trainer ready to train one point: its model, its callback, and the call that trains."""

    model: nn.Module
    callback: Any  # lightning.StabilityCallback | hf.StabilityCallback (``.recorder``)
    run: Callable[[], Any]
    ended: Callable[[], None] = lambda: None  # the fit ended: remove its resume checkpoints


class NotApplicable(Exception):  # noqa: N818 - a verdict, not an error
    """A probe cannot apply to this code here (its message says why): the probe is n/a.

    Raised by a check adapter's functions (``Probe.loss_of``, ``grad_of``, ``step``);
    ``stability.check`` reports the probe as ``n/a`` with the message."""


@dataclass(frozen=True)
class Probe:
    """What ``stability check`` needs of a backend's task (its check adapter's answer).

    ``Backend.probe`` is called with torch seeded by the run's seed: it builds ``model`` first,
    then reads its data, so the probes start from the weights a fit of that seed starts from.

    Attributes:
        model: the task's model, built now under the seed (the probes deepcopy it).
        build: builds the model afresh (the caller seeds torch first).
        samples: the training data in order (a map-style dataset: ``samples[i]``).
        batch_size: the samples in one micro-batch.
        batch_key: where ``batch_size`` comes from, for an error (``train.batch_size=64``).
        collate: makes a micro-batch of samples; None: the samples are ``(input, target)``
            pairs, collated as one batch of ``k * b`` and cut into micro-batches (our loop's).
        loss_fn: ``loss(output, target)``, the mean over a micro-batch (our loop's tasks);
            None: the trainer's own loss (``loss_of``).
        loss_of: the trainer's own loss of ``(model, batch)`` (a Lightning ``training_step``,
            an HF model's ``.loss``).
        grad_of: ``(template, batch) -> gradients``: one batch's gradient as the trainer itself
            computes it (``check.rig.Template.grad_of``); None: a backward of the loss.
        join: the window's micro-batches as one batch (a dynamic-padding collator); None:
            ``check.rig.concat``.
        step: the trainer's step function (``check.rig.StepFn``); None: the loop under check
            is ``check.loop`` (ours, or a user's step function: our loop's tasks).
        label: the trainer in the results (``check.upstream`` knows its faults by it).
        known: ``(model, window) -> {fault name: gradient scale}``: the scale against the
            larger batch's each of the trainer's own known faults would give on the window
            (``hf_check.HFLoop.known``); a failure of exactly that scale is the trainer's.
        not_applicable: probe name -> why it cannot run for this backend here.
    """

    model: nn.Module
    build: Callable[[], nn.Module]
    samples: Any
    batch_size: int
    batch_key: str
    collate: Callable[[list[Any]], Any] | None = None
    loss_fn: Callable[[Any, Any], Any] | None = None
    loss_of: Callable[[nn.Module, Any], Any] | None = None
    grad_of: Callable[[Any, Any], list[Any]] | None = None
    join: Callable[[Sequence[Any]], Any] | None = None
    step: Callable[[Any, Sequence[Any]], bool] | None = None
    label: str = OUR_LOOP
    known: Callable[[nn.Module, Sequence[Any]], Mapping[str, float]] | None = None
    not_applicable: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """What the sweep, the report and the check use of a backend (a module with these names is
    one: ``integrations.ours``; ``study.Trainer`` is one around a ``TrainerBackend``).

    Attributes:
        unused_params: prefixes of the config keys it does not use (its runs' MLflow params
            leave them out: a trainer's own optimizer is logged once it has built it).
    """

    unused_params: Sequence[str]

    def preflight(self, cfg: RunConfig, world_size: int = 1) -> object:
        """Refuse what it cannot honour before a run folder or MLflow run exists (``ConfigError``
        naming the key; what it returns is its own)."""
        ...

    def train(self, cfg: RunConfig, sinks: Sequence[StepSink] = (),
              world_size: int = 1) -> RunResult:
        """Train one point: ``core.loop.train``'s signature and result."""
        ...

    def task(self, cfg: RunConfig) -> Task:
        """The run's task, built and checked to have what this backend takes."""
        ...

    def model_builder(self, cfg: RunConfig, task: Task) -> Callable[[], nn.Module]:
        """What makes a fresh model of the task (the report loads the winner's weights)."""
        ...

    def evaluate(self, cfg: RunConfig, task: Task, model: nn.Module, dataset: Any,
                 device: str) -> dict[str, float]:
        """``{"loss", "acc"}`` of ``model`` on ``dataset`` by the evaluation that gave the
        validation loss the winner was selected on."""
        ...

    def example(self, cfg: RunConfig, task: Task, model: nn.Module) -> tuple[nn.Module, Any]:
        """A module taking one tensor (for the MLflow Model) and a validation input example."""
        ...

    def probe(self, cfg: RunConfig, task: Task) -> Probe:
        """The check adapter's answer (``Probe``); ``ConfigError`` when there is none."""
        ...


@runtime_checkable
class TrainerBackend(Protocol):
    """The half of a trainer we do not own that ``study.Trainer`` makes a ``Backend`` of (a
    module with these names is one).

    Attributes:
        REQUIRED: the methods a task of this trainer defines (instead of our loop's five).

    Optional: ``probe(task, cfg) -> Probe``, its check adapter (``stability check`` refuses a
    task of a trainer without one, naming it).
    """

    REQUIRED: Sequence[str]

    def check(self, task: Task, cfg: RunConfig, device: str) -> Any:
        """Refuse a setting the trainer cannot honour (``ConfigError`` naming the key)."""
        ...

    def prepare(self, task: Task, cfg: RunConfig, device: str, folder: Path,
                sinks: Sequence[StepSink]) -> Fit:
        """A trainer ready to train the point, recording every step into ``sinks``."""
        ...

    def rebuild(self, task: Task, cfg: RunConfig) -> nn.Module:
        """A fresh model of the task (the report loads the winner's weights into it)."""
        ...

    def evaluate(self, task: Task, cfg: RunConfig, model: nn.Module, dataset: Any,
                 device: str) -> dict[str, float]:
        """``{"loss", "acc"}`` of ``model`` on ``dataset`` by the trainer's own evaluation."""
        ...

    def example(self, task: Task, model: nn.Module) -> tuple[nn.Module, Any]:
        """A module taking one tensor (for the MLflow Model) and an input example."""
        ...


# What makes a ``Backend`` whole, and what ``study.Trainer`` uses of a ``TrainerBackend``:
# checked when it is looked up.
WHOLE = ("unused_params", "preflight", "train", "task", "model_builder", "evaluate", "example",
         "probe")
MEMBERS = ("REQUIRED", "check", "prepare", "rebuild", "evaluate", "example")


