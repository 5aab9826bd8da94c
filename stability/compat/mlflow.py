"""MLflow's SQL tables, written directly: the rows its store writes for a ``log_batch`` of metrics.

On the embedded SQLite store ``tracking.direct.DirectMetrics`` writes metric points as one
``executemany`` into ``metrics`` and one upsert a key into ``latest_metrics`` (~14 us a point
instead of ~110-200 us through ``SqlAlchemyStore.log_batch``, docs/performance.md). The rows
follow MLflow's own rules, as ``SqlAlchemyStore._log_metrics`` applies them: NaN stored as 0
with ``is_nan``, infinities as the largest double; an exact resend is ignored (the primary key
covers key, timestamp, step, value, is_nan); ``latest_metrics`` keeps the point with the highest
(step, timestamp, value); a run that is not active refuses metrics.

Two checks guard it: ``GATE`` (the MLflow versions these rules were read from) and
``known_schema`` (the tables have exactly the columns written here). Either one failing sends
the points through MLflow's ``log_batch`` instead.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence

from stability.compat.gate import VersionGate

GATE = VersionGate(package="mlflow", low="3.1", below="4", module="stability/compat/mlflow.py",
                   reads="the columns and rules of its SQL tables metrics, latest_metrics, runs")
MAX_DOUBLE = 1.7976931348623157e308  # what MLflow's SQL store writes for an infinity
# The columns of MLflow's tables written here; a store with any others is not written.
SCHEMA = {"metrics": {"key", "value", "timestamp", "run_uuid", "step", "is_nan"},
          "latest_metrics": {"key", "value", "timestamp", "step", "is_nan", "run_uuid"}}
Point = tuple[str, float, int, int]  # key, value, step, timestamp (ms): tracking.buffer.Point

_INSERT = ("INSERT OR IGNORE INTO metrics (key, value, timestamp, run_uuid, step, is_nan) "
           "VALUES (?, ?, ?, ?, ?, ?)")
_LATEST = ("INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
           "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key, run_uuid) DO UPDATE SET "
           "value = excluded.value, timestamp = excluded.timestamp, step = excluded.step, "
           "is_nan = excluded.is_nan WHERE (excluded.step, excluded.timestamp, excluded.value) "
           "> (latest_metrics.step, latest_metrics.timestamp, latest_metrics.value)")


def sanitized(value: float) -> tuple[float, bool]:
    """``(value, is_nan)`` as MLflow's SQL store keeps a metric value."""
    if math.isnan(value):
        return 0.0, True
    if math.isinf(value):
        return (MAX_DOUBLE if value > 0 else -MAX_DOUBLE), False
    return value, False


def known_schema(con: sqlite3.Connection) -> bool:
    """Whether the store's metric tables have exactly the columns written here."""
    for table, columns in SCHEMA.items():
        found = {row[1] for row in con.execute(f"PRAGMA table_info({table})")}
        if found != columns:
            return False
    return True


def writable(con: sqlite3.Connection) -> bool:
    """Whether points may be written into this store directly: a tested MLflow version (a
    warning once otherwise) and ``known_schema``."""
    return GATE.check() and known_schema(con)


def write_metrics(con: sqlite3.Connection, run_id: str, points: Sequence[Point]) -> None:
    """Write ``points`` of run ``run_id`` in one ``BEGIN IMMEDIATE`` transaction.

    ``con`` is in autocommit mode (``isolation_level=None``): the transaction is opened here.

    Raises:
        MlflowException: the run does not exist or is not active (as MLflow's store raises).
        sqlite3.OperationalError: e.g. ``database is locked``.
    """
    rows, latest = [], {}
    for key, raw, step, ts in points:
        value, nan = sanitized(float(raw))
        rows.append((key, value, ts, run_id, step, int(nan)))
        best = latest.get(key)
        if best is None or (step, ts, value) > (best[3], best[2], best[1]):
            latest[key] = (key, value, ts, step, int(nan), run_id)
    con.execute("BEGIN IMMEDIATE")
    try:
        row = con.execute("SELECT lifecycle_stage FROM runs WHERE run_uuid = ?",
                          (run_id,)).fetchone()
        if row is None or row[0] != "active":  # MLflow's _check_run_is_active / _get_run
            from mlflow.exceptions import MlflowException
            from mlflow.protos.databricks_pb2 import (
                INVALID_PARAMETER_VALUE,
                RESOURCE_DOES_NOT_EXIST,
            )

            if row is None:
                raise MlflowException(f"Run with id={run_id} not found",
                                      RESOURCE_DOES_NOT_EXIST)
            raise MlflowException(f"The run {run_id} must be in the 'active' state. "
                                  f"Current state is {row[0]}.", INVALID_PARAMETER_VALUE)
        con.executemany(_INSERT, rows)
        con.executemany(_LATEST, list(latest.values()))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
