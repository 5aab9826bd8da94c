"""The sweep's parent run in MLflow: created once before any job, closed with a summary.

Every training run of the sweep is created by its own job with ``mlflow.parentRunId`` set to
this run, so the MLflow UI nests the runs under ``sweep <sweep_id>``.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stability.core.config import TrackingConfig
from stability.tracking.run import (
    check_reachable,
    client,
    default_store_uri,
    ensure_experiment,
    finished_points,
    git_commit,
    resolve_tracking_uri,
)

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value


def _quote(value: str) -> str:
    """A quoted Hydra override value: ``:``, ``/``, spaces and ``=`` in a URI survive parsing.

    Inside Hydra quotes only a quote needs escaping (backslashes elsewhere stay literal).
    """
    return "'" + value.replace("'", "\\'") + "'"


@dataclass
class SweepRun:
    """The parent run of one sweep."""

    uri: str
    experiment: str
    experiment_id: str
    run_id: str
    sweep_id: str
    started: float

    def job_overrides(self) -> list[str]:
        """What every job of the sweep gets: the same store, sweep id and parent."""
        return [f"tracking.uri={_quote(self.uri)}", f"tracking.sweep_id={self.sweep_id}",
                f"tracking.parent_run_id={self.run_id}"]

    def view_hint(self) -> str:
        """How to look at this sweep in the MLflow UI."""
        if self.uri.startswith(("http://", "https://")):
            return f"{self.uri.rstrip('/')}/#/experiments/{self.experiment_id}"
        if self.uri == default_store_uri():
            return "make ui  (then http://127.0.0.1:5000)"
        return f"mlflow ui --backend-store-uri {self.uri} --workers 1"

    def outcomes(self) -> Counter[str]:
        """``stability.outcome`` of this sweep's training runs (finished, diverged, ...)."""
        return Counter(r.data.tags.get("stability.outcome", "unknown")
                       for r in self._train_runs())

    def _train_runs(self, where: str = "") -> list[Any]:
        c, runs, token = client(self.uri), [], None
        while True:
            page = c.search_runs([self.experiment_id],
                                 filter_string=f"tags.`stability.sweep_id` = '{self.sweep_id}' "
                                               f"and tags.`stability.kind` = 'train'{where}",
                                 max_results=1000, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def close_orphans(self, job_dirs: Mapping[tuple[str, int], Path], killed: bool) -> int:
        """End runs of this sweep still RUNNING: their job died before it could close them.

        A worker SIGKILLed (joblib aborting a batch on Ctrl-C, the OOM killer) leaves its run
        open. Its ``steps.csv`` is complete up to the last step on disk, so whatever the run
        had not uploaded yet is uploaded from the job's folder before the run is ended
        (KILLED when the sweep was interrupted, else FAILED).

        Returns:
            How many runs were closed here.
        """
        from stability.core.loop import CHECKPOINT_NAME, CONFIG_NAME, CSV_NAME

        c = client(self.uri)
        orphans = self._train_runs(" and attributes.status = 'RUNNING'")
        for r in orphans:
            tags = r.data.tags
            folder = job_dirs.get((tags.get("stability.fingerprint", ""),
                                   int(tags.get("stability.seed", -1))))
            uploaded = {a.path for a in c.list_artifacts(r.info.run_id)}
            for name in (CSV_NAME, CONFIG_NAME, CHECKPOINT_NAME) if folder else ():
                path = folder / name
                if path.exists() and name.split("/")[0] not in uploaded:
                    parent = str(Path(name).parent) if "/" in name else None
                    c.log_artifact(r.info.run_id, str(path), artifact_path=parent)
            outcome = "killed" if killed else "failed"
            c.set_tag(r.info.run_id, "stability.outcome", outcome)
            c.set_tag(r.info.run_id, "stability.reason",
                      "its job's process ended without closing the run ("
                      + ("the sweep was interrupted" if killed else "killed or crashed") + ")")
            c.set_terminated(r.info.run_id, status=outcome.upper())
        return len(orphans)

    def close(self, status: str, summary: Mapping[str, int]) -> dict[str, int]:
        """End the parent run (FINISHED / FAILED / KILLED) with summary metrics.

        Returns:
            The outcome counts read back from the store, e.g. ``{"runs_diverged": 2}``.
        """
        from mlflow.entities import Metric

        c = client(self.uri)
        counts = {f"runs_{k}": v for k, v in sorted(self.outcomes().items())}
        ts = int(time.time() * 1000)
        values = dict(summary) | counts | {"wall_time_s": time.time() - self.started}
        c.log_batch(self.run_id, metrics=[Metric(k, float(v), ts, 0) for k, v in values.items()],
                    synchronous=True)
        c.set_tag(self.run_id, "stability.outcome", status.lower())
        c.set_terminated(self.run_id, status=status)
        return counts


def open_sweep_run(tracking: TrackingConfig, sweep_id: str, grid_size: int, unique: int,
                   arguments: Sequence[str], params: Mapping[str, Any],
                   resume: bool) -> tuple[SweepRun, set[tuple[str, int]]]:
    """Check the store, create experiment and parent run; read what is already done.

    Args:
        tracking: the sweep's tracking settings (the same for every point).
        sweep_id: this sweep's id.
        grid_size: points before de-duplication.
        unique: points after de-duplication.
        arguments: the sweep's command-line overrides (recorded on the parent run).
        params: the configured grid ``{key: "v1,v2"}`` (recorded as ``grid.<key>`` params).
        resume: read the ``(fingerprint, seed)`` already FINISHED (else report none).

    Returns:
        The parent run and the finished points to skip.

    Raises:
        TrackingError: an HTTP tracking server does not answer.
        ConfigError: the tracking URI is malformed.
    """
    from mlflow.entities import Param

    uri = resolve_tracking_uri(tracking.uri)
    check_reachable(uri)
    exp_id = ensure_experiment(uri, tracking.experiment)
    done = finished_points(uri, tracking.experiment) if resume else set()
    c = client(uri)
    tags = {"stability.kind": "sweep", "stability.sweep_id": sweep_id,
            "stability.grid_size": str(grid_size), "stability.grid_unique": str(unique),
            "stability.overrides": " ".join(arguments), "stability.git_commit": git_commit(),
            "stability.outcome": "running"}
    run = c.create_run(exp_id, tags=tags, run_name=f"sweep {sweep_id}")
    grid = [Param("grid." + re.sub(r"[^\w\-. :/]", "_", k), str(v)[:MAX_PARAM_CHARS])
            for k, v in params.items()]  # MLflow's allowed key characters
    if grid:
        c.log_batch(run.info.run_id, params=grid[:100], synchronous=True)
    return SweepRun(uri, tracking.experiment, exp_id, run.info.run_id, sweep_id,
                    time.time()), done
