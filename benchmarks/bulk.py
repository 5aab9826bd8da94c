"""A study's runs written straight into the backend store: the sizes the server cannot fill.

Through one ``mlflow server`` the simulated writers reach a few thousand per-step points and a
few runs a second on these two cores (``ingest``), and MLflow's own SQL store, called in
process, still spends ~0.25 s of ORM work and commits on each run: a 2,400-run study with all
its 5.5 million per-step points would take most of an hour per store. The report, the UI and
the resume bookkeeping need the store to hold such a study, not to have received it over HTTP,
so the study sizes are built here. Every run holds what ``TrackedRun`` leaves:

- the first run of each call is written by MLflow's ``SqlAlchemyStore`` in this process
  (``create_run``, one ``log_batch``, ``update_run_info``): MLflow's code writes its rows;
- every other run gets the same rows by SQL: its ``runs`` row is the reference run's with the
  run's own id, name, times and artifact URI; ``tags`` from ``run_tags`` plus the outcome and
  ``mlflow.runName``; ``params`` from ``run_params``; every point in ``metrics`` (values stored
  as MLflow stores them: NaN as 0 with ``is_nan``, infinities as the largest double) and the
  newest of each key in ``latest_metrics`` (MLflow's rule: highest step, timestamp, value);
- ``steps.csv``, ``config.yaml`` and ``checkpoints/best.pt`` go where the server's artifact
  proxy keeps a run's artifacts (``<destination>/<experiment>/<run>/artifacts``).

``same_shape`` compares a run built here with one written through the server, key by key, and
the benchmark checks it for every store it builds.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import simulate as sim
from stability.core.loop import CHECKPOINT_NAME, CONFIG_NAME, CSV_NAME, write_config
from stability.core.steplog import CsvStepWriter
from stability.tracking.buffer import epoch_points, step_points
from stability.tracking.contract import Outcome, Tag
from stability.tracking.direct import sanitized
from stability.tracking.journal import now_ms
from stability.tracking.run import run_params, run_tags, summary_metrics
from stability.tracking.uri import run_name

COLUMNS = "key, value, timestamp, run_uuid, step, is_nan"
FLUSH_ROWS = 500_000  # metric rows per transaction (bounded memory)


def _run_points(rec: sim.Records, ts: int) -> list[tuple[str, float, int, int]]:
    """Every point the run's sink sends: per step, per epoch, the summary at step 0."""
    return ([p for _, s in rec.steps for p in step_points(s, ts)]
            + [p for e in rec.epochs for p in epoch_points(e, ts)]
            + [(k, v, 0, ts) for k, v in summary_metrics(rec.summary).items()])


def _final_tags(rec: sim.Records) -> dict[str, str]:
    """What ``TrackedRun.finish`` and its close add: string summary values, the outcome."""
    return {f"stability.{k}": v for k, v in rec.summary.items()
            if isinstance(v, str) and v} | {Tag.OUTCOME: str(Outcome.FINISHED)}


