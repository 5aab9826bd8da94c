"""Simulated writers: N processes logging default-study runs through ``TrackedRun`` at once.

Each writer is its own process (a forkserver child: MLflow, torch and Hydra are imported once,
in the fork server, not 32 times) and writes run after run as fast as the tracking server takes
them, through the project's own path (``TrackedRun``: journal, ``MetricBuffer``, the ``Sender``
thread, ``log_batch`` of up to 1000 points, artifacts). A per-step point counts once the
``log_batch`` that carried it has returned (``send_metrics`` is wrapped to add to a shared
counter; the call itself is untouched). CPU time comes from ``/proc``: the server's process
tree, PostgreSQL's, the writers', and the machine's busy time, over the same window.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import simulate as sim
from benchmarks.machine import cpu_seconds
from stability.tracking.contract import STEP_METRICS

PRELOAD = ["benchmarks.simulate", "stability.tracking.run", "mlflow", "torch", "hydra"]
STEP_KEYS = frozenset(STEP_METRICS)
HZ = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Target:
    """Where writers log: server URI, experiment, sweep id and parent run, run folders."""

    uri: str
    experiment: str
    sweep_id: str
    parent_run_id: str
    root: Path  # run folders go to root/<writer>/<n>


def _process_table() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, CPU seconds) of every process (``/proc/<pid>/stat`` utime + stime)."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = text.rsplit(")", 1)[1].split()  # the command name may hold spaces
        out[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / HZ)
    return out


def tree_cpu(roots: dict[str, Sequence[int]]) -> dict[str, dict[int, float]]:
    """CPU seconds so far of each group's processes and all their descendants, by pid."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out = {}
    for name, pids in roots.items():
        todo, found = list(pids), {}
        while todo:
            pid = todo.pop()
            if pid in found or pid not in table:
                continue
            found[pid] = table[pid][1]
            todo += children.get(pid, [])
        out[name] = found
    return out


class CpuWindow:
    """CPU cores used per group between ``start`` and ``stop`` (CPU seconds / wall seconds).

    A process that ends in between loses what it used since ``start`` (e.g. a PostgreSQL
    backend of a closed connection): the figures are lower bounds, never negative.
    """

    def __init__(self, groups: dict[str, Sequence[int]]) -> None:
        self.groups = groups
        self._t0 = 0.0
        self._cpu0: dict[str, dict[int, float]] = {}
        self._machine0: dict[str, float] = {}

    def start(self) -> None:
        """Take the first sample."""
        self._t0, self._cpu0, self._machine0 = time.time(), tree_cpu(self.groups), cpu_seconds()

    def stop(self) -> dict[str, float]:
        """Cores used by each group, the machine's busy and stolen cores (every user of the
        machine: its other tenants too), and the server's (+ PostgreSQL's) share of busy."""
        cpu, machine, wall = tree_cpu(self.groups), cpu_seconds(), time.time() - self._t0
        out = {f"{k}_cores": sum(v - self._cpu0.get(k, {}).get(pid, 0.0)
                                 for pid, v in pids.items()) / wall for k, pids in cpu.items()}
        out["machine_busy_cores"] = (machine["busy_s"] - self._machine0["busy_s"]) / wall
        out["machine_steal_cores"] = (machine["steal_s"] - self._machine0["steal_s"]) / wall
        busy = out["machine_busy_cores"] or float("nan")
        out["server_share"] = (out.get("server_cores", 0.0) + out.get("postgres_cores", 0.0)) / busy
        return out


# -- in the writer processes ------------------------------------------------------------------
def _count_acks(counter: Any, index: int) -> None:
    """Add a run's per-step points to ``counter[index]`` each time their ``log_batch`` returns."""
    import stability.tracking.run as run_module

    send = run_module.send_metrics

    def counted(c: Any, run_id: str, points: list[Any]) -> None:
        send(c, run_id, points)
        counter[index] += sum(p[0] in STEP_KEYS for p in points)

    run_module.send_metrics = counted


