"""Ending runs whose process died: a RUNNING run with a stale heartbeat is KILLED.

MLflow leaves a run RUNNING when its process is SIGKILLed, OOM-killed or its node is lost.
Every tracked run refreshes ``stability.heartbeat`` from its sender thread and records
``stability.process`` (``<host>:<pid>``). A RUNNING run is stale when its heartbeat is older
than ``tracking.stale_after_s``, or at once when its process ran on this host and is gone.
Before it is ended, what its folder holds is synced (``sync.sync_folder``: this module builds
on the sync, never the other way round), only when that folder lies under the caller's own
roots (the sweep's folder, the paths given to ``stability sync``: ``folders.tagged_folder``)
and its journal names that run: a tag naming any other folder is ignored, and the run is just
ended.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from stability.tracking.artifacts import upload_artifacts
from stability.tracking.contract import Kind, Outcome, Tag, search_filter
from stability.tracking.folders import journal_names, tagged_folder
from stability.tracking.journal import now_ms
from stability.tracking.queries import search_all
from stability.tracking.sync import SyncResult, sync_folder
from stability.tracking.uri import client

log = logging.getLogger(__name__)
STALE_AFTER_S = 600.0  # default bound (tracking.stale_after_s): 20 missed heartbeats
MAX_PID = 4_194_304  # Linux's PID_MAX_LIMIT: a larger pid in a tag is no process
MAX_MS = 253_402_300_799_999  # 9999-12-31 23:59:59.999 UTC: a later heartbeat is no time


def process_gone(tag: str) -> bool:
    """The ``<host>:<pid>`` process ran on this host and has exited (or is a zombie)."""
    host, _, pid = tag.rpartition(":")
    # a tag is data: only a plain pid of this host is looked up (0 or one over the kernel's
    # limit would be another process group or an OverflowError)
    if host != socket.gethostname() or not (pid.isascii() and pid.isdigit()) \
            or len(pid) > len(str(MAX_PID)) or not 0 < int(pid) <= MAX_PID:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: alive, another user's
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state == "Z"


def closing_outcome(status: str, scheduler_killed: bool, interrupted: bool) -> Outcome | None:
    """What a sweep parent ends a run of its own with; None: leave it (one writer decides).

    The run's own process writes its end state (KILLED on SIGTERM / Ctrl-C); the parent only
    closes what is still open, and a run already terminal is never overwritten. A run whose
    job the scheduler stopped (``scancel``, preemption, time limit) or whose sweep was
    interrupted is KILLED, exactly what the run itself writes on the SIGTERM it got, so the
    end state is the same whichever of the two writes lands last.

    Args:
        status: the run's MLflow status, read just before closing.
        scheduler_killed: its job's scheduler state says it was stopped from outside.
        interrupted: the sweep itself was interrupted (Ctrl-C / SIGTERM).
    """
    if status not in ("RUNNING", "SCHEDULED"):
        return None
    return Outcome.KILLED if scheduler_killed or interrupted else Outcome.FAILED


def heartbeat_of(run: Any) -> int:
    """A run's last heartbeat (ms since the epoch); its start time when its
    ``stability.heartbeat`` tag is not a time (absent, not an integer, before the epoch or
    after ``MAX_MS``): a tag is data, one bad run must not stop a sweep."""
    for value in (run.data.tags.get(Tag.HEARTBEAT), run.info.start_time):
        try:
            ms = int(str(value))
        except (TypeError, ValueError):
            continue
        if 0 <= ms <= MAX_MS:
            return ms
    return 0


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def stale_reason(run: Any, stale_after_s: float, now: int | None = None) -> str:
    """Why ``run`` (RUNNING) counts as dead, or "" while it looks alive."""
    tags = run.data.tags
    beat = heartbeat_of(run)
    since = f"no heartbeat since {_when(beat)}"
    if process_gone(tags.get(Tag.PROCESS, "")):
        return f"{since} (process {tags[Tag.PROCESS]} has exited)"
    if (now or now_ms()) - beat > stale_after_s * 1000:
        return f"{since} (more than {stale_after_s:g}s)"
    return ""


def end_stale_runs(uri: str, experiment: str, stale_after_s: float = STALE_AFTER_S,
                   sweep_id: str | None = None, roots: Sequence[str | Path] = ()) -> int:
    """End the experiment's stale RUNNING training and sweep runs as KILLED; returns how many.

    A sweep's parent run carries the same heartbeat and process tags (``parent.Heartbeat``);
    one whose sweep was SIGKILLed is ended here by the next sweep or sync, like its runs.

    Args:
        uri: the tracking URI.
        experiment: the experiment name.
        stale_after_s: a heartbeat older than this means the process is gone.
        sweep_id: only runs of this sweep.
        roots: the caller's own folders: a run's folder is synced or uploaded only when it
            lies under one of them (none: no folder is touched, the runs are only ended).
    """
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return 0
    ended = end_stale_sweeps(c, exp.experiment_id, stale_after_s, sweep_id)
    for run in search_all(c, exp.experiment_id, search_filter(Kind.TRAIN, sweep_id, "RUNNING")):
        reason = stale_reason(run, stale_after_s)
        if not reason:
            continue
        rid = run.info.run_id
        folder = tagged_folder(run, roots, "uploading from")
        try:
            # What it had not sent; a journal that recorded its end (the process died while
            # delivering it) ends the run as it really ended. Only the run's own folder: the
            # folder may hold another run by now (a new run moved this one's files aside),
            # or the tag may name someone else's.
            if folder is not None and journal_names(folder, rid):
                if sync_folder(folder, uri).status is not None:
                    log.warning("completed run %s from its folder %s", rid, folder)
                    continue
                upload_artifacts(c, rid, folder)
        except Exception as err:  # the run is ended regardless: its folder keeps the rest
            log.warning("could not upload %s for stale run %s: %s", folder, rid, err)
        c.set_tag(rid, Tag.OUTCOME, Outcome.KILLED)
        c.set_tag(rid, Tag.REASON, reason)
        c.set_terminated(rid, status=Outcome.KILLED.status)
        log.warning("ended run %s as KILLED: %s", rid, reason)
        ended += 1
    return ended


def end_stale_sweeps(c: Any, experiment_id: str, stale_after_s: float,
                     sweep_id: str | None = None) -> int:
    """End stale RUNNING sweep parent runs as KILLED (their sweep process is gone)."""
    ended = 0
    for run in search_all(c, experiment_id, search_filter(Kind.SWEEP, sweep_id, "RUNNING")):
        reason = stale_reason(run, stale_after_s)
        if not reason:
            continue
        rid = run.info.run_id
        c.set_tag(rid, Tag.OUTCOME, Outcome.KILLED)
        c.set_tag(rid, Tag.REASON, f"the sweep process ended without closing its run: {reason}")
        c.set_terminated(rid, status=Outcome.KILLED.status)
        log.warning("ended sweep run %s as KILLED: %s", rid, reason)
        ended += 1
    return ended


def end_stale_after_sync(results: Iterable[SyncResult],
                         roots: Sequence[str | Path] = ()) -> int:
    """End the stale RUNNING runs of every experiment ``results`` synced into; how many.

    What ``stability sync`` does once the pending folders are uploaded: a run whose folder was
    synced is complete, the ones still RUNNING without heartbeat are dead. ``roots``: the
    paths the sync was given (a stale run's folder elsewhere is not touched).
    """
    stores = sorted({(r.uri, r.experiment) for r in results})
    return sum(end_stale_runs(store, experiment, roots=roots) for store, experiment in stores)
