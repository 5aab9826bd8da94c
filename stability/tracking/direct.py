"""Metric points straight into the embedded SQLite store: one short transaction a flush.

On the embedded store MLflow's client runs its SQL store in the training process, and
``SqlAlchemyStore.log_batch`` spends ~110-200 us of CPU a point there (an ORM object per point,
two sessions, the latest-metric lookups, measured in docs/performance.md, "Tracking on the
embedded store"): with eight points a step that made the default (SQLite) path cost more than
sending the same points to a server, whose process pays that CPU instead. ``DirectMetrics``
writes the rows MLflow's store writes for a ``log_batch`` of metrics, as one ``executemany``
into ``metrics`` and one upsert a key into ``latest_metrics``, in one ``BEGIN IMMEDIATE``
transaction: ~14 us a point.

The rows are MLflow's own rules, as ``SqlAlchemyStore._log_metrics`` applies them: NaN stored
as 0 with ``is_nan``, infinities as the largest double; an exact resend is ignored (the primary
key covers key, timestamp, step, value, is_nan); ``latest_metrics`` keeps the point with the
highest (step, timestamp, value); a run that is not active refuses metrics. Only a schema this
module knows is written: a store whose ``metrics`` or ``latest_metrics`` columns differ (another
MLflow version) goes through MLflow's ``log_batch`` as before (``fallback``).
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

MAX_DOUBLE = 1.7976931348623157e308  # what MLflow's SQL store writes for an infinity
BUSY_TIMEOUT_S = 20.0  # another worker's transaction holds the write lock: wait this long
# The columns of MLflow's tables this module writes (MLflow 3.x); anything else: fallback.
SCHEMA = {"metrics": {"key", "value", "timestamp", "run_uuid", "step", "is_nan"},
          "latest_metrics": {"key", "value", "timestamp", "step", "is_nan", "run_uuid"}}
Point = tuple[str, float, int, int]  # key, value, step, timestamp (ms): buffer.Point

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
    """Whether the store's metric tables have exactly the columns this module writes."""
    for table, columns in SCHEMA.items():
        found = {row[1] for row in con.execute(f"PRAGMA table_info({table})")}
        if found != columns:
            return False
    return True


class DirectMetrics:
    """Writes metric points of runs in one SQLite store (from the sender thread).

    Args:
        db: the store's database file (``uri.sqlite_path``).
        fallback: ``(run_id, points)`` through MLflow, for a schema this module does not know.
    """

    def __init__(self, db: Path, fallback: Callable[[str, list[Point]], None]) -> None:
        self.db = db
        self.fallback = fallback
        self.direct: bool | None = None  # decided at the first write (the store may not exist yet)
        self._con: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def log(self, run_id: str, points: Sequence[Point]) -> None:
        """Write ``points`` of run ``run_id`` (one transaction), or hand them to ``fallback``.

        Raises:
            MlflowException: the run does not exist or is deleted (not retried), as MLflow's.
            sqlite3.OperationalError: e.g. ``database is locked`` (the sender retries it).
        """
        if not points:
            return
        with self._lock:
            if self.direct is None:
                con = self._connect()
                self.direct = known_schema(con)
                if not self.direct:
                    log.info("unknown MLflow schema in %s: metrics go through MLflow", self.db)
            if not self.direct:
                self.fallback(run_id, list(points))
                return
            self._write(self._connect(), run_id, points)

    def _connect(self) -> sqlite3.Connection:
        if self._con is None:  # autocommit mode: this class opens its transactions itself
            self._con = sqlite3.connect(self.db, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                        check_same_thread=False)
        return self._con

    @staticmethod
    def _write(con: sqlite3.Connection, run_id: str, points: Sequence[Point]) -> None:
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

    def close(self) -> None:
        """Close the connection (the sender has delivered everything)."""
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
