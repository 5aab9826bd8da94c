"""Upload what MLflow lacks of a run folder (``stability sync``, whose edge is ``stability.cli``).

A run folder's journal (``tracking.jsonl``) and ``steps.csv`` hold everything its run puts into
MLflow. A sync replays them into the same MLflow run (creating it if it never reached the
server) and skips what the server already has: params by key, metric points by (key, step)
(MLflow appends metric points, so comparing step indices is what prevents duplicates),
artifacts by path and size. Any number of syncs leave one point per step. Every call is
retried like the run's own sender (a locked SQLite database included).
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stability.core import rundir
from stability.tracking import journal
from stability.tracking.artifacts import missing_artifacts, upload_artifacts
from stability.tracking.buffer import MAX_PARAMS, MAX_TAGS, Point, retry_call, send_metrics
from stability.tracking.contract import STEP_METRICS, Tag
from stability.tracking.queries import metric_steps
from stability.tracking.uri import (
    TrackingError,
    client,
    ensure_experiment,
    is_http,
    reachable_now,
    redact_uri,
    resolve_tracking_uri,
)

log = logging.getLogger(__name__)
SYNC_RETRY_S = 60.0  # per call: a sync rides out a short blip or a busy SQLite database
REQUEST_TIMEOUT_S = 30  # one HTTP request (MLflow's own retries off: every call is retried)
NOT_SYNCED_TAGS = {Tag.HEARTBEAT}  # the journal's copy is older than the server's


class SyncError(RuntimeError):
    """A path given to sync is not a tracked run folder."""


@dataclass
class SyncResult:
    """What one sync of one run folder did."""

    folder: Path
    run_id: str
    created: bool = False  # the run had never reached the server
    points: int = 0  # metric points sent
    params: int = 0  # params sent
    artifacts: list[str] = field(default_factory=list)  # artifact paths uploaded
    status: str | None = None  # the final status set (None: the run had not ended)
    uri: str = ""  # where it went
    experiment: str = ""

    def line(self) -> str:
        """One line for the terminal."""
        what = "created" if self.created else "updated"
        return (f"synced {self.folder}: run {self.run_id} {what}, {self.points} points, "
                f"{self.params} params, {len(self.artifacts)} artifacts, "
                f"status {self.status or 'unchanged'}")


def step_points(folder: Path, replay: journal.Replay) -> list[Point]:
    """One point per ``steps.csv`` row for every per-step metric (dated by its epoch's end).

    Read whole before anything is sent; only a torn last row (a crash mid-write) is skipped.

    Raises:
        SyncError: another row holds a cell that is not a number (names file, line, column).
    """
    path = folder / rundir.CSV_NAME
    if not path.exists():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    points: list[Point] = []
    for i, row in enumerate(rows):
        if not row.get("step"):
            continue
        try:
            ts = replay.epoch_ts.get(int(row["epoch"]), replay.start_ms)
            points += [(key, float(row[key]), int(row["step"]), ts) for key in STEP_METRICS]
        except (TypeError, ValueError) as err:
            if i == len(rows) - 1 and None in row.values():
                break  # torn: the process died while writing the last row
            raise SyncError(f"{path}:{i + 2}: a row that is not numbers ({err}); nothing "
                            "was sent, the folder stays pending") from None
    return points


def read_journal(folder: Path) -> journal.Replay:
    """The folder's journal, folded.

    Raises:
        SyncError: no journal, or a line of it (not a torn last one) cannot be read.
    """
    try:
        r = journal.read(folder)
    except journal.JournalError as err:
        raise SyncError(f"{err}; nothing was sent, the folder stays pending") from None
    if r is None:
        raise SyncError(f"{folder} is not a tracked run folder (no {rundir.JOURNAL_NAME})")
    return r


def check_destination(folder: Path, r: journal.Replay, uri: str) -> None:
    """A sync sends only to the store the user configured, never to one a journal names.

    Raises:
        SyncError: the journal names another store (both shown without credentials).
    """
    if r.uri and redact_uri(r.uri) != redact_uri(uri):
        raise SyncError(f"{folder / rundir.JOURNAL_NAME} names tracking store "
                        f"{redact_uri(r.uri)!r}, not the configured {redact_uri(uri)!r}: "
                        "nothing was sent; to send it there, pass --uri with that store")


def _find_run(c: Any, run_id: str | None) -> Any:
    if not run_id:
        return None
    try:
        return c.get_run(run_id)
    except Exception as err:
        if getattr(err, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


ASIDE_PREFIX = "aside-"  # ``claim.py`` moves a run's records to ``<its folder>/aside-<time>/``


def check_owner(folder: Path, run: Any) -> None:
    """A sync writes only into the run its folder is: the run's own ``stability.output_dir``.

    The journal says which run a folder is, but a journal is a file anyone can hand over:
    the run's record on the server must name this folder (by real path; or the folder is an
    ``aside-*`` folder directly inside it, where a new run moved the old one's records).

    Raises:
        SyncError: the run records no folder, or another one.
    """
    tag = run.data.tags.get(Tag.OUTPUT_DIR, "")
    real = Path(os.path.realpath(folder))
    own = Path(os.path.realpath(tag)) if tag and os.path.isabs(tag) else None
    if own is not None and (real == own or (real.parent == own
                                             and real.name.startswith(ASIDE_PREFIX))):
        return
    recorded = f"records folder {tag[:300]!r}" if tag else "records no folder"
    raise SyncError(f"run {run.info.run_id} {recorded} ({Tag.OUTPUT_DIR}), not {real}: a sync "
                    "writes only into the folder's own run; nothing was sent, the folder stays "
                    "pending")


def sync_folder(folder: str | Path, uri: str | None = None,
                retry_s: float = SYNC_RETRY_S) -> SyncResult:
    """Make MLflow hold everything ``folder``'s journal and CSV hold; returns what was sent.

    Args:
        folder: a run folder (has ``tracking.jsonl``).
        uri: the tracking URI (default: ``$MLFLOW_TRACKING_URI``, else the embedded store of
            the current folder); the journal must name the same store.
        retry_s: how long each call is retried while the store does not answer.

    Raises:
        SyncError: ``folder`` has no journal, a journal or CSV line cannot be read, or the
            journal names another store; nothing is sent then.
        TrackingError: the HTTP server does not answer.
    """
    folder = Path(folder)
    r = read_journal(folder)
    uri = uri or resolve_tracking_uri(None)
    check_destination(folder, r, uri)
    steps = step_points(folder, r)  # read whole (and checked) before anything is sent
    if is_http(uri) and not reachable_now(uri):
        raise TrackingError(f"tracking server {redact_uri(uri)} is not reachable; {folder} "
                            "stays pending")

    def call(fn: Any) -> Any:
        return retry_call(fn, retry_s)

    c = call(lambda: client(uri))
    from mlflow.entities import Param, RunTag  # after client(): it imports MLflow (lean)

    run = call(lambda: _find_run(c, r.run_id))
    if run is not None:
        check_owner(folder, run)
    result = SyncResult(folder, "", uri=uri, experiment=r.experiment)
    have = run.data if run is not None else None
    params = [Param(k, v) for k, v in r.params.items() if have is None or k not in have.params]
    tags = [RunTag(k, v) for k, v in r.tags.items()
            if k not in NOT_SYNCED_TAGS and (have is None or have.tags.get(k) != v)]
    points, seen = [], set()
    for p in (*steps, *r.metrics):
        if (p[0], p[2]) not in seen:  # a resumed run journals a replayed epoch twice
            seen.add((p[0], p[2]))
            points.append(p)
    if run is not None:
        rid = run.info.run_id
        known = call(lambda: metric_steps(c, rid, sorted({p[0] for p in points})))
        points = [p for p in points if p[2] not in known.get(p[0], ())]
        if run.info.status == "FINISHED":
            check_unchanged(folder, run, params, tags, points, r.status,
                            call(lambda: missing_artifacts(c, rid, folder))
                            if r.status is not None else [])
    else:
        exp_id = call(lambda: ensure_experiment(uri, r.experiment, check=False))
        run = call(lambda: c.create_run(exp_id, start_time=r.start_ms or None, tags=r.tags,
                                        run_name=r.run_name))
        journal.append(folder, "run_id", run_id=run.info.run_id)
        result.created = True
    rid = result.run_id = run.info.run_id

    for i in range(0, len(params), MAX_PARAMS):
        call(lambda b=params[i : i + MAX_PARAMS]: c.log_batch(rid, params=b, synchronous=True))
    result.params = len(params)
    if not result.created:  # a created run got them at creation
        for i in range(0, len(tags), MAX_TAGS):
            call(lambda b=tags[i : i + MAX_TAGS]: c.log_batch(rid, tags=b, synchronous=True))
    call(lambda: send_metrics(c, rid, points))  # a resend of identical points is de-duplicated
    result.points = len(points)

    if r.status is not None:
        result.artifacts = call(lambda: upload_artifacts(c, rid, folder))
        if run.info.status != r.status or result.created:
            call(lambda: c.set_terminated(rid, status=r.status, end_time=r.end_ms))
        result.status = r.status
        journal.clear_pending(folder)
    return result


def check_unchanged(folder: Path, run: Any, params: list[Any], tags: list[Any],
                    points: list[Point], status: str | None, artifacts: list[str]) -> None:
    """A FINISHED run is complete: a sync that would change it is refused before any write.

    (A re-sync of a folder MLflow already holds whole writes nothing and passes.)

    Raises:
        SyncError: names what the sync would have changed.
    """
    changes = ([f"{len(params)} params"] if params else []) + (
        [f"tags {', '.join(t.key for t in tags[:3])}"] if tags else []) + (
        [f"{len(points)} metric points"] if points else []) + (
        [f"artifacts {', '.join(artifacts)}"] if artifacts else []) + (
        [f"status {status}"] if status not in (None, "FINISHED") else [])
    if changes:
        raise SyncError(f"run {run.info.run_id} is FINISHED: a sync never changes a finished "
                        f"run (this one would send {'; '.join(changes)}); nothing was sent, "
                        f"{folder} stays pending")


def pending_folders(paths: Iterable[str | Path]) -> list[Path]:
    """Run folders marked pending under (or at) ``paths``, each once, in path order."""
    found: dict[Path, None] = {}
    for p in map(Path, paths):
        if journal.is_pending(p):
            found[p.resolve()] = None
        elif p.is_dir():
            for marker in sorted(p.rglob(rundir.PENDING_NAME)):
                found[marker.parent.resolve()] = None
    return list(found)


def sync_paths(paths: Iterable[str | Path], uri: str | None = None) -> list[SyncResult]:
    """Sync every pending run folder under ``paths``.

    A folder that cannot be synced now (server away) stays pending and is reported in the
    log; the others go on. Ending the synced experiments' stale RUNNING runs afterwards is
    ``orphans.end_stale_after_sync`` (``stability sync`` does both).

    Args:
        paths: run folders or folders above them (a sweep folder, ``multirun/``).
        uri: the tracking URI (default: ``$MLFLOW_TRACKING_URI``, else the embedded store);
            a folder whose journal names another store stays pending (logged).

    Returns:
        One result per folder synced.
    """
    results = []
    for folder in pending_folders(paths):
        try:
            res = sync_folder(folder, uri)
        except Exception as err:
            log.error("not synced, stays pending: %s: %s", folder, redact_uri(str(err)))
            continue
        results.append(res)
    return results