def _writer(target: Target, template: sim.Template, index: int, n: int, points: list[sim.Point],
            counter: Any, go: Any, results: Any) -> None:
    """Write runs until killed: writer ``index`` of ``n`` takes every n-th point, seeds moved
    by 1000 per pass (new points of the same shape)."""
    composer = sim.Composer(template.bases)
    tracking = {"uri": target.uri, "experiment": target.experiment,
                "sweep_id": target.sweep_id, "parent_run_id": target.parent_run_id}
    _count_acks(counter, index)
    results.put(index)
    go.wait()
    k = index
    while True:
        enabled, max_norm, accum, precision, seed = points[k % len(points)]
        point = (enabled, max_norm, accum, precision, seed + 1000 * (1 + k // len(points)))
        cfg = composer.config(point, tracking, target.root / str(index) / str(k))
        sim.write_run(cfg, point, sim.records(cfg, template.train_size), template.checkpoint)
        k += n


# -- in the benchmark process -----------------------------------------------------------------
def window(target: Target, template: sim.Template, points: list[sim.Point], writers: int,
           groups: dict[str, list[int]], warm_s: float, measure_s: float) -> dict[str, Any]:
    """Sustained ingest: ``writers`` processes write runs for ``warm_s + measure_s`` seconds.

    Returns:
        Per-step points acknowledged in the last ``measure_s`` seconds (and per second), runs
        started, and the CPU cores of each group (``CpuWindow``) over the same seconds. The
        writers are killed at the end: their last runs stay RUNNING in ``target.experiment``.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    go, results = ctx.Event(), ctx.Queue()
    counter = ctx.RawArray("q", writers)  # one writer per slot: no lock needed
    procs = [ctx.Process(target=_writer, args=(target, template, i, writers, points, counter,
                                               go, results), daemon=True)
             for i in range(writers)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            results.get(timeout=300)
        cpu = CpuWindow(groups | {"writers": [p.pid for p in procs]})
        go.set()
        time.sleep(warm_s)
        cpu.start()
        t0, before = time.time(), sum(counter)
        time.sleep(measure_s)
        usage = cpu.stop()
        t1, after = time.time(), sum(counter)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.join()
    runs = sum(1 for d in target.root.glob("*/*") if d.is_dir())
    return {"writers": writers, "warm_s": warm_s, "measure_s": t1 - t0,
            "step_points": after - before, "step_points_per_s": (after - before) / (t1 - t0),
            "runs_started": runs, "cpu": usage}


def store_cost(store_uri: str, experiment_id: str, groups: dict[str, list[int]],
               batches: int = 10) -> dict[str, Any]:
    """MLflow's SQL store alone: ``SqlAlchemyStore.log_batch`` of 1000 per-step points, in this
    process (no HTTP, no JSON), into a scratch run; wall and CPU microseconds a point.

    The server runs this same code for every batch a writer sends, so comparing it with the
    server's CPU a point in a window splits the server's cost into store and the rest.
    """
    from mlflow.entities import Metric
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(store_uri, "mlflow-artifacts:/")
    rid = store.create_run(experiment_id, "unknown", int(time.time() * 1000), [],
                           "store-cost").info.run_id
    cpu = CpuWindow(groups)
    cpu.start()
    t0, c0 = time.perf_counter(), time.process_time()
    ts = int(time.time() * 1000)
    for b in range(batches):
        store.log_batch(rid, [Metric(k, 0.5 + i, ts, b * 125 + i // 8 + 1)
                              for i, k in enumerate(STEP_METRICS * 125)], [], [])
    wall, own = time.perf_counter() - t0, time.process_time() - c0
    usage = cpu.stop()
    store.delete_run(rid)
    store.engine.dispose()
    points = batches * 1000
    return {"points": points, "us_per_point_wall": 1e6 * wall / points,
            "us_per_point_cpu": 1e6 * own / points,
            "postgres_us_per_point_cpu": 1e6 * usage.get("postgres_cores", 0.0) * wall / points}
