"""Off the training thread: the sender (bounded retries, heartbeat) and the metric buffer.

The training loop never waits on the network. ``MetricBuffer`` (a step sink) only appends
plain tuples; ``Sender`` owns one background thread that delivers every MLflow call in order.
A call that fails for a reason that can pass (server restarting, connection refused, a locked
SQLite database, HTTP 5xx) is retried with exponential back-off and jitter until the outage
has lasted ``retry_s``; then the sender is *offline*: later calls are tried again at most every
``PROBE_EVERY_S`` and counted as ``lost`` otherwise. Nothing is lost for good: the run folder's
journal and ``steps.csv`` hold everything, and ``sync`` uploads what MLflow lacks.
"""

from __future__ import annotations

import logging
import math
import operator
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from stability.core.steplog import EpochLog, StepLog
from stability.tracking.contract import EPOCH_METRICS, STEP_METRICS
from stability.tracking.journal import Journal

log = logging.getLogger(__name__)

MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100  # log_batch limits per call
# On the embedded SQLite store a log_batch costs ~150-250 us of CPU a metric in batches of 78
# (one epoch of a default run) but ~80 us in batches of 1000 (ORM and commit per call): sent
# per epoch, tracking took ~15-20% of a default run's training CPU. Full batches, and at most
# one partial send per FLUSH_EVERY_S, halve that while the UI stays at most this far behind.
FLUSH_EVERY_S = 10.0
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 15.0
PROBE_EVERY_S = 10.0  # offline: how often a call is still tried
# MLflow error codes that a retry cannot fix (the request itself is wrong).
PERMANENT = {"INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST",
             "PERMISSION_DENIED", "UNAUTHENTICATED", "BAD_REQUEST"}
Point = tuple[str, float, int, int]  # key, value, step, timestamp (ms)
_STOP = object()


def retryable(err: BaseException) -> bool:
    """Whether a failed MLflow call may succeed later (outage, locked database, 5xx).

    Network errors and MLflow errors other than ``PERMANENT`` ones (a refused connection comes
    back as ``INTERNAL_ERROR``) are retried; anything else is a bug that waiting cannot fix.
    """
    from mlflow.exceptions import MlflowException

    if "database is locked" in str(err):
        return True
    if isinstance(err, MlflowException):
        return err.error_code not in PERMANENT
    return isinstance(err, OSError)  # ConnectionError, TimeoutError, requests' errors


