"""Per-step records and the CSV writer that is the ground truth of every run.

Each row is flushed to the operating system as it is written, so a crash, SIGKILL or
interrupt of the process loses nothing that was already logged. (``fsync`` per row would
also survive a power cut, but costs ~1 ms a step, more than the step itself here.)
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO


class SkipReason(StrEnum):
    """Why an optimizer step was not taken (``steps.csv`` column ``skip_reason``)."""

    NONE = ""  # the step was taken
    NONFINITE_LOSS = "nonfinite_loss"  # inf/nan loss: skipped before backward
    NONFINITE_GRAD = "nonfinite_grad"  # inf/nan unscaled gradient: skipped before the step


@dataclass(frozen=True)
class StepLog:
    """What one optimizer step did. ``step`` is the 1-based optimizer-step index."""

    step: int
    lr: float
    grad_l2_pre_clip: float
    grad_l2_post_clip: float
    loss: float
    skipped: bool
    skip_reason: str
    scaler_scale: float
    clipped: bool
    micro_batches: int
    samples: int
    skips_cumulative: int  # skipped steps so far in this run, this one included
    underflow_frac: float = math.nan
    nonfinite_param: str = ""


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


# The first eight columns are fixed by contract; extra columns follow.
CSV_COLUMNS = [
    "step", "lr", "grad_l2_pre_clip", "grad_l2_post_clip", "loss", "skipped", "skip_reason",
    "scaler_scale", "epoch", "clipped", "micro_batches", "samples", "skips_cumulative",
    "underflow_frac", "nonfinite_param",
]
assert {f.name for f in fields(StepLog)} <= set(CSV_COLUMNS)


class CsvStepWriter:
    """Writes ``steps.csv``: one row per optimizer step, flushed to disk per row.

    The file is opened at the first row (or ``state_dict``/``close``), so that a resumed run
    can first ``load_state_dict``: that cuts the file back to the checkpoint's length and
    continues it, instead of starting a new one.

    Args:
        path: the file.
        fsync: also ``fsync`` each row (survives a power cut; ~1 ms a row).
        columns: the header (``CSV_COLUMNS``; a trainer integration appends its own, which
            ``StepLog`` subclasses it writes carry as fields).
    """

    def __init__(self, path: str | Path, fsync: bool = False,
                 columns: Sequence[str] = tuple(CSV_COLUMNS)) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self.columns = list(columns)
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
        # vars(), not dataclasses.asdict(), which deep-copies every field (~24 us a row, most of
        # this writer's cost per step); the fields are immutable scalars, so a view is enough.
        row = vars(log) | {
            "epoch": epoch,
            "skipped": int(log.skipped),
            "clipped": int(log.clipped),
        }
        self._writer.writerow([row[c] for c in self.columns])
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
