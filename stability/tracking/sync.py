"""Upload what MLflow lacks of a run folder: ``stability sync`` / ``experiments/sync.py``.

A run folder's journal (``tracking.jsonl``) and ``steps.csv`` hold everything its run puts into
MLflow. A sync replays them into the same MLflow run (creating it if it never reached the
server) and skips what the server already has: params by key, metric points by (key, step)
(MLflow appends metric points, so comparing step indices is what prevents duplicates),
artifacts by path and size. Any number of syncs leave one point per step. Every call is
retried like the run's own sender (a locked SQLite database included).
"""

from __future__ import annotations

import argparse
import csv
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stability.core import rundir
from stability.tracking import journal
from stability.tracking.artifacts import upload_artifacts
from stability.tracking.buffer import MAX_PARAMS, MAX_TAGS, Point, retry_call, send_metrics
from stability.tracking.contract import STEP_METRICS, Tag
from stability.tracking.queries import metric_steps
from stability.tracking.uri import (
    TrackingError,
    client,
    configure_http,
    ensure_experiment,
    is_http,
    reachable_now,
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

    def line(self) -> str:
        """One line for the terminal."""
        what = "created" if self.created else "updated"
        return (f"synced {self.folder}: run {self.run_id} {what}, {self.points} points, "
                f"{self.params} params, {len(self.artifacts)} artifacts, "
                f"status {self.status or 'unchanged'}")


def step_points(folder: Path, replay: journal.Replay) -> Iterator[Point]:
    """One point per ``steps.csv`` row for every per-step metric (dated by its epoch's end)."""
    path = folder / rundir.CSV_NAME
    if not path.exists():
        return
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if not row.get("step"):
                continue
            ts = replay.epoch_ts.get(int(row["epoch"]), replay.start_ms)
            for key in STEP_METRICS:
                yield key, float(row[key]), int(row["step"]), ts


def _find_run(c: Any, run_id: str | None) -> Any:
    if not run_id:
        return None
    try:
        return c.get_run(run_id)
    except Exception as err:
        if getattr(err, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def sync_folder(folder: str | Path, uri: str | None = None,
                retry_s: float = SYNC_RETRY_S) -> SyncResult:
    """Make MLflow hold everything ``folder``'s journal and CSV hold; returns what was sent.

    Args:
        folder: a run folder (has ``tracking.jsonl``).
        uri: the tracking URI (default: the one the run was started with).
        retry_s: how long each call is retried while the store does not answer.

    Raises:
        SyncError: ``folder`` has no journal.
        TrackingError: the HTTP server does not answer.
    """
    folder = Path(folder)
    r = journal.read(folder)
    if r is None:
        raise SyncError(f"{folder} is not a tracked run folder (no {rundir.JOURNAL_NAME})")
    uri = uri or r.uri
    if is_http(uri) and not reachable_now(uri):
        raise TrackingError(f"tracking server {uri} is not reachable; {folder} stays pending")

    def call(fn: Any) -> Any:
        return retry_call(fn, retry_s)

    c = call(lambda: client(uri))
    from mlflow.entities import Param, RunTag  # after client(): it imports MLflow (lean)

    run = call(lambda: _find_run(c, r.run_id))
    result = SyncResult(folder, "")
    if run is None:
        exp_id = call(lambda: ensure_experiment(uri, r.experiment, check=False))
        run = call(lambda: c.create_run(exp_id, start_time=r.start_ms or None, tags=r.tags,
                                        run_name=r.run_name))
        journal.append(folder, "run_id", run_id=run.info.run_id)
        result.created = True
    rid = result.run_id = run.info.run_id

    params = [Param(k, v) for k, v in r.params.items() if k not in run.data.params]
    for i in range(0, len(params), MAX_PARAMS):
        call(lambda b=params[i : i + MAX_PARAMS]: c.log_batch(rid, params=b, synchronous=True))
    result.params = len(params)
    tags = [RunTag(k, v) for k, v in r.tags.items()
            if k not in NOT_SYNCED_TAGS and run.data.tags.get(k) != v]
    for i in range(0, len(tags), MAX_TAGS):
        call(lambda b=tags[i : i + MAX_TAGS]: c.log_batch(rid, tags=b, synchronous=True))

    points, seen = [], set()
    for p in (*step_points(folder, r), *r.metrics):
        if (p[0], p[2]) not in seen:  # a resumed run journals a replayed epoch twice
            seen.add((p[0], p[2]))
            points.append(p)
    known = call(lambda: metric_steps(c, rid, sorted({p[0] for p in points})))
    todo = [p for p in points if p[2] not in known.get(p[0], ())]
    call(lambda: send_metrics(c, rid, todo))  # a resend of identical points is de-duplicated
    result.points = len(todo)

    if r.status is not None:
        result.artifacts = call(lambda: upload_artifacts(c, rid, folder))
        if run.info.status != r.status or result.created:
            call(lambda: c.set_terminated(rid, status=r.status, end_time=r.end_ms))
        result.status = r.status
        journal.clear_pending(folder)
    return result


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


def sync_paths(paths: Iterable[str | Path], uri: str | None = None,
               end_stale: bool = True) -> list[SyncResult]:
    """Sync every pending run folder under ``paths``; then end stale RUNNING runs.

    A folder that cannot be synced now (server away) stays pending and is reported in the
    log; the others go on.

    Args:
        paths: run folders or folders above them (a sweep folder, ``multirun/``).
        uri: the tracking URI (default: each run's own).
        end_stale: also end RUNNING runs of the synced experiments whose heartbeat is stale.

    Returns:
        One result per folder synced.
    """
    from stability.tracking.orphans import end_stale_runs

    results, stores = [], set()
    for folder in pending_folders(paths):
        try:
            res = sync_folder(folder, uri)
        except Exception as err:
            log.error("not synced, stays pending: %s: %s", folder, err)
            continue
        results.append(res)
        r = journal.read(folder)
        if r is not None:
            stores.add((uri or r.uri, r.experiment))
    for store, experiment in sorted(stores) if end_stale else ():
        end_stale_runs(store, experiment)
    return results


def main(argv: list[str] | None = None) -> int:
    """``stability sync`` / ``python experiments/sync.py [PATH ...] [--uri URI]``.

    Syncs the paths given (default: the current folder) and prints one line per run and a
    count. Returns the exit status: 1 if any folder stays pending, else 0.
    """
    parser = argparse.ArgumentParser(prog="stability sync",
                                     description="Upload run folders kept locally while the "
                                                 "tracking server was away.")
    parser.add_argument("paths", nargs="*", default=["."], help="run folders or folders above")
    parser.add_argument("--uri", default=None, help="tracking URI (default: each run's own)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    configure_http(REQUEST_TIMEOUT_S)
    wanted = pending_folders(args.paths)
    results = sync_paths(args.paths, args.uri)
    for r in results:
        print(r.line())
    left = len(wanted) - len(results)
    print(f"synced {len(results)} of {len(wanted)} pending runs" + (f"; {left} stay pending"
                                                                     if left else ""))
    return 1 if left else 0