def backoff_s(attempt: int) -> float:
    """Exponential back-off with jitter (half to full of the doubled delay, capped)."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** attempt) * random.uniform(0.5, 1.0)


def retry_call(fn: Callable[[], Any], retry_s: float) -> Any:
    """``fn()``, retried with ``backoff_s`` while it fails for a passing reason, for up to
    ``retry_s`` (a sync's calls; a locked SQLite database is retried the same way).

    Raises:
        Exception: ``fn``'s last error once the bound has passed, or a permanent one at once.
    """
    start, attempt = time.monotonic(), 0
    while True:
        try:
            return fn()
        except Exception as err:
            left = retry_s - (time.monotonic() - start)
            if not retryable(err) or left <= 0:
                raise
            if attempt == 0:
                log.warning("tracking store not answering (%s); retrying for up to %.0fs",
                            str(err).splitlines()[0][:200], left)
            time.sleep(min(left, backoff_s(attempt)) + 0.01)
            attempt += 1


class Sender:
    """One background thread that delivers MLflow calls in order, with bounded retries.

    Args:
        retry_s: how long one outage is ridden out before the sender goes offline.
        heartbeat: called from the thread every ``heartbeat_s`` while the server answers.
        heartbeat_s: heartbeat period.
        clock: monotonic seconds (``time.monotonic``; a test passes a fake one).
        sleep: waits between retries (``time.sleep``; a fake one advances the fake clock).
    """

    def __init__(self, retry_s: float, heartbeat: Callable[[], Any] | None = None,
                 heartbeat_s: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.retry_s = retry_s
        self._clock = clock
        self._sleep = sleep
        self.offline = False  # an outage outlasted retry_s
        self.lost = 0  # calls not delivered (the journal and steps.csv still have them)
        self.retries = 0  # failed attempts that were retried
        self._heartbeat = heartbeat
        self._heartbeat_s = heartbeat_s
        self._last_beat = clock()
        self._outage_since: float | None = None
        self._next_probe = 0.0
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="mlflow-sender", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any], what: str) -> None:
        """Queue one MLflow call (returns at once)."""
        self._queue.put((fn, what))

    def close(self) -> bool:
        """Deliver everything queued (within the retry bound), stop; True if nothing was lost."""
        self._queue.put(_STOP)
        self._thread.join()
        return self.lost == 0

    def _loop(self) -> None:
        while True:
            wait = self._heartbeat_s - (self._clock() - self._last_beat)
            try:
                item = self._queue.get(timeout=max(0.01, wait))
            except queue.Empty:
                self._beat()
                continue
            if item is _STOP:
                return
            self._deliver(*item)
            if self._clock() - self._last_beat >= self._heartbeat_s:
                self._beat()

    def _beat(self) -> None:
        self._last_beat = self._clock()
        if self._heartbeat is None or self.offline or self._outage_since is not None:
            return
        try:
            self._heartbeat()
        except Exception as err:  # the next real call will find out about the outage
            log.debug("heartbeat not sent: %s", err)

    def _deliver(self, fn: Callable[[], Any], what: str) -> None:
        attempt = 0
        while True:
            now = self._clock()
            if self.offline and now < self._next_probe:
                self.lost += 1
                return
            try:
                fn()
            except Exception as err:
                if not retryable(err):
                    log.warning("MLflow refused %s (kept in the run folder): %s", what, err)
                    self.lost += 1
                    return
                if self._outage_since is None:
                    self._outage_since = now
                    log.warning("tracking store not answering (%s); retrying for up to %.0fs",
                                str(err).splitlines()[0][:200], self.retry_s)
                left = self.retry_s - (now - self._outage_since)
                if self.offline or left <= 0:
                    if not self.offline:
                        log.warning("tracking store away for %.0fs: the run goes on, kept "
                                    "locally", now - self._outage_since)
                    self.offline, self._next_probe = True, now + PROBE_EVERY_S
                    self.lost += 1
                    return
                self.retries += 1
                self._sleep(min(left, backoff_s(attempt)) + 0.01)
                attempt += 1
                continue
            if self._outage_since is not None:
                log.warning("tracking store answers again after %.0fs",
                            self._clock() - self._outage_since)
            self._outage_since, self.offline = None, False
            return


def send_metrics(c: Any, run_id: str, points: list[Point]) -> None:
    """``log_batch`` the points, ``MAX_METRICS`` a call (exact resends are de-duplicated by
    MLflow's SQL stores: a metric's identity includes its timestamp)."""
    from mlflow.entities import Metric

    for i in range(0, len(points), MAX_METRICS):
        batch = [Metric(k, float(v), ts, step) for k, v, step, ts in points[i : i + MAX_METRICS]]
        c.log_batch(run_id, metrics=batch, synchronous=True)


_STEP_VALUES = operator.attrgetter(*STEP_METRICS)  # one call for the step's metric values


def step_points(s: StepLog, ts: int) -> list[Point]:
    """The points of one optimizer step: the ``STEP_METRICS`` at MLflow step ``s.step``."""
    return [(k, float(v), s.step, ts) for k, v in zip(STEP_METRICS, _STEP_VALUES(s), strict=True)]


def epoch_points(e: EpochLog, ts: int) -> list[Point]:
    """The points of one epoch: the ``EPOCH_METRICS`` at MLflow step ``e.epoch``."""
    return [(key, float(getattr(e, name)), e.epoch, ts) for key, name in EPOCH_METRICS.items()]


class MetricBuffer:
    """Step sink (``core.sinks.StepSink``) that buffers metrics and hands them to the
    ``Sender`` in batches.

    The training thread only appends plain tuples (~2 us a step). Batches go out when
    ``MAX_METRICS`` are pending, at the first epoch end, at a later epoch end once
    ``flush_every_s`` has passed since the last send, and on ``flush``. Per-epoch and summary
    values are also written to the journal (per-step values are ``steps.csv``'s rows).

    Args:
        send: queues one batch for delivery.
        journal: the run folder's journal (None: not recorded locally).
        flush_every_s: at most one partial send per this many seconds.
    """

    def __init__(self, send: Callable[[list[Point]], None], journal: Journal | None = None,
                 flush_every_s: float = FLUSH_EVERY_S,
                 send_params: Callable[[dict[str, str]], None] | None = None) -> None:
        self._send = send
        self._send_params = send_params
        self._journal = journal
        self._pending: list[Point] = []
        self._flush_every_s = flush_every_s
        self._last_flush = -math.inf  # the first epoch goes out at once: a new run shows curves

    def on_params(self, params: Mapping[str, str]) -> None:
        """``core.sinks.ParamSink``: params known once training started (a trainer's own
        optimizer and schedule), journaled and sent after the run's creation."""
        params = {k: str(v) for k, v in params.items()}
        if self._journal is not None:
            self._journal.write("params", params=params)
        if self._send_params is not None:
            self._send_params(params)

    def on_step(self, s: StepLog, epoch: int) -> None:
        """Buffer the step's metrics (no I/O on this thread)."""
        self._pending.extend(step_points(s, int(time.time() * 1000)))
        if len(self._pending) >= MAX_METRICS:
            self.flush()

    def state_dict(self) -> dict[str, Any]:
        """``StepSink``: nothing to resume (what was not sent is in the journal/steps.csv)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """``StepSink``: nothing to restore."""

    def on_epoch(self, e: EpochLog) -> None:
        """Buffer (and journal) the epoch's metrics; send if ``flush_every_s`` has passed."""
        points = epoch_points(e, int(time.time() * 1000))
        if self._journal is not None:
            self._journal.write("epoch", epoch=e.epoch)  # its ts dates the epoch's steps
        self.add_points(points)
        if (len(self._pending) >= MAX_METRICS
                or time.monotonic() - self._last_flush >= self._flush_every_s):
            self.flush()

    def add(self, metrics: Mapping[str, float], step: int = 0) -> None:
        """Buffer (and journal) arbitrary metrics (summary values)."""
        ts = int(time.time() * 1000)
        self.add_points([(k, float(v), step, ts) for k, v in metrics.items()])

    def add_points(self, points: list[Point]) -> None:
        """Buffer and journal already-built points."""
        if self._journal is not None and points:
            self._journal.write("metrics", metrics=points)
        self._pending.extend(points)

    def flush(self) -> None:
        """Hand what is buffered to the sender (returns at once)."""
        if self._pending:
            batch, self._pending = self._pending, []
            self._send(batch)
            self._last_flush = time.monotonic()
