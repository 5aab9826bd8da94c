"""Sizing a tracking server: its ingest rate, and the report's time at 10x the default study.

Both go through MLflow's public client (``MlflowClient``) to one tracking server: an
``mlflow server`` started here on SQLite (``stability.tracking.server.start_server``: one
uvicorn worker, proxied artifacts) or the one ``--tracking-uri`` names (e.g. the team server on
PostgreSQL, to size that one).

1. **Ingest**: ``writers`` threads, each with a run of its own, send full ``log_batch`` calls of
   per-step points (1000 a call: MLflow's limit, and what a run's sender thread sends) as fast as
   the server takes them. A point counts once its call has returned; counted over ``window_s``
   after ``warm_s`` of warm-up. With a server started here, its processes' CPU over the same
   window too. One client process is enough: it spends ~35 us of CPU a point, the server ~200.
2. **The report**: a sweep of ``runs`` simulated runs (``simulate``; 2400 runs = 10x the
   default study) is written run by run, then ``python experiments/report.py`` runs on it as a
   user runs it: the command's wall seconds and the report's own ``report finished in``.

``--part scale`` of ``experiments/benchmark.py`` runs it (not a default part).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import PROJECT_ROOT
from benchmarks import simulate as sim
from stability.core.config import ConfigError
from stability.core.validation import Errors
from stability.tracking.contract import STEP_METRICS, Kind, Tag

BATCH = 1000  # points a log_batch call: MLflow's limit
EXPERIMENT, INGEST_EXPERIMENT = "scale", "scale-ingest"
HZ = os.sysconf("SC_CLK_TCK")
REPORT_ENV = os.environ | {"MLFLOW_TRACKING_URI": "", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class ScaleSpec:
    """Settings of ``--part scale`` (validated: a bad one names its option).

    Attributes:
        runs: runs of the reported sweep (``simulate.Grid.of``: 2400 is 10x the default study).
        writers: writer threads of the ingest window.
        warm_s: seconds writers run before the window is measured.
        window_s: seconds of the measured ingest window.
    """

    runs: int = 2400
    writers: int = 8
    warm_s: float = 4.0
    window_s: float = 12.0

    def __post_init__(self) -> None:
        e = Errors()
        try:
            sim.Grid.of(self.runs)
        except ConfigError as err:
            e.items.append(str(err))
        e.require(self.writers >= 1, "--scale-writers", self.writers, "an integer >= 1")
        e.require(self.warm_s >= 0, "--scale-warm", self.warm_s, "a number of seconds >= 0")
        e.require(self.window_s > 0, "--scale-window", self.window_s, "a number of seconds > 0")
        e.raise_if_any()


def group_cpu_s(pgid: int) -> float:
    """CPU seconds so far (utime + stime) of every process in process group ``pgid``."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = text.rsplit(")", 1)[1].split()  # the command name may hold spaces
        if int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) / HZ
    return total


def _experiment(c: Any, name: str) -> str:
    exp = c.get_experiment_by_name(name)
    return exp.experiment_id if exp is not None else c.create_experiment(name)


def ingest(uri: str, spec: ScaleSpec, server_pgid: int | None = None) -> dict[str, Any]:
    """Per-step points a second the server takes from ``spec.writers`` writer threads.

    Raises:
        RuntimeError: a writer's ``log_batch`` failed.
    """
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    exp_id = _experiment(c, INGEST_EXPERIMENT)
    runs = [c.create_run(exp_id, run_name=f"ingest {i}").info.run_id
            for i in range(spec.writers)]
    sent, errors, stop = [0] * spec.writers, [], threading.Event()
    per_call = BATCH // len(STEP_METRICS)

    def write(i: int) -> None:
        client, step = MlflowClient(uri), 0
        try:
            while not stop.is_set():
                ts = int(time.time() * 1000)
                client.log_batch(runs[i], metrics=[
                    Metric(k, 0.5 + 1e-6 * s, ts, s) for s in range(step, step + per_call)
                    for k in STEP_METRICS])
                step += per_call
                sent[i] += per_call * len(STEP_METRICS)
        except Exception as err:  # reported below, once the other writers stopped
            errors.append(err)

    threads = [threading.Thread(target=write, args=(i,), daemon=True)
               for i in range(spec.writers)]
    for t in threads:
        t.start()
    time.sleep(spec.warm_s)
    n0, t0 = sum(sent), time.perf_counter()
    cpu0 = group_cpu_s(server_pgid) if server_pgid else None
    time.sleep(spec.window_s)
    n1, seconds = sum(sent), time.perf_counter() - t0
    cpu = group_cpu_s(server_pgid) - cpu0 if server_pgid and cpu0 is not None else None
    stop.set()
    for t in threads:
        t.join(timeout=120)
    for run_id in runs:
        c.set_terminated(run_id)
    if errors:
        raise RuntimeError(f"a writer failed: {errors[0]!r}")
    points = n1 - n0
    return {"writers": spec.writers, "window_s": seconds, "step_points": points,
            "step_points_per_s": points / seconds,
            "server_cores": cpu / seconds if cpu is not None else None,
            "server_cpu_us_per_point": cpu / points * 1e6 if cpu is not None and points else None}


