"""A load generator: busy-loop processes that keep the cores busy while a test runs.

A race between two writers shows under load (issue 32: a scancelled run ended FAILED at load
6-8); a test that must hold whatever the load starts this and stops it at teardown.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

BUSY = "while True: pass"


@contextmanager
def busy_cores(n: int = 2) -> Iterator[list[subprocess.Popen]]:
    """``n`` Python processes spinning on a core each, for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)
