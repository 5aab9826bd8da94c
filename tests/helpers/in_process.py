"""The ``stability`` command run in the test's own process: no interpreter to start.

``in_process(["sweep", ...])`` calls the real console-script entry point
(``stability.cli.main``): its argument handling, Hydra's composition, the job and the exit
status are the ones a shell gets. Only the process boundary is skipped, which saves the ~7 s of
imports a fresh Python pays (torch, MLflow). Each command keeps subprocess tests of its own
(``tests/test_cli.py``, ``tests/report/test_cli.py``, the sweeps that are killed or raced), which
prove the installed entry point itself.

What the command changes in the process (``sys.argv``, ``sys.path``, the environment,
the working folder, torch's thread count, the root logger's handlers, Hydra's global state) is
put back afterwards, so a later test sees the process as it was.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra


@dataclass(frozen=True)
class Done:
    """How an in-process command ended: its exit status and what it printed."""

    code: int
    stdout: str
    stderr: str


def _status(code: object) -> int:
    # SystemExit(None) is 0; a message instead of a number is exit 1, as the interpreter does.
    return 0 if code is None else code if isinstance(code, int) else 1


def call(entry: Callable[[], object], capsys: pytest.CaptureFixture[str]) -> Done:
    """Run ``entry()`` as a process would run it: its exit status and its output.

    Args:
        entry: The entry point; returning normally is exit 0, an int return is the status
            (``stability.cli.sync``), ``SystemExit`` carries it otherwise.
        capsys: The test's capture of stdout and stderr (read, and so emptied, before and
            after).

    Returns:
        The exit status and what the command printed.
    """
    capsys.readouterr()
    argv, path, environ, cwd = list(sys.argv), list(sys.path), dict(os.environ), os.getcwd()
    threads = torch.get_num_threads()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    if GlobalHydra.instance().is_initialized():  # left by an earlier compose in this process
        GlobalHydra.instance().clear()
    try:
        try:
            returned = entry()
            code = returned if isinstance(returned, int) else 0
        except SystemExit as stop:
            code = _status(stop.code)
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
            handler.close()
        root.handlers[:], root.level = handlers, level
        torch.set_num_threads(threads)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        sys.argv[:], sys.path[:] = argv, path
        if GlobalHydra.instance().is_initialized():
            GlobalHydra.instance().clear()
    out = capsys.readouterr()
    return Done(code, out.out, out.err)


def in_process(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> Done:
    """``stability ARGV`` (``stability.cli.main``) in this process.

    Args:
        argv: The arguments after ``stability`` (``["sweep", "-m", "seed=0,1"]``).
        capsys: The test's capture of stdout and stderr.

    Returns:
        The exit status and what the command printed.
    """
    from stability import cli

    return call(lambda: cli.main(list(argv)), capsys)