def write_sweep(uri: str, runs: int, work: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """A sweep of ``runs`` simulated runs under a parent run, written with ``MlflowClient``."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    exp_id = _experiment(c, EXPERIMENT)
    sweep_id = f"scale-{runs}-{secrets.token_hex(3)}"
    parent = c.create_run(exp_id, run_name=f"sweep {sweep_id}", tags={
        Tag.KIND: str(Kind.SWEEP), Tag.SWEEP_ID: sweep_id}).info.run_id
    template = sim.Template.build()
    composer = sim.Composer(template.bases)
    tracking = {"experiment": EXPERIMENT, "sweep_id": sweep_id, "parent_run_id": parent}
    t0 = time.perf_counter()
    for i, point in enumerate(sim.Grid.of(runs).points()):
        if i % 240 == 0:
            say(f"scale: writing runs {i + 1}-{min(i + 240, runs)} of {runs}")
        cfg = composer.config(point, tracking, work / "runs" / f"{i:05d}")
        sim.log_run(c, exp_id, cfg, point, sim.records(cfg, template.train_size),
                    template.checkpoint, parent)
    seconds = time.perf_counter() - t0
    c.set_terminated(parent)
    return {"sweep_id": sweep_id, "runs": runs, "write_s": seconds,
            "write_ms_per_run": seconds / runs * 1e3}


def report(uri: str, sweep_id: str, out: Path) -> dict[str, Any]:
    """``python experiments/report.py`` on the sweep: the command's wall seconds and the
    report's own ``report finished in`` seconds.

    Raises:
        RuntimeError: the report failed (its output's tail is quoted).
    """
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "experiments/report.py", f"sweep_id={sweep_id}",
         f"experiment={EXPERIMENT}", f"tracking.uri={uri}", f"output_dir={out}",
         f"hydra.run.dir={out / 'hydra'}"], cwd=PROJECT_ROOT, env=REPORT_ENV,
        capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    found = re.search(r"report finished in ([\d.]+) s", proc.stdout)
    if proc.returncode != 0 or found is None:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise RuntimeError(f"the report failed ({proc.returncode}):\n{tail}")
    return {"wall_s": wall, "build_report_s": float(found.group(1))}


def run_scale(spec: ScaleSpec, work: Path, say: Callable[[str], None],
              uri: str | None = None) -> dict[str, Any]:
    """The ``scale`` part: ingest, then the report of a ``spec.runs``-run sweep.

    Args:
        spec: the settings.
        work: scratch folder (the server's store and artifacts, the run folders, the report).
        say: progress lines.
        uri: an existing tracking server; None starts one on SQLite under ``work``.
    """
    from stability.tracking.server import start_server

    server = None
    if uri is None:
        say("scale: starting mlflow server")
        server = start_server(work / "server", timeout_s=300)
        uri = server.uri
    try:
        say(f"scale: ingest window, {spec.writers} writers")
        out: dict[str, Any] = {"spec": {"runs": spec.runs, "writers": spec.writers,
                                        "warm_s": spec.warm_s, "window_s": spec.window_s},
                               "store": "SQLite, started here" if server else "given"}
        out["ingest"] = ingest(uri, spec, server.process.pid if server else None)
        out["sweep"] = write_sweep(uri, spec.runs, work, say)
        say(f"scale: the report of {spec.runs} runs")
        out["report"] = report(uri, out["sweep"]["sweep_id"], work / "report")
        out["report"]["ms_per_run"] = out["report"]["build_report_s"] / spec.runs * 1e3
    finally:
        if server is not None:
            server.stop()
    return out
