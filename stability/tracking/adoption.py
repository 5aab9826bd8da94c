"""Whether a FINISHED training run counts as done: it holds what it claims to have trained.

A FINISHED run is a claim anyone with write access to the experiment can make: a run planted
for a point a sweep has not run yet would be skipped as done, and its made-up loss could win
the report. A resumed sweep skips a point (``sweep/parent.py``), and the report counts a run
(``report/evidence/adoption.py``), only if the run's own artifacts back it:

- ``config.yaml`` is plain data that may be built (``trusted.trusted_config``: no
  interpolation, an allow-listed task, PyTorch's own optimizer) and hashes to the run's
  ``stability.fingerprint`` tag;
- ``steps.csv`` is a table of numbers with at least one step; where the run records them,
  its last ``step`` is the ``optimizer_steps`` metric and its last ``loss`` the ``loss``
  metric;
- ``best_val_loss`` is a finite number and, where the run records a ``val_loss`` series, the
  lowest value of it.

Each check reads what the run itself recorded (metrics only where it logged them: a run
tracked by hand with only ``contract.Rebuild`` passes on its config and table). Nothing in a
run picks code: the config is checked as text first, the table parsed as numbers.
"""

from __future__ import annotations

import csv
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stability.core.steplog import CSV_COLUMNS
from stability.tracking import origins
from stability.tracking.contract import WORLD_SIZE_PARAM, Artifact
from stability.tracking.trusted import MAX_CONFIG_BYTES, read_recorded, trusted_config

# steps.csv: ~100 bytes a step, so ~160,000 steps (the default study's runs are ~1,500); the
# report reads such a table whole, up to 8 at a time
MAX_STEPS_BYTES = 16_000_000
# ...and by its shape: StepLog's columns and the writer's epoch (CSV_COLUMNS), which a trainer's
# StepLog subclass extends by a few (scheduler_stepped), plus this allowance. A 2.9 MB table of
# the known columns and 150k more took the report to 951 MB (pandas converts column by column)
MAX_STEPS_COLUMNS = len(CSV_COLUMNS) + 32
REL_TOL = 1e-6  # float32 values written to a CSV and logged as float64 agree to this


class NotBacked(ValueError):
    """A run's artifacts do not back what it records (the message says which and how)."""


def _download(c: Any, run_id: str, artifact_uri: str, name: str, dest: Path) -> Path:
    try:
        dest.mkdir(parents=True, exist_ok=True)
        return origins.download(c, run_id, name, dest, artifact_uri)
    except origins.ForeignArtifacts as err:
        raise NotBacked(str(err)) from None
    except Exception:
        raise NotBacked(f"it has no {name}") from None


def _config(path: Path, fingerprint: str, world_size: int, allowed: Sequence[str]) -> None:
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise NotBacked(f"its {Artifact.CONFIG} is over {MAX_CONFIG_BYTES:,} bytes")
    try:  # plain data, no YAML anchors or aliases (read_recorded), before any walk
        trusted_config(read_recorded(path), fingerprint, allowed, world_size)
    except Exception as err:  # Untrusted, ConfigError, a YAML or UTF-8 error: all data
        raise NotBacked(f"its {Artifact.CONFIG} is refused: "
                        f"{' '.join(str(err).split())[:300]}") from None


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise NotBacked(f"its {Artifact.STEPS_CSV} holds {str(text)[:40]!r} at {where}, "
                        "not a number") from None


def _recorded(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)


def too_wide(path: Path) -> str:
    """Why the table at ``path`` (at most ``MAX_STEPS_BYTES``) is not of our shape ("" when
    no line holds more than ``MAX_STEPS_COLUMNS`` fields), found before any CSV parser runs:
    every comma is counted as a separator (an upper bound: a quoted comma counts too)."""
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if line.count(b",") >= MAX_STEPS_COLUMNS:
                return (f"steps.csv line {n} has {line.count(b',') + 1:,} fields, over the cap "
                        f"of {MAX_STEPS_COLUMNS} (its known columns and "
                        f"{MAX_STEPS_COLUMNS - len(CSV_COLUMNS)} more)")
    return ""


