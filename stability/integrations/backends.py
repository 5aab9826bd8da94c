"""The backends that train a task: ``ours`` (our loop), ``lightning``, ``hf``, or one you register.

A task's ``trainer = "<name>"`` names its backend; a task without that attribute is ``ours``
(``core.task.trainer_name``). ``of(cfg)`` is the one lookup: the upper layers (``sweep.job``,
``report.evaluate``, ``check.subject``) use what it returns, a ``Backend``, and nothing else,
whichever backend it is:

- ``preflight`` / ``train``: the sweep's fit of one point (same ``RunConfig`` in, same run
  folder and ``RunResult`` out);
- ``task`` / ``model_builder`` / ``evaluate`` / ``example``: the report's rebuild of the winner
  and its evaluation on the sealed test split;
- ``probe``: what ``stability check`` runs its probes on (a ``Probe``), or a ``ConfigError``
  naming the backend when it has none;
- ``unused_params``: the config keys it does not use, left out of its runs' MLflow params.

``BACKENDS`` maps a name to a backend or to the import path of a module that is one. A backend
is either a whole ``Backend`` (``integrations.ours``: our loop) or the *trainer half* of a
trainer we do not own (``TrainerBackend``: ``lightning_runner``, ``hf_runner``), which
``study.Trainer`` makes whole: its settings mapped and refused, its steps recorded into the
run's sinks, our run folder around it. The built-ins are paths, imported only when a task names
them, so ``import stability`` imports neither Lightning nor transformers (tests/test_imports.py).

A backend of your own is one ``register("name", backend)`` in the module that defines its tasks:
reading a task's ``trainer`` attribute imports that module first (``TaskConfig.declared``), in
every process that trains, rebuilds or checks it. ``stability.track`` records a loop the user
runs (``trainer=plain`` on its runs) and trains nothing a sweep could hand it: it is no backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from torch import nn

from stability.core.config import ConfigError, RunConfig
from stability.core.loop import RunResult
from stability.core.sinks import StepSink
from stability.core.task import OUR_LOOP, Task, trainer_name
from stability.integrations.study import Fit, Trainer


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


@dataclass(frozen=True)
class Entry:
    """A registered backend: the backend or its module's import path, and the pip extra that
    installs what it imports (None: none of ours)."""

    backend: Backend | TrainerBackend | str
    extra: str | None = None


BACKENDS: dict[str, Entry] = {
    OUR_LOOP: Entry("stability.integrations.ours"),
    "lightning": Entry("stability.integrations.lightning_runner", extra="lightning"),
    "hf": Entry("stability.integrations.hf_runner", extra="hf"),
}


def register(name: str, backend: Backend | TrainerBackend | str, *, extra: str | None = None,
             replace: bool = False) -> None:
    """Make ``backend`` (a ``Backend``, a ``TrainerBackend``, or a module's import path) the
    backend of every task that declares ``trainer = name``.

    Raises:
        ValueError: ``name`` is empty, or is taken (unless ``replace``).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"trainer name {name!r}: allowed names are non-empty strings")
    if name in BACKENDS and not replace:
        raise ValueError(f"trainer name {name!r} is taken by {BACKENDS[name].backend!r}")
    BACKENDS[name] = Entry(backend, extra)


def names() -> tuple[str, ...]:
    """The registered names, in registration order (``ours`` first)."""
    return tuple(BACKENDS)


def of(cfg: RunConfig) -> Backend:
    """The backend of the run's task (``ours`` when it declares none), imported now.

    Raises:
        ConfigError: no backend has that name, it is not installed, or it lacks what a backend
            defines; one line naming the task and the allowed values.
    """
    return backend(trainer_name(cfg.task), cfg.task.target)


def backend(name: str, target: str) -> Backend:
    """The backend named ``name``, declared by the task ``target``.

    Raises:
        ConfigError: as ``of``.
    """
    entry = BACKENDS.get(name)
    if entry is None:
        raise ConfigError(f"task._target_={target!r} declares trainer={name!r}: allowed values "
                          f"are {' | '.join(names())} (or no trainer attribute: our loop)")
    found: object = entry.backend
    if isinstance(found, str):
        try:
            found = importlib.import_module(found)
        except ImportError as err:
            hint = (f"pip install \"stability[{entry.extra}]\"" if entry.extra
                    else f"install what {entry.backend} imports")
            raise ConfigError(f"task._target_={target!r} declares trainer={name!r}, which is "
                              f"not installed ({err}): {hint}") from None
    if all(hasattr(found, m) for m in WHOLE):
        return found  # type: ignore[return-value]
    missing = [m for m in MEMBERS if not hasattr(found, m)]
    if missing:
        raise ConfigError(f"task._target_={target!r} declares trainer={name!r}, whose backend "
                          f"lacks {', '.join(missing)} (allowed values: a backend defining "
                          f"{', '.join(MEMBERS)}, or one defining {', '.join(WHOLE)}; "
                          "docs/integrations.md)")
    return Trainer(name, found)  # type: ignore[arg-type]
