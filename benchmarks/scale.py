"""Ten times the study, measured: ingest, the report, the UI and resume as a study grows.

For each store (the embedded SQLite store and PostgreSQL, each behind a real ``mlflow server``
started by ``stability.tracking.server.start_server``, one worker) and each study size (1x, 3x,
10x the default study: 240, 720, 2400 runs by default):

1. the sweep grows to that size (``bulk``: the runs a real sweep of that grid leaves, with
   every per-step point, under one sweep parent opened by the sweeper's ``open_sweep_run``);
2. ingest: N simulated writers (``ingest``) log default-study runs through ``TrackedRun`` to
   the server for a fixed window; N = 2, 8, 32 at the first size, 8 at the others;
3. the report (``python experiments/report.py``) of the sweep, end to end;
4. the MLflow UI in headless Chromium (``browser``): runs page, grouped view, a metric chart;
5. resume: ``finished_points`` and a resumed ``python experiments/sweep.py -m`` of the grid.

At the first size MLflow's SQL store is also timed alone (``ingest.store_cost``); at the end one
more window runs against the same store behind a server with 2 uvicorn workers.

``--part scale`` of ``experiments/benchmark.py`` runs it (not a default part: it takes ~25 min).
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import bulk, ingest, scale_measure
from benchmarks import simulate as sim
from stability.core.config import ConfigError, TrackingConfig
from stability.core.validation import Errors
from stability.tracking.contract import STEP_METRICS

EXPERIMENT, INGEST_EXPERIMENT = "scale", "scale-ingest"
STORES = ("sqlite", "postgres")


@dataclass(frozen=True)
class ScaleSpec:
    """Settings of ``--part scale`` (validated: a bad one names its option).

    Attributes:
        runs: study sizes, nested grids (``simulate.Grid.of``), smallest first.
        stores: ``sqlite`` and/or ``postgres``.
        writers: writer counts of the ingest windows at the first size.
        size_writers: writer count of the ingest window at every other size.
        warm_s: seconds writers run before a window is measured.
        window_s: seconds of each measured ingest window.
    """

    runs: tuple[int, ...] = (240, 720, 2400)
    stores: tuple[str, ...] = STORES
    writers: tuple[int, ...] = (2, 8, 32)
    size_writers: int = 8
    warm_s: float = 4.0
    window_s: float = 12.0

    def __post_init__(self) -> None:
        e = Errors()
        grids = []
        for r in self.runs:
            try:
                grids.append(sim.Grid.of(r))
            except ConfigError as err:
                e.items.append(str(err))
        nested = all(b.contains(a) for a, b in zip(grids, grids[1:], strict=False))
        e.require(bool(self.runs) and nested and list(self.runs) == sorted(set(self.runs)),
                  "--scale-runs", ",".join(map(str, self.runs)),
                  "increasing sizes whose grids contain each other (e.g. 24,48 or 240,720,2400)")
        e.require(bool(self.stores) and set(self.stores) <= set(STORES), "--scale-stores",
                  ",".join(self.stores), " | ".join(STORES) + " (comma-separated)")
        e.require(bool(self.writers) and all(w >= 1 for w in self.writers) and
                  self.size_writers >= 1, "--scale-writers", self.writers,
                  "integers >= 1 (comma-separated)")
        e.require(self.warm_s >= 0 and self.window_s > 0, "--scale-window", self.window_s,
                  "a number of seconds > 0")
        e.raise_if_any()

    @property
    def grids(self) -> list[sim.Grid]:
        """The grid of each size."""
        return [sim.Grid.of(r) for r in self.runs]


@dataclass
class Store:
    """A running store: the server, its backend URI, PostgreSQL (or None), CPU groups."""

    kind: str
    server: Any
    backend: str
    postgres: Any
    groups: dict[str, list[int]]

    def restart(self, workers: int) -> None:
        """The same store behind a new server with ``workers`` uvicorn workers."""
        from stability.tracking.server import start_server

        root = self.server.root
        self.server.stop()
        self.server = start_server(root, timeout_s=300, workers=workers,
                                   store_uri=self.backend if self.postgres else None)
        self.groups["server"] = [self.server.process.pid]

    def stop(self) -> None:
        """Stop the server, then PostgreSQL."""
        self.server.stop()
        if self.postgres is not None:
            self.postgres.stop()

    def size_mb(self) -> float:
        """The backend store's size on disk (the SQLite file, or the PostgreSQL database)."""
        if self.postgres is None:
            return (self.server.root / "mlflow.db").stat().st_size / 2**20
        return self.postgres.query("mlflow", "SELECT pg_database_size('mlflow')")[0][0] / 2**20


