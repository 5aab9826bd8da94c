"""The sweep's status area: live on a terminal (rich), plain lines elsewhere.

On a terminal, one live area (``rich.live.Live``, redrawn every second) shows the
``Progress``: a bar, runs done / running / failed / skipped, elapsed and ETA, the lowest-mean config
so far on validation, and the last finished run's result; when the sweep ends, its last frame
stays on screen. Anywhere else (CI, SLURM logs, ``| tee``) the same status is one plain line
printed when the first run ends, then at most every ``every_s`` seconds, and once at the end.
The workers print no per-epoch lines (``stability.sweep.job``), so this area is most of what a
sweep prints.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

from stability.core.config import ConfigError
from stability.sweep.progress import Progress

MODES = ("auto", "live", "plain")  # hydra.sweeper.progress


def check_mode(mode: str, every_s: float) -> None:
    """Raise ``ConfigError`` naming the key and its allowed values for a bad setting."""
    if mode not in MODES:
        raise ConfigError(f"hydra.sweeper.progress={mode} is invalid: allowed values are "
                          f"{' | '.join(MODES)}")
    if not isinstance(every_s, int | float) or isinstance(every_s, bool) or every_s < 0:
        raise ConfigError(f"hydra.sweeper.progress_every_s={every_s} is invalid: allowed "
                          "values are a number of seconds >= 0")


class _Status:
    """The live area's content, rebuilt from ``Progress`` at every redraw."""

    def __init__(self, display: Display) -> None:
        self.display = display

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        with self.display.lock:
            self.display.poll()
            p = self.display.progress
            lines = p.lines()
            ended = p.done + p.failed
        head = Table.grid(padding=(0, 1))
        head.add_row(Text(f"sweep {self.display.title}"),
                     ProgressBar(total=max(p.total, 1), completed=ended, width=40),
                     Text(f"{ended}/{p.total}"))
        return Group(head, Text("\n".join(lines)))


class Display:
    """Draws ``progress`` while a sweep runs (a context manager).

    Args:
        progress: what to draw.
        title: the sweep's name in the live area (its id).
        mode: ``live`` (rich), ``plain`` (lines), or ``auto``: live on a terminal.
        every_s: plain mode: at most one line per this many seconds (0: one per run).
        poll: called (under ``lock``) before each redraw, e.g. to read which jobs started.
        stream: where to write (default ``sys.stdout``).
    """

    def __init__(self, progress: Progress, title: str, mode: str = "auto",
                 every_s: float = 60.0, poll: Callable[[], None] | None = None,
                 stream: TextIO | None = None) -> None:
        self.progress = progress
        self.title = title
        self.stream = stream or sys.stdout
        self.live = mode == "live" or (mode == "auto" and self.stream.isatty())
        self.every_s = every_s
        self.poll = poll or (lambda: None)
        self.lock = threading.Lock()
        self._live: Any = None
        self._last_line = -float("inf")
        self._printed = 0  # runs ended at the last plain line
        self._handlers: list[tuple[logging.StreamHandler, Any]] = []

    def __enter__(self) -> Display:
        if self.live:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream, force_terminal=True)  # live was asked for
            self._live = Live(_Status(self), console=console, refresh_per_second=1,
                              transient=False, redirect_stdout=True, redirect_stderr=True)
            self._live.start()
            self._route_logging()
        return self

    def _route_logging(self) -> None:
        """Log records of this process print above the live area, not through it."""
        for handler in logging.getLogger().handlers:
            if (type(handler) is logging.StreamHandler
                    and handler.stream in (sys.__stdout__, sys.__stderr__, self.stream)):
                old = handler.setStream(sys.stdout)  # rich's proxy while live
                if old is not None:
                    self._handlers.append((handler, old))

    def start(self, job: int, at: float | None = None) -> None:
        """``Progress.start`` under the lock."""
        with self.lock:
            self.progress.start(job, at)

    def end(self, job: int, value: float | None, duration: float | None = None) -> None:
        """``Progress.end`` under the lock, then redraw (plain: a line if it is time)."""
        with self.lock:
            self.poll()
            self.progress.end(job, value, duration=duration)
            first = self.progress.done + self.progress.failed == 1
        if self._live is not None:
            self._live.refresh()
        elif first or time.monotonic() - self._last_line >= self.every_s:
            self._print_line()

    def _print_line(self) -> None:
        with self.lock:
            self.poll()
            line = self.progress.line()
            self._printed = self.progress.done + self.progress.failed
        self.stream.write(f"[sweep] {line}\n")
        self.stream.flush()
        self._last_line = time.monotonic()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.stop()  # the last frame stays on screen
            for handler, old in self._handlers:
                handler.setStream(old)
        elif self.progress.done + self.progress.failed > self._printed:
            self._print_line()
