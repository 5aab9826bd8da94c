"""Per-step records and the CSV writer that is the ground truth of every run.

``StepLog`` is the one schema of a step's record: its fields are the columns of ``steps.csv``
(in order) and, where a field says ``metric=True``, the per-step MLflow metrics of the same
name. ``CSV_COLUMNS``, ``COLUMN``, ``TEXT_COLUMNS`` and ``STEP_METRICS`` are derived from it,
so a new per-step quantity is a field here (and what ``core.measure`` measures).

Each row is flushed to the operating system as it is written, so a crash, SIGKILL or
interrupt of the process loses nothing that was already logged. (``fsync`` per row would
also survive a power cut, but costs ~1 ms a step, more than the step itself here.)
"""

from __future__ import annotations

import csv
import functools
import math
import operator
import os
from collections import namedtuple
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO, TypeVar, get_type_hints

# Field metadata keys of a ``StepLog`` field (``column`` sets them).
METRIC = "mlflow_metric"  # also an MLflow per-step metric of the field's name (MLflow step = step)
FIXED = "fixed"  # one of the leading columns fixed by contract (the writer's epoch follows them)
EPOCH = "epoch"  # the writer's own column: the epoch a step ran in (the step's record lacks it)


def column(*, metric: bool = False, fixed: bool = False, default: Any = MISSING) -> Any:
    """A ``StepLog`` field: a ``steps.csv`` column of the field's name.

    Args:
        metric: also log it as the per-step MLflow metric of the same name (as a float; a
            bool as 0/1).
        fixed: one of the leading columns fixed by contract; ``epoch`` follows the last one.
        default: the value when not given (a field with a default must follow those without).
    """
    return field(default=default, metadata={METRIC: metric, FIXED: fixed})


class SkipReason(StrEnum):
    """Why an optimizer step was not taken (``steps.csv`` column ``skip_reason``)."""

    NONE = ""  # the step was taken
    NONFINITE_LOSS = "nonfinite_loss"  # inf/nan loss: the window's gradients are discarded
    NONFINITE_GRAD = "nonfinite_grad"  # inf/nan unscaled gradient: skipped before the step


@dataclass(frozen=True)
class StepLog:
    """What one optimizer step did. ``step`` is the 1-based optimizer-step index.

    Every field is a ``steps.csv`` column (bools written as 0/1, text as is); ``metric=True``
    fields are also MLflow metrics. docs/TRACKING.md says what each one means.
    """

    step: int = column(fixed=True)
    lr: float = column(fixed=True, metric=True)
    grad_l2_pre_clip: float = column(fixed=True, metric=True)
    grad_l2_post_clip: float = column(fixed=True, metric=True)
    loss: float = column(fixed=True, metric=True)
    skipped: bool = column(fixed=True, metric=True)
    skip_reason: str = column(fixed=True)
    scaler_scale: float = column(fixed=True, metric=True)
    clipped: bool = column(metric=True)
    micro_batches: int = column()
    samples: int = column()
    skips_cumulative: int = column(metric=True)  # skipped steps so far, this one included
    underflow_frac: float = column(default=math.nan)
    nonfinite_param: str = column(default="")


def csv_columns(record: type[StepLog] = StepLog) -> tuple[str, ...]:
    """``steps.csv``'s header for ``record`` (``StepLog`` or a subclass with more fields).

    The fields in order, with the writer's ``epoch`` after the fixed ones: the order the
    files have always had, so that ``steps.csv`` keeps its bytes.
    """
    names = [f.name for f in fields(record)]
    n_fixed = sum(bool(f.metadata.get(FIXED)) for f in fields(record))
    assert all(f.metadata.get(FIXED) for f in fields(record)[:n_fixed]), "fixed fields lead"
    return (*names[:n_fixed], EPOCH, *names[n_fixed:])


def flag_fields(record: type[StepLog] = StepLog) -> tuple[str, ...]:
    """The bool fields of ``record``: written as 0/1 (CSV) and 0.0/1.0 (MLflow)."""
    hints = get_type_hints(record)
    return tuple(f.name for f in fields(record) if hints[f.name] is bool)


CSV_COLUMNS = csv_columns()
# ``COLUMN.grad_l2_pre_clip`` == "grad_l2_pre_clip": readers of steps.csv (the report) take
# column names from here, so a renamed field fails where it is read, not as a missing column.
COLUMN = namedtuple("Column", CSV_COLUMNS)(*CSV_COLUMNS)
TEXT_COLUMNS = tuple(f.name for f in fields(StepLog) if get_type_hints(StepLog)[f.name] is str)
STEP_METRICS = tuple(f.name for f in fields(StepLog) if f.metadata.get(METRIC))
_FLAGS = flag_fields()


R = TypeVar("R", bound=StepLog)


@functools.cache
def _extra_fields(base: type[StepLog], record: type[StepLog]) -> frozenset[str]:
    """The fields ``record`` adds to ``base``, once ``extend`` is checked to be sound for them."""
    if not issubclass(record, base) or hasattr(record, "__post_init__") or (
            hasattr(record, "__slots__")):
        raise TypeError(f"cannot extend a {base.__name__} as {record.__name__}")
    return frozenset(f.name for f in fields(record)) - {f.name for f in fields(base)}


