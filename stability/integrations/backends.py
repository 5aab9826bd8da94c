"""The backends that train a task: ``ours`` (our loop), ``lightning``, ``hf``, or one you register.

A task's ``trainer = "<name>"`` names its backend; a task without that attribute is ``ours``
(``core.task.trainer_name``). ``of(cfg)`` is the one lookup: the upper layers (``sweep.job``,
``report.sealed.evaluate``, ``check.subject``) use what it returns, a ``Backend``, and nothing else,
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
from dataclasses import dataclass

from stability.core.config import ConfigError, RunConfig
from stability.core.task import OUR_LOOP, trainer_name
from stability.integrations.protocol import MEMBERS, WHOLE, Backend, TrainerBackend
from stability.integrations.study import Trainer


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
