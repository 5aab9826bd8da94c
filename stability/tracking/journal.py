"""The run folder's local record of everything a run puts into MLflow (``tracking.jsonl``).

One JSON object per line, appended and flushed as it happens, exactly like ``steps.csv``
(which stays the record of the per-step metrics: their MLflow names are its column names).
``stability sync`` / ``experiments/sync.py`` replays a journal into MLflow. The format is
documented in ``docs/TRACKING.md``; every line has ``"k"`` (its kind) and ``"ts"`` (ms).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stability.core import rundir
from stability.tracking.contract import Tag

VERSION = 1


def now_ms() -> int:
    """Wall-clock time in milliseconds (MLflow's timestamps)."""
    return int(time.time() * 1000)


class Journal:
    """Appends records to ``<run folder>/tracking.jsonl`` (training thread; local disk only)."""

    def __init__(self, folder: str | Path, append: bool = True) -> None:
        """Args: the run folder; ``append=False`` starts a new journal (a run started over in
        its folder, whose ``steps.csv`` is rewritten too)."""
        self.path = Path(folder) / rundir.JOURNAL_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if append:
            _cut_torn_tail(self.path)
        self._file = self.path.open("a" if append else "w", encoding="utf-8")
        self._lock = threading.Lock()  # the sender thread records the run id it got

    def write(self, kind: str, **fields: Any) -> None:
        """Append one record and flush it to the operating system."""
        line = json.dumps({"k": kind, "ts": now_ms(), **fields}) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(line)
                self._file.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            self._file.close()


def _cut_torn_tail(path: Path) -> None:
    """Drop a last line without its newline (a crash mid-write) before appending after it:
    appended to, it would become a broken line in the middle, which ``read`` refuses."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        f.seek(-1, 2)
        if f.read(1) == b"\n":
            return
        data = f.seek(0) or f.read()
        f.truncate(data.rfind(b"\n") + 1)


@dataclass
class Replay:
    """What a journal says a run holds, folded over its records (later records win)."""

    folder: Path
    run_id: str | None = None
    uri: str = ""
    experiment: str = ""
    run_name: str = ""
    start_ms: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: list[tuple[str, float, int, int]] = field(default_factory=list)
    epoch_ts: dict[int, int] = field(default_factory=dict)  # epoch -> ms (per-step timestamps)
    artifacts: list[str] = field(default_factory=list)
    status: str | None = None  # the final MLflow status; None: the run never ended
    end_ms: int | None = None


def append(folder: str | Path, kind: str, **fields: Any) -> None:
    """Append one record to ``folder``'s journal (a sync noting the run id it created)."""
    j = Journal(folder)
    try:
        j.write(kind, **fields)
    finally:
        j.close()


class JournalError(ValueError):
    """A journal line other than a torn last one cannot be read: nothing is replayed."""


def read(folder: str | Path) -> Replay | None:
    """Fold ``folder``'s journal; None if it has none.

    Only a torn last line (the process died while writing it) is ignored.

    Raises:
        JournalError: any other line is not a record of the documented format; the message
            names the file and the line.
    """
    path = Path(folder) / rundir.JOURNAL_NAME
    if not path.exists():
        return None
    r = Replay(Path(folder))
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise JournalError(f"{path}: not UTF-8 text ({err.reason})") from None
    for lineno, rec in _records(text.split("\n"), path):
        try:
            _fold(r, rec)
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise JournalError(f"{path}:{lineno}: a {rec.get('k')!r} record that cannot be "
                               f"read ({type(err).__name__}: {err})") from None
    return r


def _fold(r: Replay, rec: dict[str, Any]) -> None:
    """Apply one journal record to ``r`` (later records win)."""
    k = rec["k"]
    if k == "run":
        r.run_id = rec.get("run_id") or r.run_id
        r.uri, r.experiment = rec["uri"], rec["experiment"]
        r.run_name, r.start_ms = rec["run_name"], rec["ts"]
        r.tags.update(rec["tags"])
    elif k == "run_id":
        r.run_id = rec["run_id"]
    elif k == "tags":
        r.tags.update(rec["tags"])
    elif k == "params":
        r.params.update(rec["params"])
    elif k == "metrics":
        r.metrics.extend((m[0], float(m[1]), int(m[2]), int(m[3])) for m in rec["metrics"])
    elif k == "epoch":
        r.epoch_ts[int(rec["epoch"])] = rec["ts"]
    elif k == "artifacts":
        r.artifacts.extend(a for a in rec["paths"] if a not in r.artifacts)
    elif k == "end":
        r.status, r.end_ms = rec["status"], rec["ts"]
    elif k == "resume":  # the run goes on: an end record (and its reason) is history
        r.status, r.end_ms = None, None
        r.tags.pop(Tag.REASON, None)


def _records(lines: list[str], path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)``; only the last line may be torn (no newline after it)."""
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if not line.strip() and i == last:
            continue  # the newline after the last whole record
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == last:  # the process died in the middle of this line
                continue
            raise JournalError(f"{path}:{i + 1}: not a JSON record") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("k"), str):
            raise JournalError(f"{path}:{i + 1}: not a journal record")
        yield i + 1, rec


def mark_pending(folder: str | Path, why: str) -> None:
    """Mark the run folder as holding data MLflow lacks (``SYNC_PENDING`` says why)."""
    (Path(folder) / rundir.PENDING_NAME).write_text(why + "\n")


def clear_pending(folder: str | Path) -> None:
    """MLflow holds everything the folder has."""
    (Path(folder) / rundir.PENDING_NAME).unlink(missing_ok=True)


def is_pending(folder: str | Path) -> bool:
    """The folder is marked pending sync."""
    return (Path(folder) / rundir.PENDING_NAME).exists()
