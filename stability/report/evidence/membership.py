"""Which runs tagged with a sweep's id are the sweep's own: decided by the sweep's record.

A tag is data anyone with write access can set: a copy of a real run logged under a new run id
with a lower loss supersedes the real one as the newer run of its point, and a FAILED run of a
seed the sweep never planned makes its config look unstable. The sweep records on its parent
run the points it planned and the runs its jobs created (``tracking/children.py``). The report
counts a run tagged with the sweep's id only when

- its run id is one the sweep's jobs created (or one the sweep adopted), or
- its ``(fingerprint, seed)`` point is one the sweep planned and none of its own runs is of
  that point (a job whose run id could not be recorded: a sweep killed mid-round).

Every other run is set aside, one line each naming the run, its point, why, and who created it
(MLflow's ``user_id``, the ``mlflow.user`` tag when set). A record that cannot be read, or one
missing from a parent that promised it (``children.RECORD_PARAM``, a param written once when
the sweep began), stops the report (``children.RecordMissing``): deleting or garbling the
record must not turn the sweep back into runs read by their tags. Only a sweep from before
the record existed (no such param) is read by its tags, with a warning line in the output.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from stability.report.evidence.adoption import user_of
from stability.report.evidence.inert import one_line
from stability.tracking import children, origins
from stability.tracking.contract import Artifact, Tag

log = logging.getLogger(__name__)


def _point(run: Any) -> tuple[str, int] | None:
    try:
        return run.data.tags.get(Tag.FINGERPRINT, ""), int(run.data.tags.get(Tag.SEED, ""))
    except (TypeError, ValueError, OverflowError):
        return None


def _line(run: Any, why: str) -> str:
    tags = run.data.tags
    creator = user_of(run) or "no user"
    if run.info.user_id and run.info.user_id != creator:
        creator += f", user_id {run.info.user_id}"
    return one_line(f"run {run.info.run_id} (config {tags.get(Tag.FINGERPRINT, '?')}, seed "
                    f"{tags.get(Tag.SEED, '?')[:20]}, created by {creator}) set aside: {why}")


def own_runs(c: Any, parent_run_id: str | None, runs: Sequence[Any],
             adopted: Iterable[str]) -> tuple[list[Any], list[str]]:
    """The sweep's own runs among ``runs`` and one line per run set aside.

    Args:
        c: an ``MlflowClient``.
        parent_run_id: the sweep's parent run (None: no record, every run is kept).
        runs: the MLflow runs tagged with the sweep's id, and those it adopted.
        adopted: the run ids the sweep adopted (``fetch.adopted_ids``).
    """
    if parent_run_id is None:
        return list(runs), []
    try:
        record = children.read(c, parent_run_id)
    except origins.ForeignArtifacts as err:  # its location is elsewhere: nothing read there
        raise children.RecordMissing(f"{err}; nothing is reported") from None
    except Exception as err:  # the record is there but unreadable: no run is shown to be its
        raise children.RecordMissing(one_line(
            f"the sweep's parent run {parent_run_id} has a {Artifact.SWEEP_RUNS} that cannot be "
            f"read ({str(err)[:200]}): its own runs cannot be told from planted ones; nothing "
            "is reported")) from None
    if record is None:
        if children.promised(c.get_run(parent_run_id).data.params):
            raise children.RecordMissing(
                f"the sweep's parent run {parent_run_id} was created keeping "
                f"{Artifact.SWEEP_RUNS} (param {children.RECORD_PARAM}) and has none now: its "
                "own runs cannot be told from planted ones; nothing is reported")
        log.warning("the sweep's parent run %s keeps no %s (a sweep from before the record "
                    "existed): its runs are taken by their tags", parent_run_id,
                    Artifact.SWEEP_RUNS)
        return list(runs), []
    own = record.launched | set(adopted)
    covered = {_point(r) for r in runs if r.info.run_id in own}
    kept, lines = [], []
    for r in runs:
        point = _point(r)
        if r.info.run_id in own or (point in record.planned and point not in covered):
            kept.append(r)
        elif point not in record.planned:
            lines.append(_line(r, "the sweep never planned this seed of this config"))
        else:
            lines.append(_line(r, "not a run the sweep's jobs created (its own run of this "
                                  "point stands)"))
    for line in lines:
        log.warning("%s", line)
    return kept, lines
