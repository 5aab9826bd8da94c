"""Stopping a sweep on Ctrl-C or SIGTERM without leaving runs open in MLflow.

Out-of-process workers (joblib) get Ctrl-C from the terminal themselves, and each job closes
its own run as KILLED. If the sweeper raised at once, joblib would SIGKILL those workers in
the middle of that close; so the first signal only asks to stop: SIGTERM, which a terminal
does not deliver to the workers, is forwarded to them, the running batch is collected and no
new job starts. A second signal stops at once. A job that runs in the sweeper's own process
(the basic launcher) is interrupted directly, as in a single run.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from stability.tracking import Terminated


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
    """

    def __init__(self, in_process: bool) -> None:
        self.in_process = in_process
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
        if self.in_process or not first:
            raise self.exception()
        if signum == signal.SIGTERM:
            for pid in child_pids():
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        print(f"[sweep] {signal.Signals(signum).name}: running jobs close their runs as KILLED, "
              "no new job starts (send it again to stop at once)", flush=True)

    @contextmanager
    def installed(self) -> Iterator[StopRequest]:
        """Handle SIGINT and SIGTERM inside the block (main thread only)."""
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
