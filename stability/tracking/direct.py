"""Metric points straight into the embedded SQLite store: one short transaction a flush.

On the embedded store MLflow's client runs its SQL store in the training process, and
``SqlAlchemyStore.log_batch`` spends ~110-200 us of CPU a point there (an ORM object per point,
two sessions, the latest-metric lookups, measured in docs/performance.md, "Tracking on the
embedded store"): with eight points a step that made the default (SQLite) path cost more than
sending the same points to a server, whose process pays that CPU instead. ``DirectMetrics``
writes the rows MLflow's store writes for a ``log_batch`` of metrics (``compat.mlflow``, which
holds the SQL and its version gate), in one transaction a flush: ~14 us a point. A store this
does not know (another MLflow version, other columns) goes through MLflow's ``log_batch`` as
before (``fallback``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from stability.compat.mlflow import MAX_DOUBLE, Point, sanitized, writable, write_metrics

__all__ = ["BUSY_TIMEOUT_S", "MAX_DOUBLE", "DirectMetrics", "Point", "sanitized"]

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 20.0  # another worker's transaction holds the write lock: wait this long


class DirectMetrics:
    """Writes metric points of runs in one SQLite store (from the sender thread).

    Args:
        db: the store's database file (``uri.sqlite_path``).
        fallback: ``(run_id, points)`` through MLflow, for a store ``compat.mlflow`` does not
            know.
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
                self.direct = writable(self._connect())
                if not self.direct:
                    log.info("MLflow store %s not written directly (untested version or "
                             "schema): metrics go through MLflow", self.db)
            if not self.direct:
                self.fallback(run_id, list(points))
                return
            write_metrics(self._connect(), run_id, points)

    def _connect(self) -> sqlite3.Connection:
        if self._con is None:  # autocommit mode: compat.mlflow opens its transactions itself
            self._con = sqlite3.connect(self.db, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                        check_same_thread=False)
        return self._con

    def close(self) -> None:
        """Close the connection (the sender has delivered everything)."""
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
