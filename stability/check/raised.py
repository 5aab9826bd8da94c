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

from stability.check.result import ProbeResult
from stability.integrations.protocol import NotApplicable

__all__ = ["LoopRaised", "NotApplicable", "one_line", "where_raised"]

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
