"""The trainer backends a task can declare: ``trainer = "<name>"`` is looked up here.

A backend is what ``study`` needs of a trainer we do not own to train a study point and to
rebuild and evaluate its winner for the report (``TrainerBackend``). ``BACKENDS`` maps a name
to a backend or to the import path of a module that is one. The built-ins are paths, imported
only when a task names them, so ``import stability`` imports neither Lightning nor
transformers (tests/test_imports.py).

A trainer of your own is one ``register("name", backend)`` in the module that defines its
tasks: reading a task's ``trainer`` attribute imports that module first (``TaskConfig.declared``),
in every process that trains or rebuilds it. ``core`` names no trainer: it passes the declared
name on (``core.task.trainer_of``), and ``backend`` refuses a name nobody registered.

Our own loop is no backend: a task without a ``trainer`` attribute is trained by ``core.loop``.
``stability.track`` records a loop the user runs (``trainer=plain`` on its runs) and trains
nothing a sweep could hand it, so it is no backend either.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from torch import nn

from stability.core.config import ConfigError, RunConfig
from stability.core.sinks import StepSink
from stability.core.task import Task

if TYPE_CHECKING:
    from stability.integrations.study import Fit


@runtime_checkable
class TrainerBackend(Protocol):
    """What ``study`` uses of a trainer (a module with these names is one).

    Attributes:
        REQUIRED: the methods a task of this trainer defines (instead of our loop's five).
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


# What ``study`` uses of a backend: checked when it is looked up.
MEMBERS = ("REQUIRED", "check", "prepare", "rebuild", "evaluate", "example")


@dataclass(frozen=True)
class Entry:
    """A registered backend: the backend or its module's import path, and the pip extra that
    installs what it imports (None: none of ours)."""

    backend: TrainerBackend | str
    extra: str | None = None


BACKENDS: dict[str, Entry] = {
    "lightning": Entry("stability.integrations.lightning_runner", extra="lightning"),
    "hf": Entry("stability.integrations.hf_runner", extra="hf"),
}


def register(name: str, backend: TrainerBackend | str, *, extra: str | None = None,
             replace: bool = False) -> None:
    """Make ``backend`` (an object with ``MEMBERS``, or a module's import path) the trainer of
    every task that declares ``trainer = name``.

    Raises:
        ValueError: ``name`` is empty, or is taken (unless ``replace``).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"trainer name {name!r}: allowed names are non-empty strings")
    if name in BACKENDS and not replace:
        raise ValueError(f"trainer name {name!r} is taken by {BACKENDS[name].backend!r}")
    BACKENDS[name] = Entry(backend, extra)


def names() -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(BACKENDS)


def backend(name: str, target: str) -> TrainerBackend:
    """The backend of ``trainer = name``, declared by the task ``target`` (imported now).

    Raises:
        ConfigError: no backend has that name, it is not installed, or it lacks ``MEMBERS``;
            one line naming the task and the allowed values.
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
    missing = [m for m in MEMBERS if not hasattr(found, m)]
    if missing:
        raise ConfigError(f"task._target_={target!r} declares trainer={name!r}, whose backend "
                          f"lacks {', '.join(missing)} (allowed values: a backend defining "
                          f"{', '.join(MEMBERS)}; docs/integrations.md)")
    return found  # type: ignore[return-value]
