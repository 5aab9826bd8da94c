"""A sweep's tracking and durability: everything the sweep does in MLflow besides its jobs.

Opening (``open_session``): the tracking settings must be one per sweep, credentials are checked
before any run, the parent run is created once (parallel workers initialising a brand-new
SQLite store at the same time crash MLflow's migrations), pending run folders are synced and
runs without heartbeat ended, and the points already FINISHED in the experiment are read.
Per round (``Session.resumable``): a point KILLED earlier trains on from its checkpoint, in its
old folder. Closing (``Session.close``): pending runs synced, runs the jobs left open closed,
the parent run ended with the sweep's summary. Without tracking every step is a no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path

from stability.core.config import ConfigError
from stability.sweep.errors import SweepError
from stability.sweep.grid import SweepPoint, override_key
from stability.sweep.parent import (
    Recorded,
    SweepRun,
    SweepSetup,
    open_sweep_run,
    override,
    recorded_of,
    resumable_folders,
)
from stability.tracking.auth import AuthError, check_credentials, check_no_userinfo
from stability.tracking.origins import ForeignArtifacts
from stability.tracking.queries import finished_runs
from stability.tracking.sync import sync_paths
from stability.tracking.uri import TrackingError, redact_uri, resolve_tracking_uri

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (fingerprint, seed)
# Set by the sweeper on every job; a user's own values for these would be ambiguous.
JOB_TRACKING_KEYS = ("tracking.uri", "tracking.sweep_id", "tracking.parent_run_id")


@dataclass
class Session:
    """The sweep's parent run (None: tracking disabled) and what the experiment already holds."""

    run: SweepRun | None = None
    done: Mapping[Key, Recorded] = field(default_factory=dict)  # FINISHED before this sweep

    def recorded(self) -> dict[Key, Recorded]:
        """What every FINISHED training run of the experiment recorded, read now (a strategy
        that plans from results reads its round's run times; {} without tracking or when the
        store does not answer: the round's losses came back with its jobs)."""
        if self.run is None:
            return {}
        try:
            return recorded_of(finished_runs(self.run.uri, self.run.experiment))
        except Exception as err:  # an outage: plan without run times rather than stop
            log.warning("could not read the round's run times: %s", err)
            return {}

    def tag(self, tags: Mapping[str, str]) -> None:
        """Set tags on the sweep's parent run (what a strategy records for the report)."""
        if self.run is not None and tags:
            from stability.tracking.uri import client

            c = client(self.run.uri)
            for k, v in tags.items():
                c.set_tag(self.run.run_id, k, v)

    def adopt(self, keys: Sequence[Key]) -> None:
        """Record on the parent run the runs of the skipped points ``keys`` (FINISHED before
        this sweep): the sweep's report covers them as if the sweep had run them."""
        if self.run is None:
            return
        try:
            self.run.adopt([self.done[k].run_id for k in keys if k in self.done])
        except Exception as err:  # an outage must not fail the sweep; the next round retries
            log.error("could not record the adopted runs on the parent run %s: %s",
                      self.run.run_id, err)

    def record(self, planned: Sequence[Key] = (), folders: Sequence[Path] = ()) -> None:
        """Record the sweep's planned points and its jobs' runs on the parent run
        (``SweepRun.record``); an outage is logged, the next round writes the whole record."""
        if self.run is None:
            return
        try:
            self.run.record(planned, folders)
        except Exception as err:
            log.error("could not record the sweep's runs on the parent run %s: %s",
                      self.run.run_id, err)

    def resumable(self, todo: Sequence[SweepPoint]) -> dict[Key, Path]:
        """The folder each point of ``todo`` resumes in (its last KILLED run's checkpoint)."""
        return resumable_folders(self.run, todo) if self.run is not None else {}

    def job_overrides(self, point: SweepPoint, resume: Mapping[Key, Path]) -> list[str]:
        """A point's overrides, plus the sweep's tracking and a resumed point's folder."""
        extra = self.run.job_overrides() if self.run else []
        return ([o for o in point.overrides if override_key(o) not in JOB_TRACKING_KEYS] + extra
                + ([override("output_dir", str(resume[point.key]))] if point.key in resume
                   else []))

    def close(self, status: str, summary: Mapping[str, int], job_dirs: Mapping[Key, Path],
              sweep_dir: Path | None, say: Callable[[str], None],
              scheduler_killed: Set[Key] = frozenset()) -> dict[str, int]:
        """Sync, close orphaned runs and end the parent run; returns extra summary counts.

        Never raises: a tracking error is logged, the sweep's own outcome stands.
        """
        if self.run is None:
            return {}
        run = self.run
        try:
            synced = len(sync_paths([sweep_dir], run.uri)) if sweep_dir else 0
            say(f"synced {synced} pending runs of this sweep")
            orphans = run.close_orphans(job_dirs, killed=status == "KILLED",
                                        scheduler_killed=scheduler_killed)
            self.record(folders=list(job_dirs.values()))  # runs a sync created too
            if orphans:
                say(f"closed {orphans} runs their jobs left open (worker killed or crashed)")
            return run.close(status, summary) | {"runs_orphaned": orphans}
        except Exception as err:  # never hide the sweep's own outcome behind a tracking error
            log.error("could not close the sweep's parent run %s: %s", run.run_id, err)
            return {}


def open_session(points: Sequence[SweepPoint], setup: SweepSetup, resume: bool) -> Session:
    """Check the store and open the sweep's parent run (see the module docstring).

    Args:
        points: the first round's points (their tracking settings must agree).
        setup: the sweep's id, grid and folder (its pending runs are synced first).
        resume: skip points already FINISHED in the experiment.

    Raises:
        SweepError: settings that vary within the sweep or bad credentials (exit 2); a store
            that cannot be reached or refuses the sweep (exit 1).
    """
    if not points:
        return Session()
    tracking = points[0].cfg.tracking
    for p in points:
        t = p.cfg.tracking
        if (t.uri, t.experiment, t.enabled) != (tracking.uri, tracking.experiment,
                                                tracking.enabled):
            raise SweepError("tracking.uri, tracking.experiment and tracking.enabled cannot vary "
                             "within a sweep (allowed: one value each)", 2)
    if not tracking.enabled:
        return Session()
    try:  # before any run: a refused password is a user error, not a grid of failed runs
        # A password in tracking.uri would be in Hydra's multirun.yaml and every job's
        # overrides: refused (MLFLOW_TRACKING_USERNAME / _PASSWORD carry credentials).
        check_no_userinfo(tracking.uri or "")
        check_credentials(resolve_tracking_uri(tracking.uri))
    except (AuthError, ConfigError) as err:
        raise SweepError(str(err), 2) from None
    try:
        run, done = open_sweep_run(tracking, setup, len(points), resume,
                                   [p.cfg.task.target for p in points])
    except (TrackingError, ConfigError, ForeignArtifacts) as err:
        raise SweepError(str(err), 1) from None
    except Exception as err:  # e.g. MlflowException: a store that refuses the sweep
        raise SweepError(redact_uri(f"cannot prepare the sweep in tracking store "
                                    f"{tracking.uri or '(default)'}: {type(err).__name__}: "
                                    f"{err}"), 1) from None
    return Session(run, done)