def start_store(kind: str, root: Path) -> Store:
    """``mlflow server`` (one worker, proxied artifacts under ``root``) on SQLite or on a fresh
    PostgreSQL cluster (the team stack's backend, fsync on as in its compose image)."""
    from stability.tracking.server import start_server

    if kind == "sqlite":
        server = start_server(root, timeout_s=300)
        return Store(kind, server, f"sqlite:///{root / 'mlflow.db'}", None,
                     {"server": [server.process.pid]})
    from tests.helpers.postgres import start_postgres

    pg = start_postgres("mlflow", "p" + secrets.token_hex(8), "mlflow", "mlflow_auth",
                        fsync=True)
    try:
        server = start_server(root, timeout_s=300, store_uri=pg.url("mlflow"))
    except BaseException:
        pg.stop()
        raise
    postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
    return Store(kind, server, pg.url("mlflow"), pg,
                 {"server": [server.process.pid], "postgres": [postmaster]})


def _open_sweep(uri: str, experiment: str, sweep_id: str, grid: sim.Grid | None) -> Any:
    from stability.sweep.parent import open_sweep_run

    args = grid.arguments() if grid else []
    size = (2 * grid.thresholds if grid and grid.thresholds else 1) * 12 * grid.seeds \
        if grid else 0
    run, _ = open_sweep_run(TrackingConfig(uri=uri, experiment=experiment), sweep_id, size,
                            grid.runs if grid else 0, args,
                            dict(a.split("=", 1) for a in args), resume=False)
    return run


def measure_store(kind: str, spec: ScaleSpec, template: sim.Template, work: Path,
                  say: Callable[[str], None]) -> dict[str, Any]:
    """Every figure of one store, size by size (see the module docstring)."""
    from stability.tracking.uri import client

    say(f"scale/{kind}: starting the store")
    store = start_store(kind, work / "server")
    out: dict[str, Any] = {"sizes": []}
    try:
        uri = store.server.uri
        sweep_id = f"scale-{kind}"
        parent = _open_sweep(uri, EXPERIMENT, sweep_id, spec.grids[-1])
        ingest_parent = _open_sweep(uri, INGEST_EXPERIMENT, f"ingest-{kind}", None)
        tracking = {"uri": uri, "experiment": EXPERIMENT, "sweep_id": sweep_id,
                    "parent_run_id": parent.run_id}
        ingest_points = spec.grids[0].points()
        c = client(uri)
        for i, (grid, new) in enumerate(zip(spec.grids, sim.growing_points(spec.grids),
                                             strict=True)):
            size: dict[str, Any] = {"runs": grid.runs, "thresholds": grid.thresholds,
                                    "seeds": grid.seeds}
            say(f"scale/{kind} {grid.runs} runs: writing {len(new)} runs into the store")
            built = bulk.write_runs(store.backend, store.server.root / "artifacts",
                                    parent.experiment_id, tracking, new, template,
                                    work / "folders" / str(grid.runs))
            ids = dict(built.pop("run_ids"))
            size["build"] = built
            size["store_mb"] = store.size_mb()
            windows = spec.writers if i == 0 else (spec.size_writers,)
            size["ingest"] = []
            for n in windows:
                say(f"scale/{kind} {grid.runs} runs: ingest window, {n} writers")
                size["ingest"].append(ingest.window(
                    ingest.Target(uri, INGEST_EXPERIMENT, f"ingest-{kind}", ingest_parent.run_id,
                                  work / "ingest" / f"{grid.runs}-{n}"),
                    template, ingest_points, n, store.groups, spec.warm_s, spec.window_s))
            if i == 0:
                out["shape_check"] = _shape_check(c, ids, new)
                size["store_cost"] = ingest.store_cost(store.backend, parent.experiment_id,
                                                       store.groups)
            say(f"scale/{kind} {grid.runs} runs: the report")
            size["report"] = scale_measure.report(uri, EXPERIMENT, sweep_id,
                                                  work / "reports" / str(grid.runs),
                                                  store.groups)
            say(f"scale/{kind} {grid.runs} runs: the MLflow UI")
            chart_run = ids[next(p for p in new if p[2] == 1)]  # accum 1: the longest history
            size["ui"] = scale_measure.ui(uri, parent.experiment_id, sweep_id, chart_run,
                                          work / "chromium" / str(grid.runs), store.groups)
            say(f"scale/{kind} {grid.runs} runs: resume bookkeeping")
            size["resume"] = scale_measure.resume(uri, EXPERIMENT, grid.arguments(), grid.runs,
                                                  work / "sweeps" / str(grid.runs),
                                                  store.groups)
            size["store_mb_after"] = store.size_mb()
            out["sizes"].append(size)
            shutil.rmtree(work / "ingest", ignore_errors=True)  # run folders: journals, CSVs
        say(f"scale/{kind}: ingest window, {spec.size_writers} writers, 2 server workers")
        store.restart(workers=2)
        out["two_workers"] = ingest.window(
            ingest.Target(store.server.uri, INGEST_EXPERIMENT, f"ingest-{kind}",
                          ingest_parent.run_id, work / "ingest" / "two-workers"),
            template, ingest_points, spec.size_writers, store.groups, spec.warm_s,
            spec.window_s)
    finally:
        store.stop()
    return out