def extend(log: StepLog, record: type[R], **more: Any) -> R:
    """``log`` as the subclass ``record`` with its extra fields ``more``.

    The same value as ``record(**vars(log), **more)``, without running the frozen dataclass's
    ``__init__`` again (one ``object.__setattr__`` per field, several times the cost, per step
    of a trainer run). Sound because ``StepLog`` and its subclasses have no ``__slots__`` and no
    ``__post_init__`` (checked once per pair of classes): their fields are their ``__dict__``.

    Raises:
        TypeError: ``record`` is not a subclass of ``log``'s class, or ``more`` does not name
            exactly ``record``'s extra fields.
    """
    extra = _extra_fields(type(log), record)
    if extra != more.keys():
        raise TypeError(f"{record.__name__} needs exactly {sorted(extra)}, got {sorted(more)}")
    out = object.__new__(record)
    out.__dict__.update(vars(log))
    out.__dict__.update(more)
    return out


@functools.cache
def _all_fields(record: type[StepLog]) -> frozenset[str]:
    """Every field of ``record``, once ``build`` is checked to be sound for it."""
    if hasattr(record, "__post_init__") or hasattr(record, "__slots__"):
        raise TypeError(f"cannot build a {record.__name__} without its __init__")
    return frozenset(f.name for f in fields(record))


def build(record: type[R], values: dict[str, Any]) -> R:
    """``record(**values)`` with every field of ``record`` given, as ``extend`` builds one.

    The same value, without the frozen dataclass's ``__init__`` (one ``object.__setattr__`` per
    field, on every optimizer step): sound for the reasons ``extend`` gives.

    Raises:
        TypeError: ``values`` does not name exactly ``record``'s fields.
    """
    if values.keys() != _all_fields(record):
        raise TypeError(f"{record.__name__} needs exactly {sorted(_all_fields(record))}, "
                        f"got {sorted(values)}")
    out = object.__new__(record)
    out.__dict__.update(values)
    return out


@dataclass(frozen=True)
class EpochLog:
    """Per-epoch summary produced by the run loop."""

    epoch: int
    train_loss: float
    val_loss: float
    val_acc: float
    clip_fraction: float
    max_grad_norm: float
    skip_count: int
    steps: int
    seconds: float


class CsvStepWriter:
    """Writes ``steps.csv``: one row per optimizer step, flushed to disk per row.

    The file is opened at the first row (or ``state_dict``/``close``), so that a resumed run
    can first ``load_state_dict``: that cuts the file back to the checkpoint's length and
    continues it, instead of starting a new one.

    Args:
        path: the file.
        fsync: also ``fsync`` each row (survives a power cut; ~1 ms a row).
        columns: the header (``CSV_COLUMNS``; a trainer integration's ``StepLog`` subclass
            adds its fields: ``csv_columns(subclass)``).
    """

    def __init__(self, path: str | Path, fsync: bool = False,
                 columns: Sequence[str] = CSV_COLUMNS) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self.columns = list(columns)
        # The row's plan, made once: the record's fields by name (the writer's epoch is
        # inserted at its column), the flags' positions (written as 0/1).
        names = [c for c in self.columns if c != EPOCH]
        self._values = operator.itemgetter(*names) if len(names) > 1 else (
            lambda d: tuple(d[c] for c in names))
        self._epoch_at = self.columns.index(EPOCH) if EPOCH in self.columns else None
        self._flags_at = tuple(i for i, c in enumerate(self.columns) if c in _FLAGS)
        self._file: TextIO | None = None
        self._writer: Any = None
        self._end = 0  # the length at close

    def _open(self, resume_at: int | None = None) -> TextIO:
        if self._file is not None:
            self._file.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_at is None:
            self._file = self.path.open("w", newline="")
        else:
            self._file = self.path.open("r+", newline="")
            self._file.truncate(resume_at)  # rows after the checkpoint are written again
            self._file.seek(resume_at)
        self._writer = csv.writer(self._file)
        if resume_at is None:
            self._writer.writerow(self.columns)
        self._flush(self._file)
        return self._file

    @property
    def position(self) -> int:
        """Bytes written: where a resumed run continues."""
        f = self._file if self._file is not None else self._open()
        return self._end if f.closed else f.tell()

    def state_dict(self) -> dict[str, Any]:
        """The file's length (``load_state_dict`` cuts it back to it)."""
        return {"bytes": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the file from ``state_dict``'s length (later rows are written again)."""
        self._open(resume_at=int(state["bytes"]))

    def _flush(self, f: TextIO) -> None:
        f.flush()
        if self._fsync:
            os.fsync(f.fileno())

    def on_step(self, log: StepLog, epoch: int) -> None:
        """Append one row and flush it."""
        f = self._file if self._file is not None else self._open()
        # vars(), not dataclasses.asdict(), which deep-copies every field (~24 us a row); the
        # fields are immutable scalars, so a view is enough. Picked by a prepared itemgetter,
        # not through merged dicts: a trainer callback pays this on every optimizer step.
        row = list(self._values(vars(log)))
        if self._epoch_at is not None:
            row.insert(self._epoch_at, epoch)
        for i in self._flags_at:
            row[i] = int(row[i])
        self._writer.writerow(row)
        self._flush(f)

    def on_epoch(self, log: EpochLog) -> None:
        """Epoch records are not part of the step CSV."""

    def close(self) -> None:
        """Flush and close the file (idempotent; a run without steps leaves the header)."""
        f = self._file if self._file is not None else self._open()
        if not f.closed:
            self._flush(f)
            self._end = f.tell()
            f.close()
