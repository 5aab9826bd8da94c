"""The task interface: what a model and its data must provide to be studied.

It lives beside what consumes it (the run loop, the batches, the report's evaluation); the
concrete tasks live in ``stability/tasks``. A task is any object returned by the class (or
factory) ``task._target_`` names, called with the section's other keys as plain keyword
arguments (no nested ``_target_`` is built, no ``${...}`` resolved). It owns only what is
specific to a model and its data; the run loop owns seeding, shuffling, windows of
micro-batches, precision, clipping and telemetry. No subclassing: a user's task is one small
class with these methods.

Optional class attributes, read from the class without building it (``TaskConfig.declared``):
``loss_name`` (what the loss is, e.g. ``"MSE"``: every figure's loss axis says it; default
``"loss"``), ``section_types`` (dataclasses validating the sections it takes, so their mistakes
join the run config's one error), ``hash_target`` (``False`` only for a task whose runs were
fingerprinted before ``task._target_`` was: the default task) and ``trainer`` (a
backend's name: the task is trained by that backend, and provides what it takes; without it the
backend is ``ours``, our loop, and the task provides the five methods below; the names are
registered in the integrations layer, ``stability/integrations/backends.py``,
docs/integrations.md).

The test split is sealed: ``sealed_test`` is called from ``stability/report/sealed/evaluate.py``
alone, for the winner selected on validation (``tests/core/test_data.py`` scans the code for other
callers).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from stability.core.config import ConfigError, TaskConfig
from stability.core.validation import locate

# The guarded door's name; tests/core/test_data.py scans the code base for callers of it.
SEALED_TEST = "sealed_test"
REQUIRED = ("model", "train_val", "loss", "metrics", SEALED_TEST)
DEFAULT_LOSS_NAME = "loss"  # a task that does not name its loss


def loss_name(cfg: TaskConfig) -> str:
    """The loss the task names (``loss_name``), or the neutral ``"loss"``."""
    name = cfg.declared("loss_name", DEFAULT_LOSS_NAME)
    return name if isinstance(name, str) and name else DEFAULT_LOSS_NAME


def hashes_target(cfg: TaskConfig) -> bool:
    """Whether ``task._target_`` enters the fingerprint (every task but a legacy one)."""
    return bool(cfg.declared("hash_target", True))


OUR_LOOP = "ours"  # the backend of a task with no ``trainer`` attribute: ``core.loop``


def trainer_name(cfg: TaskConfig) -> str:
    """The backend the task declares (``trainer = "<name>"``), ``"ours"`` without one.

    Which names exist is the integrations layer's to say (its registry of backends refuses
    an unknown one before a run exists); here a name is any non-empty string.

    Raises:
        ConfigError: the attribute is not a name.
    """
    name = cfg.declared("trainer")
    if name is None:
        return OUR_LOOP
    if isinstance(name, str) and name:
        return name
    raise ConfigError(f"task._target_={cfg.target!r} declares trainer={name!r}: allowed values "
                      "are a backend's registered name (a string; "
                      "stability/integrations/backends.py) or no trainer attribute: our loop")


@runtime_checkable
class Task(Protocol):
    """A model and its data. ``docs/tasks.md`` shows a complete user task."""

    def model(self) -> nn.Module:
        """A fresh module; the caller has already seeded torch with the training seed."""
        ...

    def train_val(self) -> tuple[Dataset, Dataset]:
        """Training and validation datasets of ``(input, target)`` pairs."""
        ...

    def sealed_test(self, *, winner: str) -> Dataset:
        """The test dataset, opened only by the report for ``winner`` (a fingerprint)."""
        ...

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Scalar loss, the mean over the micro-batch."""
        ...

    def metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-batch SUMS over samples (e.g. ``{"loss": ..., "acc": correct}``).

        The loop divides by the number of samples. ``loss`` is optional (the loop uses
        ``loss(output, target) * batch`` without it); ``acc`` becomes ``val_acc``. A task may
        also define ``derived(means) -> dict`` for metrics of the means (perplexity).
        """
        ...


def require_winner(winner: str) -> None:
    """The check every ``sealed_test`` starts with: no selection, no test data."""
    if not winner:
        raise PermissionError("the test split opens only for a winner selected on validation")


def build_task(cfg: TaskConfig, sections: Mapping[str, Any],
               required: Sequence[str] = REQUIRED) -> Task:
    """Build the task of a run; every failure is a ``ConfigError`` naming ``task.*``.

    Args:
        cfg: the run's task section.
        sections: the run's top-level sections the task receives (``data``, ``model``), as
            plain mappings.
        required: the methods it must have (a trainer's task has the trainer's own).

    Returns:
        The task object, checked to have every method of ``Task``.

    Raises:
        ConfigError: the target does not import, its arguments are wrong, or a method is missing.
    """
    # The class is called with plain values, never through Hydra's recursive ``instantiate``:
    # that resolves ``${...}`` (``oc.create`` makes a ``_target_``) and builds any nested
    # ``_target_``, and a recorded config is data (report/evidence/trust.py). A copy, so the task
    # cannot change the run's frozen config.
    kwargs = copy.deepcopy(cfg.spec(sections))
    factory = locate(kwargs.pop("_target_"))
    try:
        task = factory(**kwargs)
    except Exception as err:  # the task's own error, whatever it is, names the task
        raise ConfigError(f"task._target_={cfg.target!r} cannot be built: "
                          f"{_one_line(err)}") from None
    missing = [m for m in required if not callable(getattr(task, m, None))]
    if SEALED_TEST in missing:
        raise ConfigError(f"task._target_={cfg.target!r} has no test split: it must define "
                          f"{SEALED_TEST}(*, winner) (allowed: a task with train, val and test)")
    if missing:
        raise ConfigError(f"task._target_={cfg.target!r} lacks {', '.join(missing)}: a task "
                          f"defines {', '.join(required)} (docs/tasks.md)")
    return task


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def first_batch(dataset: Dataset, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The dataset's first ``batch_size`` items, collated (no shuffling, no RNG)."""
    n = min(batch_size, len(dataset))  # type: ignore[arg-type]
    if isinstance(dataset, TensorDataset):
        x, y = dataset.tensors[0][:n], dataset.tensors[1][:n]
        return x, y
    from torch.utils.data import default_collate

    x, y = default_collate([dataset[i] for i in range(n)])
    return x, y


