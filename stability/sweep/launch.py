"""Handing a sweep's jobs to the launcher: streamed through the worker pool, or in batches.

Either way progress is printed as results arrive, a failed job is logged and counted (never
raised), and ``started`` collects the positions of jobs that ran, for the parent run's
``runs_launched``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher

from stability.core.signals import StopRequest
from stability.sweep.grid import chunks
from stability.sweep.progress import Progress

log = logging.getLogger(__name__)


def _say(message: str) -> None:
    print(f"[sweep] {message}", flush=True)


def job_ok(result: JobReturn) -> bool:
    """A job finished training: it completed and returned a finite validation loss."""
    value = result._return_value  # .return_value would re-raise a failed job's exception
    return (result.status == JobStatus.COMPLETED and isinstance(value, int | float)
            and math.isfinite(value))


def _log_failure(result: JobReturn) -> None:
    if result.status == JobStatus.FAILED:  # the job's own log has the traceback
        log.error("job failed, the sweep goes on: %s: %r", " ".join(result.overrides or ()),
                  result._return_value)


def stream(launcher: Launcher, jobs: list[list[str]], costs: list[float], offset: int,
           state_dir: Path, progress: Progress, started: set[int]) -> list[JobReturn]:
    """Every job through ``launcher.stream`` (``pool.PoolLauncher``); progress as each ends.

    Args:
        launcher: a launcher with ``stream``.
        jobs: each job's overrides, in launch order.
        costs: each job's expected cost (``schedule.order``), for the ETA.
        offset: Hydra job number of the first job.
        state_dir: the sweep's pool state folder (stop file, start marks).
        progress: updated and printed per job.
        started: receives the position of every job that ran.
    """
    results = []
    for i, result in launcher.stream(jobs, offset, state_dir):  # type: ignore[attr-defined]
        if result is None:  # the sweep was stopped before this job started
            continue
        started.add(i)
        _log_failure(result)
        progress.update(1, int(not job_ok(result)), costs[i])
        _say(progress.line())
        results.append(result)
    return results


def batches(launcher: Launcher, jobs: list[list[str]], costs: list[float], offset: int,
            size: int, progress: Progress, started: set[int],
            stop: StopRequest) -> list[Sequence[JobReturn]]:
    """Batch after batch of ``size`` (0: one batch), for launchers that return at a list's end.

    Args are those of ``stream``, plus ``size`` and ``stop`` (no new batch once requested).
    """
    returns = []
    first = 0
    for batch in chunks(jobs, size):
        started.update(range(first, first + len(batch)))  # before: it may be killed
        results = launcher.launch(batch, initial_job_idx=offset + first)
        for r in results:
            _log_failure(r)
        progress.update(len(results), sum(not job_ok(r) for r in results),
                        sum(costs[first : first + len(batch)]))
        _say(progress.line())
        returns.append(results)
        first += len(batch)
        if stop.requested:
            break
    return returns
