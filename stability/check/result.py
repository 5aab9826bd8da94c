"""What a probe returns: a status, one measured number, its tolerance and a one-line meaning."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path


class Status(StrEnum):
    """A probe's verdict; ``FAIL`` makes ``stability check`` exit 1."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    NA = "n/a"  # the probe cannot apply to this trainer here; the meaning says why
    ACCEPTED = "accepted"  # a trainer's own known fault, accepted by name (check.accept)


# Exit statuses of ``stability check`` and ``stability.check.loop`` (a CI reads them)
OK, FAILED, BAD_INPUT, RAISED = 0, 1, 2, 3


def not_applicable(name: str, reason: str) -> ProbeResult:
    """A probe that cannot run on this trainer here: ``n/a`` with the reason (never a pass)."""
    return ProbeResult(name=name, status=Status.NA, measured=math.nan, tolerance=math.nan,
                       meaning=f"n/a: {reason}")


@dataclass(frozen=True)
class ProbeResult:
    """One probe's outcome.

    Attributes:
        name: the probe (``accumulation.full``, ``clip.unscaled``...).
        status: pass | warn | fail | n/a.
        measured: the number the verdict is based on.
        tolerance: the bound it was held to (its meaning is in docs/check.md).
        meaning: one line: what was measured, and on a fail what the bug is.
    """

    name: str
    status: Status
    measured: float
    tolerance: float
    meaning: str


def verdict(measured: float, tolerance: float, warn_below: float | None = None) -> Status:
    """``PASS`` when ``measured <= tolerance``; ``WARN`` up to ``warn_below``; else ``FAIL``.

    A non-finite measurement fails.
    """
    if not math.isfinite(measured):
        return Status.FAIL
    if measured <= tolerance:
        return Status.PASS
    return Status.WARN if warn_below is not None and measured <= warn_below else Status.FAIL


def exit_status(results: Sequence[ProbeResult]) -> int:
    """0 when nothing failed (passes, warnings, n/a, accepted), else 1: the check can gate
    CI."""
    return FAILED if any(r.status is Status.FAIL for r in results) else OK


def table(results: Sequence[ProbeResult]) -> str:
    """The terminal table: one row per probe."""
    width = max(len(r.name) for r in results)
    rows = [f"{'probe':<{width}}  status    {'measured':>11}  {'tolerance':>10}  meaning"]
    rows += [f"{r.name:<{width}}  {r.status.value:<8}  {r.measured:>11.4g}  "
             f"{r.tolerance:>10.3g}  {r.meaning}" for r in results]
    return "\n".join(rows)


def write_json(results: Sequence[ProbeResult], path: Path, **meta: object) -> Path:
    """Write the results (and ``meta``: task, seconds; ``exit_status`` and ``error`` when the
    code under check raised) as JSON; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [asdict(r) | {"status": r.status.value} for r in results]
    body = {"exit_status": exit_status(results), **meta, "probes": rows}
    # NaN/inf are not JSON: written as strings so any reader parses the file
    text = json.dumps(body, indent=2, default=str).replace("NaN", '"nan"')
    path.write_text(text.replace("Infinity", '"inf"') + "\n")
    return path