class _Sql:
    """Rows of the runs after the reference one, inserted in one transaction per ``flush``."""

    def __init__(self, store_uri: str, reference: str) -> None:
        import sqlalchemy

        self.engine = sqlalchemy.create_engine(store_uri)
        self.postgres = self.engine.dialect.name == "postgresql"
        meta = sqlalchemy.MetaData()
        self.tables = {t: sqlalchemy.Table(t, meta, autoload_with=self.engine)
                       for t in ("runs", "tags", "params", "latest_metrics")}
        runs = self.tables["runs"]
        with self.engine.connect() as conn:
            self.template = dict(conn.execute(runs.select().where(
                runs.c.run_uuid == reference)).mappings().one())
        self.rows: dict[str, list[dict[str, Any]]] = {t: [] for t in self.tables}
        self.metrics: list[tuple[str, float, int, str, int, bool]] = []
        self.metric_rows = 0

    def add(self, run_id: str, name: str, start: int, end: int, tags: dict[str, str],
            params: dict[str, str], points: list[tuple[str, float, int, int]]) -> None:
        """Queue one run's rows."""
        self.rows["runs"].append(self.template | {
            "run_uuid": run_id, "name": name, "status": "FINISHED", "start_time": start,
            "end_time": end, "artifact_uri": self.template["artifact_uri"].replace(
                self.template["run_uuid"], run_id)})
        self.rows["tags"] += [{"key": k, "value": v, "run_uuid": run_id} for k, v in tags.items()]
        self.rows["params"] += [{"key": k, "value": v, "run_uuid": run_id}
                                for k, v in params.items()]
        latest: dict[str, tuple[int, int, float, bool]] = {}
        for key, value, step, ts in points:
            v, nan = sanitized(value)
            self.metrics.append((key, v, ts, run_id, step, nan))
            if key not in latest or (step, ts, v) > latest[key][:3]:
                latest[key] = (step, ts, v, nan)
        self.rows["latest_metrics"] += [
            {"key": k, "value": v, "timestamp": ts, "step": step, "is_nan": nan,
             "run_uuid": run_id} for k, (step, ts, v, nan) in latest.items()]

    def flush(self) -> None:
        """Insert what is queued (runs first: ``metrics`` references them)."""
        with self.engine.begin() as conn:
            for name, table in self.tables.items():
                if self.rows[name]:
                    conn.execute(table.insert(), self.rows[name])
                    self.rows[name] = []
            cur = conn.connection.cursor()
            if self.postgres:  # COPY: the bulk path PostgreSQL has
                text = "".join(f"{k}\t{v!r}\t{ts}\t{r}\t{s}\t{int(n)}\n"
                               for k, v, ts, r, s, n in self.metrics)
                cur.copy_expert(f"COPY metrics ({COLUMNS}) FROM STDIN", io.StringIO(text))
            else:
                cur.execute("PRAGMA cache_size = -262144")  # this connection: 256 MiB of pages
                cur.executemany(f"INSERT INTO metrics ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                                self.metrics)
        self.metric_rows += len(self.metrics)
        self.metrics = []

    def close(self) -> None:
        """Flush; on PostgreSQL ``ANALYZE``, as its autovacuum would within a minute of such a
        load (plans on stale statistics would make every later query look worse than it is)."""
        self.flush()
        if self.postgres:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("ANALYZE")
        self.engine.dispose()


def write_runs(store_uri: str, artifacts: Path, experiment_id: str, tracking: dict[str, Any],
               points: Sequence[sim.Point], template: sim.Template,
               folders: Path) -> dict[str, Any]:
    """Write ``points`` as finished runs of the sweep in ``tracking``.

    Args:
        store_uri: the server's backend store (SQLAlchemy URL).
        artifacts: the server's ``--artifacts-destination``.
        experiment_id: the sweep's experiment.
        tracking: ``tracking.*`` of the runs (uri, experiment, sweep_id, parent_run_id).
        points: the grid points to write.
        template: shared shapes (``simulate.Template``).
        folders: the runs' ``output_dir`` tags point below here (nothing is written there).

    Returns:
        ``runs``, ``metric_rows`` (bulk-loaded), ``seconds`` and ``run_ids`` (point, run id).
    """
    import uuid

    from mlflow.entities import Metric, Param, RunStatus, RunTag
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    t0 = time.perf_counter()
    composer = sim.Composer(template.bases)
    sql: _Sql | None = None
    run_ids = []
    for i, point in enumerate(points):
        folder = folders / str(i)
        cfg = composer.config(point, tracking, folder)
        rec = sim.records(cfg, template.train_size)
        ts = now_ms()
        tags = run_tags(cfg, sim.overrides(point), 1, folder)
        params = run_params(cfg)
        run_points = _run_points(rec, ts)
        if sql is None:  # the reference run: MLflow's store writes it
            store = SqlAlchemyStore(store_uri, "mlflow-artifacts:/")
            rid = store.create_run(experiment_id, "unknown", ts,
                                   [RunTag(k, v) for k, v in tags.items()],
                                   run_name(cfg)).info.run_id
            for j in range(0, len(run_points), 1000):  # the sink's batches
                store.log_batch(rid, [Metric(k, v, t, s)
                                      for k, v, s, t in run_points[j : j + 1000]], [], [])
            store.log_batch(rid, [], [Param(k, v) for k, v in params.items()],
                            [RunTag(k, v) for k, v in _final_tags(rec).items()])
            store.update_run_info(rid, RunStatus.FINISHED, now_ms(), None)
            store.engine.dispose()
            sql = _Sql(store_uri, rid)
        else:
            rid = uuid.uuid4().hex
            sql.add(rid, run_name(cfg), ts, now_ms(),
                    tags | _final_tags(rec) | {"mlflow.runName": run_name(cfg)}, params,
                    run_points)
            if len(sql.metrics) >= FLUSH_ROWS:
                sql.flush()
        _artifacts(artifacts / experiment_id / rid / "artifacts", cfg, rec, template)
        run_ids.append((point, rid))
    if sql is not None:
        sql.close()
    return {"runs": len(points), "metric_rows": sql.metric_rows if sql else 0,
            "seconds": time.perf_counter() - t0, "run_ids": run_ids}


def _artifacts(dest: Path, cfg: Any, rec: sim.Records, template: sim.Template) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    csv = CsvStepWriter(dest / CSV_NAME)
    for epoch, s in rec.steps:
        csv.on_step(s, epoch)
    csv.close()
    write_config(cfg, dest / CONFIG_NAME)
    (dest / CHECKPOINT_NAME).parent.mkdir(parents=True, exist_ok=True)
    (dest / CHECKPOINT_NAME).write_bytes(template.checkpoint)


def same_shape(c: Any, real: str, built: str) -> list[str]:
    """Differences between two runs of the same config: tag, param and metric keys, each
    metric history's length, artifact paths (empty: none)."""
    a, b = c.get_run(real), c.get_run(built)
    out = [f"{what}: {sorted(set(x) ^ set(y))}" for what, x, y in (
        ("tags", a.data.tags, b.data.tags), ("params", a.data.params, b.data.params),
        ("metrics", a.data.metrics, b.data.metrics)) if set(x) != set(y)]
    for key in sorted(set(a.data.metrics) & set(b.data.metrics)):
        n, m = len(c.get_metric_history(real, key)), len(c.get_metric_history(built, key))
        if n != m:
            out.append(f"history of {key}: {n} vs {m} points")

    def listing(run_id: str) -> set[str]:
        return {f.path for f in c.list_artifacts(run_id)} | {
            f.path for f in c.list_artifacts(run_id, "checkpoints")}

    if listing(real) != listing(built):
        out.append(f"artifacts: {sorted(listing(real))} vs {sorted(listing(built))}")
    return out
