"""A run's ``steps.csv`` as the report reads it: a table of numbers, bounded, checked.

The table is data a teammate could have written: it is refused by its file size and by its
widest line before it is parsed (``adoption.MAX_STEPS_BYTES``, ``MAX_STEPS_COLUMNS``), must
hold every column the report reads steps by (``READ_COLUMNS``), and every cell of a number
column must be a number. A table that fails is
that run's problem, one line under Problems, never the end of the report.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from stability.core.steplog import COLUMN, TEXT_COLUMNS
from stability.report.evidence.fetch import download, parallel
from stability.tracking.adoption import MAX_STEPS_BYTES, too_wide

log = logging.getLogger(__name__)

# TEXT_COLUMNS, StepLog's str fields: every other steps.csv column is a number.
NAN_WORDS = {"", "nan", "none", "inf", "-inf", "+inf", "infinity", "-infinity"}


class UnreadableTable(ValueError):
    """A run's ``steps.csv`` holds a cell that is not what its column records, or lacks a
    column the report reads."""


# The columns the report reads a run's steps by (health, figures, advice): a table without one
# is that run's problem, never a KeyError that ends the whole report.
READ_COLUMNS = (COLUMN.step, COLUMN.loss, COLUMN.skipped, COLUMN.skip_reason,
                COLUMN.scaler_scale, COLUMN.clipped, COLUMN.grad_l2_pre_clip)


def read_steps(path: Path) -> pd.DataFrame:
    """``steps.csv`` as a DataFrame whose number columns are numbers.

    Raises:
        UnreadableTable: names the line and column of the first cell that is not a number, or
            the columns of ``READ_COLUMNS`` it lacks.
    """
    size = path.stat().st_size
    if size > MAX_STEPS_BYTES:  # before reading: pandas holds every cell as a string first
        raise UnreadableTable(f"steps.csv is {size:,} bytes, over the report's cap of "
                              f"{MAX_STEPS_BYTES:,}")
    wide = too_wide(path)  # and by its shape, before pandas holds a cell
    if wide:
        raise UnreadableTable(wide)
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as err:  # ParserError, UnicodeDecodeError, EmptyDataError
        raise UnreadableTable(f"steps.csv: {type(err).__name__}: "
                              f"{' '.join(str(err).split())[:200]}") from None
    missing = [c for c in READ_COLUMNS if c not in df.columns]
    if missing:
        raise UnreadableTable(f"steps.csv has no column {', '.join(missing)}")
    for col in (c for c in df.columns if c not in TEXT_COLUMNS):
        numbers = pd.to_numeric(df[col], errors="coerce")
        bad = numbers.isna() & ~df[col].str.strip().str.lower().isin(NAN_WORDS)
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise UnreadableTable(f"steps.csv line {i + 2}, column {col}: "
                                  f"{df[col].iloc[i][:40]!r} is not a number")
        df[col] = numbers
    for col in (c for c in TEXT_COLUMNS if c in df.columns):
        df[col] = df[col].replace("", math.nan)  # as pandas reads an empty cell
    return df


def steps_tables(c: Any, run_ids: Iterable[str], dest: Path, workers: int = 8,
                 artifact_uris: Mapping[str, str] | None = None,
                 unreadable: dict[str, str] | None = None) -> dict[str, pd.DataFrame]:
    """``steps.csv`` of each run as a DataFrame (runs without one are left out).

    ``artifact_uris`` (run id -> the run's ``artifact_uri``) saves the run look-ups. A table
    that cannot be read is left out too, its reason put into ``unreadable`` (run id ->
    reason): one bad run must not end the report.
    """
    uris = artifact_uris or {}

    def one(run_id: str) -> pd.DataFrame | str | None:
        path = download(c, run_id, "steps.csv", dest / run_id, uris.get(run_id))
        try:
            return read_steps(path) if path is not None else None
        except UnreadableTable as err:
            log.warning("run %s: %s", run_id, err)
            return str(err)

    got = parallel(one, run_ids, workers)
    if unreadable is not None:
        unreadable.update({k: v for k, v in got.items() if isinstance(v, str)})
    return {k: v for k, v in got.items() if isinstance(v, pd.DataFrame)}