def _steps(path: Path, metrics: Mapping[str, Any]) -> None:
    size = path.stat().st_size
    if size > MAX_STEPS_BYTES:  # before reading: a table is data, its size too
        raise NotBacked(f"its {Artifact.STEPS_CSV} is {size:,} bytes, over the cap of "
                        f"{MAX_STEPS_BYTES:,}")
    wide = too_wide(path)
    if wide:
        raise NotBacked(f"its {wide}")
    rows, last = 0, None
    try:  # streamed: only the last row is kept
        with path.open(newline="", encoding="utf-8") as f:
            for rows, last in enumerate(csv.DictReader(f), 1):  # noqa: B007 - the last one
                pass
    except (UnicodeDecodeError, csv.Error) as err:
        raise NotBacked(f"its {Artifact.STEPS_CSV} cannot be read ({err})") from None
    if last is None or "step" not in last:
        raise NotBacked(f"its {Artifact.STEPS_CSV} holds no step")
    step = _number(last.get("step") or "", f"line {rows + 1}, column step")
    steps = _recorded(metrics, "optimizer_steps")
    if steps is not None and step != steps:
        raise NotBacked(f"its {Artifact.STEPS_CSV} ends at step {step:g}, its optimizer_steps "
                        f"metric says {steps:g}")
    loss = _recorded(metrics, "loss")
    if loss is not None and "loss" in last:
        value = _number(last["loss"] or "", f"line {rows + 1}, column loss")
        if not _close(value, loss):
            raise NotBacked(f"its {Artifact.STEPS_CSV} ends with loss {value:.6g}, its loss "
                            f"metric says {loss:.6g}")


def _best(c: Any, run_id: str, metrics: Mapping[str, Any]) -> None:
    best = _recorded(metrics, "best_val_loss")
    if best is None:
        raise NotBacked("its best_val_loss is not a finite number")
    if _recorded(metrics, "val_loss") is None:
        return  # no val_loss series to compare with (a run tracked by hand)
    values = [m.value for m in c.get_metric_history(run_id, "val_loss")
              if math.isfinite(m.value)]
    if values and not _close(min(values), best):
        raise NotBacked(f"its best_val_loss {best:.6g} is not the lowest of its val_loss "
                        f"series ({min(values):.6g})")


def check(c: Any, run_id: str, artifact_uri: str, fingerprint: str, metrics: Mapping[str, Any],
          allowed: Sequence[str], world_size: int = 1) -> str:
    """Why a FINISHED run does not count as done ("" when its artifacts back it).

    Args:
        c: an ``MlflowClient``.
        run_id: the run.
        artifact_uri: its ``info.artifact_uri`` ("" to look it up).
        fingerprint: its ``stability.fingerprint`` tag.
        metrics: its summary metrics (``data.metrics``).
        allowed: task import paths its config may name (``trusted.allowed_tasks``).
        world_size: its data-parallel ranks (part of its fingerprint above 1).
    """
    try:
        _best(c, run_id, metrics)
        with tempfile.TemporaryDirectory(prefix="stability-adopt-") as tmp:
            _config(_download(c, run_id, artifact_uri, Artifact.CONFIG, Path(tmp) / "c"),
                    fingerprint, world_size, allowed)
            _steps(_download(c, run_id, artifact_uri, Artifact.STEPS_CSV, Path(tmp) / "s"),
                   metrics)
    except NotBacked as err:
        return str(err)
    except Exception as err:  # the store or a download failed: not shown to be backed
        return f"it could not be checked ({type(err).__name__}: {' '.join(str(err).split())[:200]})"
    return ""


def world_size_of(params: Mapping[str, Any]) -> int:
    """A run's ``world_size`` param (1 when absent or not a positive integer)."""
    try:
        return max(1, int(str(params.get(WORLD_SIZE_PARAM, 1))))
    except ValueError:
        return 1
