"""The report cites a failed ``stability check`` of the study's task (docs/check.md).

A check run (kind ``check``, docs/TRACKING.md) carries the task's own params (``task._target_``,
``task.<key>``), as every training run does. A study's task is each distinct set of those params
among its runs. When a check of that task failed, the stability section says so, with the
failed probes' measured numbers and the run id: a study of a trainer whose mechanics are broken
measured the bug.

Which check speaks (issue 46, item 13): anyone can log a check run, so only those the sweep's
own MLflow user created count (``user_id``, searched by the store: another user's flood cannot
push them out of the ``NEWEST`` read), the user's failed ones are searched on their own too
(a flood of passes cannot push a failure out), and the newest failure within ``WINDOW_MS`` of
the task's newest check wins over a pass: a pass planted after a real failure does not hide it.

Everything read from the check runs is data: strings are kept to one inert line (``inert.inert``),
numbers must parse, and a run that does not read is left out (it never stops the report).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from stability.report.evidence.inert import inert
from stability.tracking.contract import CHECK_PREFIX, Kind, Tag, search_filter
from stability.tracking.queries import search_all

log = logging.getLogger(__name__)

FAIL = "fail"  # a probe's status, and stability.check_outcome
WINDOW_MS = 7 * 24 * 3600 * 1000  # a failure this much older than the task's newest check is over
NEWEST = 200  # check runs read, newest first: enough for every task of an experiment
SHOWN = 4  # failed probes named in the line (the run has them all)


@dataclass(frozen=True)
class CheckRun:
    """One check run as the report reads it.

    Attributes:
        run_id: the MLflow run id.
        task: its ``task.*`` params (cleaned).
        failed: the failed probes and their measured numbers (NaN when not logged).
        start_time: ms since the epoch (the newest check of a task speaks for it).
    """

    run_id: str
    task: Mapping[str, str]
    failed: Sequence[tuple[str, float]]
    start_time: int


def _clean(value: object) -> str:
    return inert("".join(ch if ch.isprintable() else " " for ch in str(value)))[:200]


def task_params(params: Mapping[str, object]) -> dict[str, str]:
    """The ``task.*`` entries of a run's params (a row of the runs table), cleaned."""
    return {k: _clean(v) for k, v in params.items() if isinstance(k, str)
            and k.startswith("task.") and not (isinstance(v, float) and math.isnan(v))}


def read(run: Any) -> CheckRun:
    """A check run from an MLflow ``Run`` (raises on what does not read)."""
    params, metrics = run.data.params, run.data.metrics
    failed = []
    for key, status in sorted(params.items()):
        if key.startswith(CHECK_PREFIX) and status == FAIL:
            value = metrics.get(key, math.nan)
            failed.append((_clean(key[len(CHECK_PREFIX):]), float(value)))
    return CheckRun(run_id=_clean(run.info.run_id), task=task_params(params), failed=tuple(failed),
                    start_time=int(run.info.start_time or 0))


def _quotable(user: str) -> bool:
    return bool(user) and all(ch.isprintable() and ch not in "'\"\\`" for ch in user)


def fetch(c: Any, experiment_id: str, user: str | None = None) -> list[CheckRun]:
    """The experiment's check runs (newest first), ``user``'s only when given (their
    ``NEWEST`` newest and ``NEWEST`` newest failed); none when the store cannot say."""
    base = search_filter(Kind.CHECK)
    if user is not None:
        if not _quotable(user):  # a user name a filter cannot quote: nobody's runs
            log.warning("check runs not read: the sweep's user %r is not a plain name",
                        _clean(user))
            return []
        base += f" and attributes.user_id = '{user}'"
    try:
        found = {r.info.run_id: r for query in (base, f"{base} and tags.`{Tag.CHECK_OUTCOME}` "
                                                      f"= '{FAIL}'")
                 for r in search_all(c, experiment_id, query, ["attributes.start_time DESC"],
                                     NEWEST)}
    except Exception as err:  # the report stands without the check runs
        log.warning("check runs not read: %s", type(err).__name__)
        return []
    out = []
    for run in sorted(found.values(), key=lambda r: -(r.info.start_time or 0)):
        try:
            out.append(read(run))
        except (TypeError, ValueError, OverflowError, AttributeError) as err:
            log.warning("check run %s is unreadable: %s", run.info.run_id, err)
    return out


def cited(runs: pd.DataFrame, checks: Sequence[CheckRun]) -> list[str]:
    """One Markdown list line per task of ``runs`` whose newest check failed.

    Args:
        runs: the study's training runs (a row each; ``task.*`` columns).
        checks: the experiment's check runs (any order).
    """
    columns = [c for c in runs.columns if isinstance(c, str) and c.startswith("task.")]
    tasks = {tuple(sorted(task_params(row).items()))
             for row in runs[columns].to_dict("records")} if columns else set()
    lines = []
    for task in sorted(tasks):
        same = [c for c in checks if tuple(sorted(c.task.items())) == task]
        if not same:
            continue
        last = max(c.start_time for c in same)
        failed = [c for c in same if c.failed and c.start_time >= last - WINDOW_MS]
        if not failed:
            continue
        newest = max(failed, key=lambda c: c.start_time)
        probes = "; ".join(f"{name}: {_number(value)}" for name, value in newest.failed[:SHOWN])
        more = len(newest.failed) - SHOWN
        lines.append(f"- `stability check` failed on this task ({probes}"
                     + (f"; {more} more" if more > 0 else "") + f"): check run "
                     f"`{newest.run_id}`. The study measured a trainer whose mechanics fail "
                     "that probe (docs/check.md).")
    return lines


def _number(value: float) -> str:
    return "not measured" if math.isnan(value) else f"{value:.3g}"


def lines(c: Any, experiment_id: str, runs: pd.DataFrame,
          parent_run_id: str | None = None) -> list[str]:
    """``cited`` over the experiment's check runs (what the report's stability section adds):
    those the sweep's own user created, given its parent run (a sweep without one: all)."""
    user = None
    if parent_run_id:
        try:
            user = str(c.get_run(parent_run_id).info.user_id or "")
        except Exception as err:  # the report stands without the check runs
            log.warning("check runs not read: %s", type(err).__name__)
            return []
    return cited(runs, fetch(c, experiment_id, user))