def check_task(task: Task, model: nn.Module, train: Dataset, batch_size: int, device: str,
               target: str) -> None:
    """Try one micro-batch before training: finite inputs, an output the loss accepts.

    Runs under ``torch.random.fork_rng`` and ``no_grad``, so the training RNG stream and the
    parameters are exactly as if the check had not run (the default task's ``steps.csv``
    stays byte-identical).

    Raises:
        ConfigError: naming ``task._target_`` and what was wrong.
    """
    if len(train) == 0:  # type: ignore[arg-type]
        raise ConfigError(f"task._target_={target!r} has an empty training set "
                          "(allowed: at least one sample)")
    x, y = first_batch(train, batch_size)
    for name, t in (("inputs", x), ("targets", y)):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ConfigError(f"task._target_={target!r}: the first training batch's {name} "
                              "hold inf/nan values (allowed: finite data)")
    was_training = model.training
    out: Any = None
    # Warnings become errors here: MSE on (B, 1) against (B,) only warns, then broadcasts to
    # (B, B) and trains on a wrong loss without a word.
    with torch.random.fork_rng(devices=[]), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        model.eval()
        try:
            out = model(x.to(device))
            loss = task.loss(out, y.to(device))
        except Exception as err:
            raise ConfigError(
                f"task._target_={target!r}: the model output of shape "
                f"{_shape(out)} is rejected by task.loss for targets of shape "
                f"{tuple(y.shape)}: {_one_line(err)}") from None
        finally:
            model.train(was_training)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ConfigError(f"task._target_={target!r}: task.loss must return a scalar (the mean "
                          f"over the micro-batch), got shape {_shape(loss)}")
    if not math.isfinite(float(loss)):
        raise ConfigError(f"task._target_={target!r}: the loss of the first batch is not "
                          "finite before any training (allowed: a finite loss)")


def _shape(t: Any) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__
