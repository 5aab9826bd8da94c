"""The sweep's parent run in MLflow: created once before any job, closed with a summary.

Every training run of the sweep is created by its own job with ``mlflow.parentRunId`` set to
this run, so the MLflow UI nests the runs under ``sweep <sweep_id>``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stability.core.config import TrackingConfig
from stability.sweep.schedule import CostKey, observed_costs
from stability.tracking import adoption, children, origins
from stability.tracking.artifacts import upload_artifacts
from stability.tracking.contract import (
    UI_TRAINING_VIEW,
    Artifact,
    Kind,
    Outcome,
    Tag,
    search_filter,
)
from stability.tracking.credentials import has_password
from stability.tracking.folders import journal_names, tagged_folder, under
from stability.tracking.journal import now_ms
from stability.tracking.orphans import closing_outcome, end_stale_runs, process_gone
from stability.tracking.queries import finished_runs, point_of, search_all
from stability.tracking.run import process_tag
from stability.tracking.sync import sync_paths
from stability.tracking.trusted import allowed_tasks
from stability.tracking.uri import (
    check_reachable,
    client,
    configure_http,
    default_store_uri,
    ensure_experiment,
    git_commit,
    redact_uri,
    resolve_tracking_uri,
)

log = logging.getLogger(__name__)

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
# How long the sweep waits for its open runs' own end writes (a run closing itself under load)
ORPHAN_WAIT_S = 20.0


def _quote(value: str) -> str:
    """A quoted Hydra override value: ``:``, ``/``, spaces and ``=`` in a URI survive parsing.

    Inside Hydra quotes only a quote needs escaping (backslashes elsewhere stay literal).
    """
    return "'" + value.replace("'", "\\'") + "'"


def override(key: str, value: str) -> str:
    """A Hydra override ``key='value'`` that survives any characters in ``value``."""
    return f"{key}={_quote(value)}"


@dataclass
class SweepRun:
    """The parent run of one sweep."""

    uri: str
    experiment: str
    experiment_id: str
    run_id: str
    sweep_id: str
    started: float
    synced: int = 0  # pending run folders uploaded before the sweep started
    stale: int = 0  # RUNNING runs without heartbeat ended as KILLED before it started
    # seconds per epoch the experiment's finished runs took, per kind of job (schedule.order)
    costs: dict[CostKey, float] = field(default_factory=dict)
    adopted: set[str] = field(default_factory=set)  # run ids of the points it skipped
    planned: set[tuple[str, int]] = field(default_factory=set)  # points it planned
    launched: set[str] = field(default_factory=set)  # run ids its jobs created
    # hydra.sweep.dir: the only folders its resume and orphan handling act on (folders.py)
    root: Path | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    def beat(self, period_s: float) -> None:
        """Refresh the parent's ``stability.heartbeat`` every ``period_s`` until ``close``.

        A sweep that is SIGKILLed stops beating: the next sweep or sync over the experiment
        then ends its parent KILLED (``orphans.end_stale_sweeps``), as it ends training runs.
        """
        def loop() -> None:
            while not self._stop.wait(period_s):
                try:
                    client(self.uri).set_tag(self.run_id, Tag.HEARTBEAT, str(now_ms()))
                except Exception:  # an outage: the next beat tries again
                    continue

        threading.Thread(target=loop, name="sweep-heartbeat", daemon=True).start()

    def adopt(self, run_ids: Sequence[str]) -> None:
        """Record on the parent run that the sweep's results include these earlier runs.

        A resumed sweep skips points FINISHED before it; their runs keep the sweep id they
        were run under, so the report finds them through ``Artifact.ADOPTED_RUNS`` (the
        whole list, rewritten each round: a sweep killed later still names what it adopted).
        """
        new = {r for r in run_ids if r} - self.adopted
        if new:  # kept only once written: after a failed write the next round writes them
            origins.write_text(client(self.uri), self.run_id,
                               json.dumps(sorted(self.adopted | new)), Artifact.ADOPTED_RUNS)
            self.adopted |= new

    def record(self, planned: Iterable[tuple[str, int]] = (),
               folders: Iterable[Path] = ()) -> None:
        """Record on the parent run the points planned and the runs its jobs created.

        ``planned`` before a round is launched; ``folders`` (the round's job folders, under
        the sweep's own folder) after it: each one's journal names its run. The whole record
        is rewritten when it grew (``tracking/children.py``); the report decides from it.
        """
        planned, launched = set(planned) - self.planned, children.run_ids_of(folders)
        launched -= self.launched
        if planned or launched:  # kept only once written: a failed write is retried next time
            children.write(client(self.uri), self.run_id, self.planned | planned,
                           self.launched | launched)
            self.planned |= planned
            self.launched |= launched

    def job_overrides(self) -> list[str]:
        """What every job of the sweep gets: the same store, sweep id and parent.

        A URI that still holds a password (a database whose driver reads none from the
        environment; it can only have come from ``$MLFLOW_TRACKING_URI``: ``tracking.uri`` with
        one is refused) is not handed on: the jobs, which inherit the environment, resolve it
        there, so no launcher writes it into a job's overrides.
        """
        uri = "null" if has_password(self.uri) else _quote(self.uri)
        return [f"tracking.uri={uri}", f"tracking.sweep_id={self.sweep_id}",
                f"tracking.parent_run_id={self.run_id}"]

    def view_hint(self) -> str:
        """How to look at this sweep in the MLflow UI."""
        uri = redact_uri(self.uri)
        page = f"/#/experiments/{self.experiment_id}{UI_TRAINING_VIEW}"  # on its runs table
        if uri.startswith(("http://", "https://")):
            return f"{uri.rstrip('/')}{page}"
        if uri == default_store_uri():
            return ("stability ui  (in the repository also: make ui), then "
                    f"http://127.0.0.1:5000{page}")
        return f"mlflow ui --backend-store-uri {uri} --workers 1"

    def outcomes(self) -> Counter[str]:
        """``stability.outcome`` of this sweep's training runs (finished, diverged, ...)."""
        return Counter(r.data.tags.get(Tag.OUTCOME, "unknown") for r in self._train_runs())

    def _train_runs(self, status: str | None = None) -> list[Any]:
        return search_all(client(self.uri), self.experiment_id,
                          search_filter(Kind.TRAIN, self.sweep_id, status))

    def close_orphans(self, job_dirs: Mapping[tuple[str, int], Path], killed: bool,
                      scheduler_killed: Set[tuple[str, int]] = frozenset(),
                      wait_s: float = ORPHAN_WAIT_S) -> int:
        """End runs of this sweep still RUNNING: their job died before it could close them.

        A worker SIGKILLed (joblib aborting a batch on Ctrl-C, the OOM killer) leaves its run
        open. Its ``steps.csv`` is complete up to the last step on disk, so whatever the run
        had not uploaded yet is uploaded from the job's folder before the run is ended; only
        from a folder under the sweep's own ``root`` whose journal names that very run (a run
        tagged with this sweep's id by someone else gets nothing from our folders).
        One writer decides (``orphans.closing_outcome``): the parent first waits (at most
        ``wait_s``) for each run's own end write, re-reads a run's status just before closing
        it and never overwrites a terminal one; a run whose job the scheduler stopped
        (``scheduler_killed``) or whose sweep was interrupted ends KILLED, else FAILED.

        Returns:
            How many runs were closed here.
        """
        c = client(self.uri)
        orphans = self._train_runs("RUNNING")
        deadline = time.monotonic() + wait_s
        # a closing run's own write may be on its way; a process known gone writes nothing more
        while (orphans and time.monotonic() < deadline
               and not all(process_gone(r.data.tags.get(Tag.PROCESS, "")) for r in orphans)):
            time.sleep(0.5)
            orphans = [r for r in orphans if c.get_run(r.info.run_id).info.status == "RUNNING"]
        closed = 0
        for r in orphans:
            key = point_of(r) or ("", -1)
            outcome = closing_outcome(c.get_run(r.info.run_id).info.status,
                                      key in scheduler_killed, killed)
            if outcome is None:  # it closed itself meanwhile: its own end state stands
                continue
            roots = [self.root] if self.root is not None else []
            folder = job_dirs.get(key)
            folder = (under(folder, roots) if folder is not None
                      else tagged_folder(r, roots, "uploading from"))
            if folder is not None and journal_names(folder, r.info.run_id):
                upload_artifacts(c, r.info.run_id, folder)
            why = ("its job was stopped by the scheduler" if key in scheduler_killed
                   else "the sweep was interrupted" if killed else "killed or crashed")
            c.set_tag(r.info.run_id, Tag.OUTCOME, outcome)
            c.set_tag(r.info.run_id, Tag.REASON,
                      f"its job's process ended without closing the run ({why})")
            c.set_terminated(r.info.run_id, status=outcome.status)
            closed += 1
        return closed

    def close(self, status: str, summary: Mapping[str, int]) -> dict[str, int]:
        """End the parent run (FINISHED / FAILED / KILLED) with summary metrics.

        Returns:
            The outcome counts read back from the store, e.g. ``{"runs_diverged": 2}``.
        """
        from mlflow.entities import Metric

        self._stop.set()
        c = client(self.uri)
        counts = {f"runs_{k}": v for k, v in sorted(self.outcomes().items())}
        ts = int(time.time() * 1000)
        values = dict(summary) | counts | {"wall_time_s": time.time() - self.started}
        c.log_batch(self.run_id, metrics=[Metric(k, float(v), ts, 0) for k, v in values.items()],
                    synchronous=True)
        c.set_tag(self.run_id, Tag.OUTCOME, status.lower())
        c.set_terminated(self.run_id, status=status)
        return counts


@dataclass(frozen=True)
class SweepSetup:
    """What a sweep is, as its parent run records it (the same for every round).

    Attributes:
        sweep_id: this sweep's id.
        grid_size: grid points before de-duplication.
        arguments: the sweep's command-line overrides (recorded on the parent run).
        grid: every grid and command-line override ``{key: "v1,v2"}`` (recorded as
            ``grid.<key>`` params).
        sweep_dir: the sweep's folder (``hydra.sweep.dir``): its pending runs are synced
            and only its folders are acted on (None: none, nothing synced).
    """

    sweep_id: str
    grid_size: int
    arguments: Sequence[str] = ()
    grid: Mapping[str, str] = field(default_factory=dict)
    sweep_dir: Path | None = None


def open_sweep_run(tracking: TrackingConfig, setup: SweepSetup, unique: int, resume: bool,
                   tasks: Sequence[str] = ()
                   ) -> tuple[SweepRun, Mapping[tuple[str, int], Recorded]]:
    """Check the store, create experiment and parent run; read what is already done.

    Args:
        tracking: the sweep's tracking settings (the same for every point).
        setup: the sweep's id, grid and folder (recorded on the parent run); the folder's
            pending runs are synced first (so a run that finished while the server was away
            counts as done), and RUNNING runs of the experiment without heartbeat are ended
            as KILLED.
        unique: points after de-duplication.
        resume: read the ``(fingerprint, seed)`` already FINISHED (else report none).
        tasks: the sweep's own task import paths: a FINISHED run's config may name one of
            them or a built-in task (``Adoptable``).

    Returns:
        The parent run and the finished points to skip, with what each recorded (a strategy
        that plans from results reads them: ``Recorded``): only those whose run's artifacts
        back it (``Adoptable``).

    Raises:
        TrackingError: an HTTP tracking server does not answer.
        ConfigError: the tracking URI is malformed.
    """
    uri = resolve_tracking_uri(tracking.uri)
    configure_http(tracking.request_timeout_s)
    check_reachable(uri)
    exp_id = ensure_experiment(uri, tracking.experiment)
    sweep_dir, sweep_id = setup.sweep_dir, setup.sweep_id
    synced = len(sync_paths([sweep_dir], uri)) if sweep_dir else 0
    roots = [sweep_dir] if sweep_dir else []
    stale = end_stale_runs(uri, tracking.experiment, tracking.stale_after_s, roots=roots)
    # One read serves resume (what is done) and scheduling (how long each kind of job took).
    finished = finished_runs(uri, tracking.experiment)
    done: Mapping[tuple[str, int], Recorded] = Adoptable(uri, finished, tasks) if resume else {}
    c = client(uri)
    from mlflow.entities import Param  # after client(): it imports MLflow (lean)

    tags = {Tag.KIND: Kind.SWEEP, Tag.SWEEP_ID: sweep_id, Tag.GRID_SIZE: str(setup.grid_size),
            Tag.GRID_UNIQUE: str(unique), Tag.OVERRIDES: redact_uri(" ".join(setup.arguments)),
            Tag.GIT_COMMIT: git_commit(), Tag.OUTCOME: Outcome.RUNNING,
            Tag.PROCESS: process_tag(), Tag.HEARTBEAT: str(now_ms())}
    tags = {k: str(v) for k, v in tags.items()}
    run = c.create_run(exp_id, tags=tags, run_name=f"sweep {sweep_id}")
    grid = [Param("grid." + re.sub(r"[^\w\-. :/]", "_", k), str(v)[:MAX_PARAM_CHARS])
            for k, v in setup.grid.items()]  # MLflow's allowed key characters
    # written once, with the parent: the report then requires the record (children.promised)
    record = Param(children.RECORD_PARAM, Artifact.SWEEP_RUNS)
    c.log_batch(run.info.run_id, params=[record, *grid[:99]], synchronous=True)
    sweep = SweepRun(uri, tracking.experiment, exp_id, run.info.run_id, sweep_id,
                     time.time(), synced, stale, observed_costs(finished), root=sweep_dir)
    sweep.beat(tracking.heartbeat_s)
    return sweep, done


@dataclass(frozen=True)
class Recorded:
    """What a FINISHED training run recorded that a strategy plans with."""

    best_val_loss: float | None
    seconds: float | None  # ``wall_time_s``: one core per run, its training CPU-seconds
    run_id: str = ""  # the run (a resumed sweep adopts it: ``SweepRun.adopt``)


def recorded_of(runs: Sequence[Any]) -> dict[tuple[str, int], Recorded]:
    """``(fingerprint, seed) -> Recorded`` of FINISHED training runs; a point logged more than
    once keeps its newest run (as the report does, ``report.evidence.fetch.fetch_runs``)."""
    out: dict[tuple[str, int], Recorded] = {}
    for r in sorted(runs, key=lambda r: r.info.start_time or 0):
        key = point_of(r)
        if key is not None:
            m = r.data.metrics
            out[key] = Recorded(m.get("best_val_loss"), m.get("wall_time_s"), r.info.run_id)
    return out


class Adoptable(Mapping[tuple[str, int], Recorded]):
    """The FINISHED points a resumed sweep may skip, checked when first asked for.

    A point counts as done only through a run whose artifacts back what it records
    (``tracking.adoption.check``: its config.yaml hashes to its fingerprint, its steps.csv
    agrees with its metrics); of several runs of a point the newest such one stands. A point
    whose runs all fail is not done: one line names each run and why, and the sweep runs
    the point again.
    """

    def __init__(self, uri: str, runs: Sequence[Any], tasks: Sequence[str] = ()) -> None:
        """Args: the store, its FINISHED training runs, the sweep's own task import paths."""
        self._uri = uri
        self._allowed = tuple(dict.fromkeys(t for task in (*tasks, None)
                                            for t in allowed_tasks(task)))
        self._runs: dict[tuple[str, int], list[Any]] = {}
        for r in sorted(runs, key=lambda r: r.info.start_time or 0, reverse=True):
            key = point_of(r)
            if key is not None:
                self._runs.setdefault(key, []).append(r)
        self._checked: dict[tuple[str, int], Recorded | None] = {}

    def _adopted(self, key: tuple[str, int]) -> Recorded | None:
        if key not in self._checked:
            self._checked[key] = None
            runs = self._runs.get(key, [])
            for i, r in enumerate(runs):
                why = adoption.check(client(self._uri), r.info.run_id, r.info.artifact_uri,
                                     key[0], r.data.metrics, self._allowed,
                                     adoption.world_size_of(r.data.params))
                if not why:
                    self._checked[key] = recorded_of([r])[key]
                    break
                log.warning("not adopting FINISHED run %s (config %s, seed %d): %s; %s",
                            r.info.run_id, key[0], key[1], why,
                            "an older run of the point is checked" if i + 1 < len(runs)
                            else "the point runs again")
        return self._checked[key]

    def __getitem__(self, key: tuple[str, int]) -> Recorded:
        found = self._adopted(key) if key in self._runs else None
        if found is None:
            raise KeyError(key)
        return found

    def __contains__(self, key: object) -> bool:
        return key in self._runs and self._adopted(key) is not None  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return (k for k in list(self._runs) if self._adopted(k) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def resumable_folders(run: SweepRun, points: Sequence[Any]) -> dict[tuple[str, int], Path]:
    """For points to run: the folder of their latest KILLED run that holds a resume point.

    Such a point trains on in that folder, into the same MLflow run (``core/checkpoint.py``).
    Only a folder under the sweep's own ``root`` (``hydra.sweep.dir``, real paths): a tag
    naming another folder is ignored with a logged line and the point starts over.
    """
    from stability.core.checkpoint import peek

    wanted = {p.key: p for p in points}
    runs = search_all(client(run.uri), run.experiment_id,
                      search_filter(Kind.TRAIN, status=Outcome.KILLED.status),
                      order_by=["attributes.start_time DESC"])
    found: dict[tuple[str, int], Path] = {}
    roots = [run.root] if run.root is not None else []
    for r in runs:
        key = point_of(r)
        if key not in wanted or key in found:
            continue
        folder = tagged_folder(r, roots, "resuming in")
        if folder is not None and peek(folder, wanted[key].cfg) is not None:
            found[key] = folder
    return found


def next_job_index(sweep_dir: Path) -> int:
    """The first job number free in ``sweep_dir`` (a re-run never overwrites an old folder)."""
    numbers = [int(d.name) for d in sweep_dir.glob("*") if d.is_dir() and d.name.isdigit()]
    return max(numbers, default=-1) + 1
