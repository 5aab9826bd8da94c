"""A check as an MLflow run of kind ``check`` (docs/TRACKING.md, "Check run").

The run carries the task's own params (``task._target_``, ``task.<key>``: what the report
matches a study's task on), ``trainer``, ``check.loop`` / ``check.accum_steps``, one param
``check.<probe>`` = its status and one metric ``check.<probe>`` = its measured number (finite
ones), the tag ``stability.check_outcome`` (pass | fail), and the JSON as an artifact. Never a
URI: ``tracking.*`` is not a param, and an error prints the URI redacted.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from stability.check.result import ProbeResult, exit_status
from stability.core.config import RunConfig
from stability.tracking import origins
from stability.tracking.contract import CHECK_PREFIX, Artifact, Kind, Tag
from stability.tracking.record import run_params
from stability.tracking.uri import client, ensure_experiment, git_commit, resolve_tracking_uri

PASS, FAIL = "pass", "fail"  # stability.check_outcome


def check_params(cfg: RunConfig, loop: str, accum_steps: int,
                 results: Sequence[ProbeResult]) -> dict[str, str]:
    """The check run's params: the task's, the trainer, the check's settings, each status."""
    params = {k: v for k, v in run_params(cfg).items()
              if k.startswith("task.") or k == "trainer"}
    params |= {f"{CHECK_PREFIX}loop": loop, f"{CHECK_PREFIX}accum_steps": str(accum_steps)}
    return params | {f"{CHECK_PREFIX}{r.name}": r.status.value for r in results}


def record_check(cfg: RunConfig, loop: str, accum_steps: int, results: Sequence[ProbeResult],
                 json_path: Path, seconds: float) -> str:
    """Log the check as a run of kind ``check`` in ``tracking.experiment``; returns its id."""
    from mlflow.entities import Metric, Param, RunTag

    uri = resolve_tracking_uri(cfg.tracking.uri)
    exp_id = ensure_experiment(uri, cfg.tracking.experiment)
    c = client(uri)
    outcome = FAIL if exit_status(results) else PASS
    tags = {Tag.KIND: Kind.CHECK.value, Tag.CHECK_OUTCOME: outcome, Tag.GIT_COMMIT: git_commit()}
    target = cfg.task.target.rsplit(".", 1)[-1]
    run = c.create_run(exp_id, tags=tags, run_name=f"check {target}")
    run_id = str(run.info.run_id)
    ts = int(time.time() * 1000)
    metrics = [Metric(f"{CHECK_PREFIX}{r.name}", float(r.measured), ts, 0) for r in results
               if math.isfinite(r.measured)]
    metrics.append(Metric(f"{CHECK_PREFIX}seconds", round(seconds, 2), ts, 0))
    params = [Param(k, v) for k, v in check_params(cfg, loop, accum_steps, results).items()]
    for i in range(0, len(params), 100):  # log_batch takes at most 100 params
        c.log_batch(run_id, params=params[i : i + 100])
    c.log_batch(run_id, metrics=metrics, tags=[RunTag(Tag.NOTE, _note(results, outcome))])
    with tempfile.TemporaryDirectory() as tmp:  # the artifact's name is the contract's
        named = Path(tmp) / Artifact.CHECK_JSON
        shutil.copyfile(json_path, named)
        origins.upload(c, run, named)  # to its checked location only
    c.set_terminated(run_id, "FINISHED")
    return run_id


def _note(results: Sequence[ProbeResult], outcome: str) -> str:
    # The run's description in the UI: the failed probes first
    failed = [r for r in results if r.status.value == FAIL]
    head = f"`stability check`: **{outcome}** ({len(failed)} of {len(results)} probes failed)"
    return "\n".join([head, "", *(f"- {r.name}: {r.meaning}" for r in failed)])
