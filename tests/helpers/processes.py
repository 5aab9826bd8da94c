"""Real subprocesses for the durability tests: start an entry point, wait for rows, kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
ENV = os.environ | {"MLFLOW_TRACKING_URI": "", "PYTHONUNBUFFERED": "1"}


def start(script: str, *args: str) -> subprocess.Popen:
    """``python experiments/<script> args`` in its own process group (output captured)."""
    return subprocess.Popen([sys.executable, f"experiments/{script}", *args], cwd=PROJECT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
                            start_new_session=True)


def run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run an entry point to the end; returns its exit status and output."""
    return subprocess.run([sys.executable, f"experiments/{script}", *args], cwd=PROJECT,
                          capture_output=True, text=True, env=ENV, timeout=timeout)


def rows(path: Path) -> int:
    """Data rows of a CSV written so far (0 if it does not exist yet)."""
    return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 120,  # noqa: ANN001
             every: float = 0.05) -> None:
    """Poll ``predicate()`` every ``every`` s until true; fail if ``proc`` ends first or time
    runs out (a predicate that queries a server asks less often)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"process ended early:\n{proc.communicate()[0][-3000:]}")
        time.sleep(every)
    raise AssertionError("timed out waiting")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process and everything it started (its process group)."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
