"""Which of a sweep's runs the report may count, and whose they are.

A FINISHED training run counts as finished only when its artifacts back it
(``tracking.adoption.check``: its config.yaml hashes to its fingerprint, its steps.csv and
val_loss series agree with its metrics); one that does not is an unreadable run, named in the
report's problems with the reason, as a run whose params do not parse is. The report also
names every run that another MLflow user created than the sweep's parent run (``mlflow.user``,
else MLflow's ``user_id``): a teammate's or a planted run among the sweep's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pandas as pd

from stability.report.evidence.inert import one_line
from stability.tracking import adoption, origins
from stability.tracking.contract import Tag

MLFLOW_USER = "mlflow.user"  # the tag MLflow's own clients set to the login name
NAMED_USERS = 10  # runs of another user listed by id; the rest counted


def user_of(run: Any) -> str:
    """Who created an MLflow run, as it recorded it (``mlflow.user``, else ``user_id``)."""
    return str(run.data.tags.get(MLFLOW_USER) or run.info.user_id or "")


def foreign(c: Any, runs: Sequence[Any]) -> dict[str, str]:
    """``{run id: why}`` of the runs whose artifact location is not on the configured store
    (``origins``): MLflow would send the user's credentials there, so nothing of theirs is
    read; each is one unreadable run, never the whole report."""
    out = {}
    for r in runs:
        try:
            origins.run_uri(c, r)
        except origins.ForeignArtifacts as err:
            out[r.info.run_id] = str(err)
    return out


def unbacked(c: Any, runs: Sequence[Any], allowed: Sequence[str],
             workers: int = 8) -> dict[str, str]:
    """``{run id: why}`` of the FINISHED runs among ``runs`` whose artifacts do not back them.

    Args:
        c: an ``MlflowClient``.
        runs: MLflow training runs of the sweep.
        allowed: task import paths a run's config may name (``trusted.allowed_tasks``).
        workers: parallel checks (each reads two artifacts and one metric history).
    """
    todo = [r for r in runs if r.info.status == "FINISHED"]

    def one(r: Any) -> str:
        return adoption.check(c, r.info.run_id, r.info.artifact_uri,
                              r.data.tags.get(Tag.FINGERPRINT, ""), r.data.metrics, allowed,
                              adoption.world_size_of(r.data.params))

    if not todo:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo)))) as pool:
        whys = list(pool.map(one, todo))
    return {r.info.run_id: why for r, why in zip(todo, whys, strict=True) if why}


def other_users(c: Any, parent_run_id: str | None, runs: pd.DataFrame) -> list[str]:
    """One problem line naming the sweep's runs that another MLflow user created (or none).

    The sweep's user is its parent run's; a sweep without one: the user most of its runs
    share. Every name is run data, kept inert as ``fetch`` keeps it.
    """

    if "user" not in runs or runs.empty:
        return []
    if parent_run_id:
        own = one_line(user_of(c.get_run(parent_run_id)))  # as fetch reads the runs' users
    else:
        own = Counter(runs["user"]).most_common(1)[0][0]
    others = runs[runs["user"] != own]
    if others.empty:
        return []
    named = ", ".join(f"{r.run_id} ({r.user or 'no user'})"
                      for r in others.head(NAMED_USERS).itertuples())
    more = f" and {len(others) - NAMED_USERS} more" if len(others) > NAMED_USERS else ""
    return [f"{len(others)} of the sweep's {len(runs)} runs were created by another MLflow user "
            f"than the sweep's ({own or 'no user'}): {named}{more}"]
