"""Stop signals, in one place: how SIGTERM and Ctrl-C end a run, a rank and a sweep.

Three situations, three mechanisms, one module:

- A training run (``sigterm_as_exception``): SIGTERM raises ``Terminated`` in the main thread,
  so the tracked run is closed as KILLED with its CSV uploaded, exactly like Ctrl-C
  (``KeyboardInterrupt``).
- A data-parallel rank (``sigterm_deferred``): torchrun tears ranks down with SIGTERM and
  SIGKILL 30 s later; inside the block SIGTERM is only noted and re-sent when the outermost
  block ends, so rank 0 finishes closing its run first.
- A sweep (``StopRequest``): out-of-process workers (joblib) get Ctrl-C from the terminal
  themselves, and each job closes its own run as KILLED. If the sweeper raised at once, joblib
  would SIGKILL those workers in the middle of that close; so the first signal only asks to
  stop: a stop file is written (jobs still queued see it and return unstarted), SIGTERM, which
  a terminal does not deliver to the workers, is forwarded to them, the running jobs are
  collected and no new job starts. A second signal stops at once. A job that
  runs in the sweeper's own process (the basic launcher) is interrupted directly.

Handlers can only be installed from the main thread; elsewhere (some launchers) every
mechanism leaves signals alone.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM so the run can be closed as KILLED."""


_deferred = {"depth": 0, "pending": False}  # nesting of sigterm_deferred, a noted SIGTERM


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


_received = {"signum": 0}  # a SIGTERM that arrived inside sigterm_as_exception


@contextmanager
def sigterm_as_exception() -> Iterator[None]:
    """Inside this block SIGTERM raises ``Terminated`` (main thread only).

    Python drops an exception raised while a finalizer runs (a generator closed by the garbage
    collector, a ``__del__``: "Exception ignored in ..."), so a signal landing there would be
    lost and the run would train on. The signal is also noted; ``raise_if_terminated``, called
    at every optimizer step, raises it then.
    """
    if not _main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        _received["signum"] = signum
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _received["signum"] = 0


def raise_if_terminated() -> None:
    """Raise ``Terminated`` if a SIGTERM arrived in ``sigterm_as_exception`` and its exception
    did not end the block (see there); a no-op otherwise."""
    if _received["signum"]:
        raise Terminated(f"signal {_received['signum']}")


@contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Inside this block SIGTERM is only noted; it is re-sent when the outermost block ends.

    Closing rank 0's MLflow run must not be cut short by torchrun terminating the ranks
    (it sends SIGTERM, then SIGKILL 30 s later). If the block ends with an exception the
    process is failing anyway and the noted signal is dropped.
    """
    if not _main_thread():
        yield
        return

    def note(signum: int, frame: Any) -> None:
        _deferred["pending"] = True

    previous = signal.signal(signal.SIGTERM, note)
    _deferred["depth"] += 1
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        _deferred["depth"] -= 1
        signal.signal(signal.SIGTERM, previous)
        if _deferred["depth"] == 0 and _deferred["pending"]:
            _deferred["pending"] = False
            if not failed:
                signal.raise_signal(signal.SIGTERM)


def child_pids() -> list[int]:
    """Direct children of this process that are workers (not multiprocessing helpers)."""
    me, pids = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[1]) == me and b"resource_tracker" not in cmdline:
            pids.append(int(stat.parent.name))
    return pids


class StopRequest:
    """Records the first Ctrl-C / SIGTERM; see the module docstring.

    Args:
        in_process: jobs run in this process (basic launcher): raise at once instead.
        stop_file: written on the first signal, before the workers hear of it, so that jobs
            queued in a worker pool (``stability.sweep.pool``) return without starting.
        say: tells the user that the sweep is stopping (default: a log warning; the sweep's
            CLI prints it).
    """

    def __init__(self, in_process: bool, stop_file: Path | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.in_process = in_process
        self.stop_file = stop_file
        self.say = say or log.warning
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        """A stop was asked for."""
        return self.signum is not None

    def exception(self) -> BaseException:
        """What the sweep ends with once stopped (KeyboardInterrupt or Terminated)."""
        if self.signum == signal.SIGINT:
            return KeyboardInterrupt()
        return Terminated(f"signal {self.signum}")

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.signum is None
        self.signum = signum if first else self.signum
        if first and self.stop_file is not None:
            self.stop_file.touch()
        if self.in_process or not first:
            raise self.exception()
        if signum == signal.SIGTERM:
            for pid in child_pids():
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        self.say(f"{signal.Signals(signum).name}: running jobs close their runs as KILLED, "
                 "no new job starts (send it again to stop at once)")

    @contextmanager
    def installed(self) -> Iterator[StopRequest]:
        """Handle SIGINT and SIGTERM inside the block (main thread only)."""
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
