"""The user's code raised during a check: where (the hook or function), and what.

A probe runs the user's loop, model, loss or trainer hooks; an exception from any of them ends
the check with exit status 3 and one line naming the innermost frame of the user's own code (not
this package, not an installed library, not the standard library) and the exception. The probes
that ran before it keep their results (``LoopRaised.results``).
"""

from __future__ import annotations

import sysconfig
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stability.check.result import ProbeResult
from stability.core.validation import ConfigError, locate
from stability.integrations.protocol import NotApplicable

__all__ = ["LoopRaised", "NotApplicable", "library_raised", "load", "one_line", "where_raised"]

PACKAGE = Path(__file__).resolve().parents[1]
LIBRARIES = tuple(Path(p).resolve() for p in {sysconfig.get_paths()["stdlib"],
                                              sysconfig.get_paths()["purelib"],
                                              sysconfig.get_paths()["platlib"]})


class LoopRaised(Exception):
    """The user's code raised while probe ``probe`` ran.

    Attributes:
        probe: the probe that was running.
        where: ``qualname (file:line)`` of the innermost user frame (or of the raise).
        error: ``ExceptionType: message`` (one line).
        results: the results of the probes that finished before it.
    """

    def __init__(self, *, probe: str, where: str, error: str,
                 results: Sequence[ProbeResult]) -> None:
        super().__init__(f"the code under check raised in {where} during {probe}: {error}")
        self.probe, self.where, self.error, self.results = probe, where, error, list(results)


def _is_user(path: str) -> bool:
    p = Path(path).resolve()
    return not (p.is_relative_to(PACKAGE) or any(p.is_relative_to(lib) for lib in LIBRARIES)
                or path.startswith("<"))


def library_raised(err: BaseException) -> bool:
    """No frame of the user's own code in ``err``'s traceback: a library raised on the state
    it was left in (the user's code that left it so has returned)."""
    frames = traceback.extract_tb(err.__traceback__)
    return not any(_is_user(f.filename) for f in frames)


def where_raised(err: BaseException) -> str:
    """``qualname (file:line)`` of the innermost frame of user code in ``err``'s traceback;
    the raising frame itself when no frame is the user's."""
    frames = traceback.extract_tb(err.__traceback__)
    user = [f for f in frames if _is_user(f.filename)]
    frame = (user or frames)[-1] if frames else None
    if frame is None:
        return "(unknown)"
    name = getattr(frame, "name", "?")
    code = _qualname(err, frame)
    return f"{code or name} ({Path(frame.filename).name}:{frame.lineno})"


def _qualname(err: BaseException, frame: traceback.FrameSummary) -> str | None:
    # the frame's qualified name (``SpiralMLP.training_step``), from the live traceback
    tb = err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == frame.filename and tb.tb_lineno == frame.lineno:
            return getattr(code, "co_qualname", code.co_name)
        tb = tb.tb_next
    return None


def one_line(err: BaseException) -> str:
    """``Type: message`` on one line, at most 300 characters."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}"[:300] if text else type(err).__name__


def load(path: str, key: str, allowed: str) -> Any:
    """The object at ``path`` (``package.module.name``, or ``file.py:name``) for the setting
    ``key``: the user's loop, imported here so that its file's mistakes are one line.

    Raises:
        ConfigError: it does not import: a syntax error (its file:line), an import that
            fails inside the user's file (file:line), a module or name that does not exist
            (``allowed`` says what may be given; exit 2).
        LoopRaised: the user's module raised something else while it was imported (exit 3).
    """
    head = f"{key}={path!r} is invalid"
    try:
        if path.endswith(".py") or ".py:" in path:
            return _from_file(path)
        return locate(path)
    except SyntaxError as err:
        at = f"{Path(err.filename).name}:{err.lineno}" if err.filename else "its file"
        raise ConfigError(f"{head}: {at}: SyntaxError: {err.msg}") from None
    except (ImportError, AttributeError) as err:
        user = [f for f in traceback.extract_tb(err.__traceback__) if _is_user(f.filename)]
        if user:
            raise ConfigError(f"{head}: {where_raised(err)}: {one_line(err)}") from None
        raise ConfigError(f"{head}: it does not import ({one_line(err)}); allowed values are "
                          f"{allowed}") from None
    except Exception as err:
        raise LoopRaised(probe=f"importing {key}", where=where_raised(err),
                         error=one_line(err), results=[]) from err


def _from_file(path: str) -> Any:
    # ``file.py:name`` (``name`` defaults to train_step): the file run as a module
    import importlib.util
    import sys

    file, _, name = path.partition(":")
    where = Path(file).resolve()
    if not where.is_file():
        raise ImportError(f"no file {file}")
    spec = importlib.util.spec_from_file_location(where.stem, where)
    if spec is None or spec.loader is None:
        raise ImportError(f"{file} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(where.stem, module)
    spec.loader.exec_module(module)
    return getattr(module, name or "train_step")
