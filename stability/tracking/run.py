"""``TrackedRun``: one MLflow run around one training run, that survives the network.

Every MLflow call goes through the run's ``Sender`` thread (bounded retries, heartbeat), so
training never waits on the server, not even to create the run. Everything the run puts into
MLflow is also in the run folder (``tracking.jsonl`` + ``steps.csv``). If MLflow still lacks
part of the run at its end, the folder is marked pending and one line says how to upload it
(``stability sync <dir>``); the run's own result is unaffected. What a run records is the
contract in ``docs/TRACKING.md``.

A run is what ``RunRecord`` holds (params, tags, folder, name, where it goes): any training
loop can be tracked. ``run_record`` (or ``TrackedRun.for_config``) is the adapter for our
``RunConfig``; ``contract.Rebuild`` says what a run needs for the report to read it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

from stability.core.config import RunConfig
from stability.core.signals import Terminated, sigterm_as_exception
from stability.tracking import journal
from stability.tracking.artifacts import upload_artifacts
from stability.tracking.buffer import MAX_PARAMS, MetricBuffer, Point, Sender, send_metrics
from stability.tracking.contract import EPOCH_METRICS, STEP_METRICS, Artifact, Outcome, Tag
from stability.tracking.direct import DirectMetrics
from stability.tracking.journal import Journal, now_ms
from stability.tracking.queries import metric_steps

# Re-exported: the run's record is built there, and callers import these names from here.
from stability.tracking.record import (
    RunRecord,
    live_tags,
    process_tag,
    run_params,
    run_record,
    run_tags,
)
from stability.tracking.uri import (
    client,
    configure_http,
    ensure_experiment,
    redact_uri,
    resolve_tracking_uri,
    sqlite_path,
)

__all__ = ["RunRecord", "TrackedRun", "process_tag", "run_params", "run_record", "run_tags",
           "summary_metrics"]

log = logging.getLogger(__name__)
MAX_REASON = 5000  # characters of a reason tag
SETTLE_RETRY_S = 5.0  # the end-of-run sync: the sender has already ridden out the outage


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The numeric summary values (logged as metrics at step 0)."""
    return {k: float(v) for k, v in summary.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


class NotCreated(RuntimeError):
    """The MLflow run was never created (its creation was lost in an outage): not retried."""

    error_code = "RESOURCE_DOES_NOT_EXIST"


class TrackedRun:
    """Use as a context manager; ``sink`` goes to ``train``.

    Built from a ``RunRecord`` (any loop), or from a ``RunConfig`` through ``run_record``
    (``TrackedRun.for_config``; a ``RunConfig`` passed directly is adapted the same way).
    Leaving the block with an exception ends the run FAILED (KILLED on Ctrl-C / SIGTERM) with
    a reason tag, after uploading what exists (the CSV is complete up to the last step).
    A run folder holding a resumable checkpoint continues the MLflow run its journal names.
    """

    # On the embedded SQLite store, metric points go in as rows (``direct.DirectMetrics``);
    # False: through MLflow's ``log_batch`` as on any store (the benchmark compares the two).
    direct_sqlite = True

    def __init__(self, run: RunRecord | RunConfig, overrides: Sequence[str] = (),
                 world_size: int = 1) -> None:
        record = run_record(run, overrides, world_size) if isinstance(run, RunConfig) else run
        self.record = record
        self.uri = resolve_tracking_uri(record.tracking.uri)
        self.folder = Path(record.folder)
        self.run_id: str | None = None
        self.outcome: Outcome | None = None
        self.reason = ""
        self.pending = False  # after the block: MLflow lacks part of the run (folder marked)
        self.sync_hint = ""  # with ``pending``: the command that uploads the rest
        self.resumed = record.resume
        self.sink: MetricBuffer | None = None
        self._client: Any = None
        self._sender: Sender | None = None
        self._journal: Journal | None = None
        self._direct: DirectMetrics | None = None  # the embedded store: rows, not the ORM
        self._known: dict[str, set[int]] = {}  # steps MLflow holds already (a resumed run)
        self._stack = ExitStack()  # the journal
        self._signals = ExitStack()  # SIGTERM as an exception while training

    @classmethod
    def for_config(cls, cfg: RunConfig, overrides: Sequence[str] = (),
                   world_size: int = 1) -> TrackedRun:
        """The tracked run of one of our training runs (``run_record``)."""
        return cls(run_record(cfg, overrides, world_size))

    # -- opening -------------------------------------------------------------------------------
    def __enter__(self) -> TrackedRun:
        t = self.record.tracking
        configure_http(t.request_timeout_s)
        self._journal = self._stack.enter_context(closing(Journal(self.folder,
                                                                  append=bool(self.resumed))))
        if not self.resumed:
            journal.clear_pending(self.folder)  # a run started over: the old marker is void
        previous = journal.read(self.folder) if self.resumed else None
        tags = {k: str(v) for k, v in {**self.record.tags, **live_tags(self.folder)}.items()}
        params = {k: str(v) for k, v in self.record.params.items()}
        self._client = client(self.uri)
        db = sqlite_path(self.uri)
        if db is not None and self.direct_sqlite:
            self._direct = DirectMetrics(db, lambda rid, pts: send_metrics(self._client, rid, pts))
        self._sender = Sender(t.retry_s, heartbeat=self._beat, heartbeat_s=t.heartbeat_s)
        if previous is not None and previous.run_id:
            self.run_id = previous.run_id
            self._journal.write("resume", epoch=self.resumed.epoch, step=self.resumed.step)
            self._journal.write("tags", tags=tags)
            self._sender.submit(lambda: self._reopen(tags), "reopening the run")
        else:
            self._journal.write("run", run_id=None, uri=redact_uri(self.uri),
                                experiment=t.experiment,
                                run_name=self.record.name, tags=tags)
            self._journal.write("params", params=params)
            self._sender.submit(lambda: self._create(tags, params), "creating the run")
        self.sink = MetricBuffer(self._send_points, self._journal, send_params=self._send_params)
        self._signals.enter_context(sigterm_as_exception())
        return self

    def _create(self, tags: dict[str, str], params: dict[str, str]) -> None:
        """Sender thread: create the run (retried like any call) and log its params."""
        from mlflow.entities import Param

        if self.run_id is None:
            exp_id = ensure_experiment(self.uri, self.record.tracking.experiment, check=False)
            run = self._client.create_run(exp_id, tags=tags, run_name=self.record.name)
            self.run_id = run.info.run_id
            self._journal.write("run_id", run_id=self.run_id)
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS):
            self._client.log_batch(self.run_id, params=items[i : i + MAX_PARAMS],
                                   synchronous=True)

    def _send_params(self, params: dict[str, str]) -> None:
        """Params learnt during the run (``MetricBuffer.on_params``), after its creation."""
        from mlflow.entities import Param

        def send() -> None:
            if self.run_id is None:
                raise NotCreated("the run was never created")  # the journal has them: sync
            items = [Param(k, v) for k, v in params.items()]
            for i in range(0, len(items), MAX_PARAMS):
                self._client.log_batch(self.run_id, params=items[i : i + MAX_PARAMS],
                                       synchronous=True)

        assert self._sender is not None
        self._sender.submit(send, "params")

    def _reopen(self, tags: dict[str, str]) -> None:
        """Sender thread: a resumed run continues its MLflow run (RUNNING again)."""
        from mlflow.entities import RunTag

        run = self._client.get_run(self.run_id)
        if Tag.REASON in run.data.tags:  # why the interrupted attempt ended: history now
            self._client.delete_tag(self.run_id, Tag.REASON)
        self._client.update_run(self.run_id, status="RUNNING")
        # The resuming job's sweep id and parent: the run now belongs to the sweep that ends it.
        self._client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()],
                               synchronous=True)
        self._known = metric_steps(self._client, self.run_id, [*STEP_METRICS, *EPOCH_METRICS])

    def _beat(self) -> None:
        if self.run_id is not None:
            self._client.set_tag(self.run_id, Tag.HEARTBEAT, str(now_ms()))

    def _send_points(self, points: list[Point]) -> None:
        def send() -> None:
            if self.run_id is None:
                raise NotCreated("the run was never created")  # counted lost: sync has it
            todo = [p for p in points if p[2] not in self._known.get(p[0], ())]
            if self._direct is not None:
                self._direct.log(self.run_id, todo)
            else:
                send_metrics(self._client, self.run_id, todo)

        assert self._sender is not None
        self._sender.submit(send, f"{len(points)} metric points")

    # -- closing -------------------------------------------------------------------------------
    def finish(self, summary: dict[str, Any], outcome: str, reason: str = "") -> None:
        """Record the summary metrics and the outcome (``finished`` or ``diverged``)."""
        assert self.sink is not None and self._journal is not None
        self.sink.add(summary_metrics(summary))
        tags = {f"stability.{k}": v for k, v in summary.items() if isinstance(v, str) and v}
        if tags:
            self._journal.write("tags", tags=tags)
            self._submit_tags(tags)
        self.outcome, self.reason = Outcome(outcome), reason

    def _submit_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        def send() -> None:
            if self.run_id is None:
                raise NotCreated("the run was never created")
            self._client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()],
                                   synchronous=True)

        assert self._sender is not None
        self._sender.submit(send, "tags")

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        assert self._sender is not None and self._journal is not None and self.sink is not None
        try:
            self._signals.close()  # a second SIGTERM must not cut the close short
            if exc is not None:
                # SystemExit: submitit's requeue on preemption/timeout (the run resumes later)
                killed = isinstance(exc, KeyboardInterrupt | Terminated | SystemExit)
                self.outcome = Outcome.KILLED if killed else Outcome.FAILED
                self.reason = redact_uri(f"{type(exc).__name__}: {exc}")
            outcome = self.outcome or Outcome.FAILED
            self.sink.flush()
            tags = {Tag.OUTCOME: str(outcome)}
            if self.reason:
                tags[Tag.REASON] = self.reason[:MAX_REASON]
            self._journal.write("tags", tags=tags)
            self._journal.write("artifacts", paths=[a for a in Artifact.ALL
                                                    if (self.folder / a).exists()])
            self._journal.write("end", status=outcome.status, outcome=str(outcome))
            self._submit_tags(tags)
            self._sender.submit(lambda: upload_artifacts(self._client, self._created(),
                                                         self.folder), "artifacts")
            self._sender.submit(lambda: self._terminate(outcome), "the final status")
            complete = self._sender.close()
            if self._direct is not None:
                self._direct.close()
            self._settle(complete)
        finally:
            self._stack.close()
        return False

    def _created(self) -> str:
        if self.run_id is None:
            raise NotCreated("the run was never created")
        return self.run_id

    def _terminate(self, outcome: Outcome) -> None:
        if self._sender is not None and self._sender.lost:
            return  # left to the sync below: it uploads the gap first, then ends the run
        self._client.set_terminated(self._created(), status=outcome.status)

    def _settle(self, complete: bool) -> None:
        """After the sender: make MLflow complete (sync the folder) or mark it pending."""
        from stability.tracking.sync import sync_folder

        if complete and not self.resumed:
            return
        try:  # a resumed run, or calls lost in an outage: compare with MLflow, send the rest
            self._journal.close()
            result = sync_folder(self.folder, self.uri, retry_s=SETTLE_RETRY_S)
            self.run_id = result.run_id
            return
        except Exception as err:
            why = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}" if str(err) else ""
        journal.mark_pending(self.folder, redact_uri(why) or "the tracking store did not answer")
        self.pending = True
        to = f" --uri {redact_uri(self.uri)}"  # a sync sends only where it is told to
        self.sync_hint = (f"run kept locally: `stability sync {self.folder}{to}` "
                          f"(or `python experiments/sync.py {self.folder}{to}`)")
        log.warning("%s", self.sync_hint)
