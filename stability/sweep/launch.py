"""Handing a sweep's jobs to the launcher: streamed through the worker pool, or in batches.

Either way the status display (``display.Display``) is updated as results arrive, a failed
job is logged and counted (never raised), and ``Watch.started`` collects the positions of jobs
that ran, for the parent run's ``runs_launched``. Streamed, a job's start is its pool start
mark; in batches, every job of a batch starts with it.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher

from stability.core.signals import StopRequest
from stability.sweep.display import Display
from stability.sweep.grid import chunks

log = logging.getLogger(__name__)


def job_ok(result: JobReturn) -> bool:
    """A job finished training: it completed and returned a finite validation loss."""
    value = result._return_value  # .return_value would re-raise a failed job's exception
    return (result.status == JobStatus.COMPLETED and isinstance(value, int | float)
            and math.isfinite(value))


def value(result: JobReturn) -> float | None:
    """The job's best validation loss, None when it did not finish training."""
    return float(result._return_value) if job_ok(result) else None


def _log_failure(result: JobReturn) -> None:
    if result.status == JobStatus.FAILED:  # the job's own log has the traceback
        log.error("job failed, the sweep goes on: %s: %r", " ".join(result.overrides or ()),
                  result._return_value)


@dataclass(frozen=True)
class Watch:
    """What a launch updates as a round's jobs start and end (positions in launch order).

    Attributes:
        display: the status area, told each job's start and end.
        started: receives the position of every job that ran.
        ended: receives each job's ``JobReturn`` by position, as it ends.
    """

    display: Display
    started: set[int]
    ended: dict[int, JobReturn]


def stream(launcher: Launcher, jobs: list[list[str]], offset: int, state_dir: Path,
           watch: Watch) -> None:
    """Every job through ``launcher.stream`` (``pool.PoolLauncher``); the display per job.

    Args:
        launcher: a launcher with ``stream``.
        jobs: each job's overrides, in launch order.
        offset: Hydra job number of the first job.
        state_dir: the sweep's pool state folder (stop file, start marks).
        watch: updated as each job ends (the display's ``poll`` reads the start marks).
    """
    for i, result in launcher.stream(jobs, offset, state_dir):  # type: ignore[attr-defined]
        if result is None:  # the sweep was stopped before this job started
            continue
        watch.started.add(i)
        _log_failure(result)
        watch.ended[i] = result
        watch.display.end(i, value(result))


def poll_marks(display: Display, state_dir: Path, offset: int, n: int) -> None:
    """Tell the display which jobs a worker took since (``pool.start_marks``)."""
    from stability.sweep.pool import start_marks

    try:
        marks = start_marks(state_dir)
    except FileNotFoundError:  # the sweep is over, its state folder gone
        return
    for number, at in marks.items():
        if 0 <= number - offset < n:
            display.progress.start(number - offset, at)


def batches(launcher: Launcher, jobs: list[list[str]], costs: list[float], offset: int,
            size: int, stop: StopRequest, watch: Watch) -> None:
    """Batch after batch of ``size`` (0: one batch), for launchers that return at a list's end.

    A batch's results all arrive at its end, so each job's duration is taken as the batch's
    wall time scaled by its expected cost against the batch's longest (``costs``).

    Args:
        launcher: any Hydra launcher (``launch`` returns a batch's results at its end).
        jobs: each job's overrides, in launch order.
        costs: each job's expected cost (``schedule.order``), in the same order.
        offset: Hydra job number of the first job.
        size: jobs per batch (0: one batch).
        stop: the sweep's stop request: no new batch once requested.
        watch: a batch's jobs start with it and end at its end.
    """
    first = 0
    for batch in chunks(jobs, size):
        positions = range(first, first + len(batch))
        watch.started.update(positions)  # before: it may be killed
        t0 = time.time()
        for i in positions:
            watch.display.start(i, t0)
        results = launcher.launch(batch, initial_job_idx=offset + first)
        wall = time.time() - t0
        longest = max(costs[i] for i in positions)
        for i, r in zip(positions, results, strict=False):
            _log_failure(r)
            watch.ended[i] = r
            watch.display.end(i, value(r), duration=wall * costs[i] / longest)
        first += len(batch)
        if stop.requested:
            break