def _shape_check(c: Any, ids: dict[sim.Point, str], points: list[sim.Point]) -> dict[str, Any]:
    """A run built by ``bulk`` against MLflow's store-written reference run and against a run
    written through the server by a writer, all three with the same accum_steps (so the same
    history lengths): no difference allowed.

    Raises:
        RuntimeError: a key, a history's length or an artifact differs, or no writer's run
            finished in the windows.
    """
    reference, first = ids[points[0]], points[0]
    twin = next(p for p in points[1:] if p[2] == first[2])
    real = c.search_runs([c.get_experiment_by_name(INGEST_EXPERIMENT).experiment_id],
                         f"attributes.status = 'FINISHED' and params.`train.accum_steps` = "
                         f"'{first[2]}'", max_results=1)
    if not real:
        raise RuntimeError("no writer finished a run to compare with: lengthen --scale-window")
    diffs = {"vs_store_api": bulk.same_shape(c, reference, ids[twin]),
             "vs_server_written": bulk.same_shape(c, real[0].info.run_id, ids[twin])}
    if any(diffs.values()):
        raise RuntimeError(f"bulk-built runs differ from real ones: {diffs}")
    return {"compared": [reference, real[0].info.run_id, ids[twin]], "differences": 0}


def run_scale(spec: ScaleSpec, work: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """All stores; the ``scale`` part's result."""
    t0 = time.time()
    template = sim.Template.build()
    say("scale: timing the sweep command's start-up (a one-point dry run)")
    out: dict[str, Any] = {
        "spec": {"runs": list(spec.runs), "stores": list(spec.stores),
                 "writers": list(spec.writers), "size_writers": spec.size_writers,
                 "warm_s": spec.warm_s, "window_s": spec.window_s},
        "shape": {"train_size": template.train_size,
                  "step_points_per_run": {str(g.runs): _points_per_run(g, template)
                                          for g in spec.grids}},
        "sweep_startup_s": scale_measure.startup(work / "dry-run"),
        "stores": {}}
    for kind in spec.stores:
        out["stores"][kind] = measure_store(kind, spec, template, work / kind, say)
        shutil.rmtree(work / kind, ignore_errors=True)
    out["seconds"] = time.time() - t0
    return out


def _points_per_run(grid: sim.Grid, template: sim.Template) -> float:
    """Mean per-step points of a run of ``grid`` (every accum_steps value is equally common)."""
    composer = sim.Composer(template.bases)
    per_accum = []
    for accum in sim.ACCUM:
        cfg = composer.config((False, None, accum, "fp32", 0), {}, Path("."))
        per_accum.append(len(STEP_METRICS) * cfg.train.epochs
                         * sim.optimizer_steps_per_epoch(cfg, template.train_size))
    return sum(per_accum) / len(per_accum)
