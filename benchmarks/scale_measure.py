"""What a user waits for on a grown store: the report, the MLflow UI, a resumed sweep.

Each is the real thing: ``python experiments/report.py`` and ``python experiments/sweep.py -m``
as subprocesses (what a user types, imports included), the UI in headless Chromium
(``benchmarks.browser``), and ``finished_points`` (the sweeper's resume query) in process.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import PROJECT_ROOT
from benchmarks.browser import Browser
from benchmarks.ingest import CpuWindow
from stability.tracking.queries import finished_points

ENV = os.environ | {"MLFLOW_TRACKING_URI": "", "PYTHONUNBUFFERED": "1"}
VIEW_KEY = "bysweep"  # the shared view state tests/test_ui_browser.py uses: grouped by sweep
RUN_ROW = r"/acc=\d+ s=\d+/.test(document.body.innerText)"  # a training run's name is listed


def timed_lines(cmd: list[str], env: dict[str, str], timeout_s: float,
                groups: dict[str, list[int]]) -> tuple[int, list[tuple[float, str]], float,
                                                       dict[str, float]]:
    """Run ``cmd``; exit status, its output lines with the second each arrived, wall, CPU."""
    cpu = CpuWindow(groups)
    cpu.start()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    lines = [(time.perf_counter() - t0, line.rstrip()) for line in proc.stdout]
    rc = proc.wait(timeout=timeout_s)
    return rc, lines, time.perf_counter() - t0, cpu.stop()


def _fail(what: str, rc: int, lines: list[tuple[float, str]]) -> None:
    tail = "\n".join(text for _, text in lines[-40:])
    raise RuntimeError(f"{what} failed ({rc}):\n{tail}")


def report(uri: str, experiment: str, sweep_id: str, out: Path,
           groups: dict[str, list[int]]) -> dict[str, Any]:
    """``python experiments/report.py`` on the sweep: wall seconds (the command) and the
    report's own ``report finished in`` seconds (``build_report``), with CPU per group."""
    rc, lines, wall, cpu = timed_lines(
        [sys.executable, "experiments/report.py", f"sweep_id={sweep_id}",
         f"experiment={experiment}", f"tracking.uri={uri}", f"output_dir={out}",
         f"hydra.run.dir={out / 'hydra'}"], ENV, 3600, groups)
    if rc != 0:
        _fail("the report", rc, lines)
    inner = next(float(m.group(1)) for _, text in lines
                 if (m := re.search(r"report finished in ([\d.]+) s", text)))
    return {"wall_s": wall, "build_report_s": inner, "cpu": cpu}


def resume(uri: str, experiment: str, arguments: list[str], runs: int, sweep_dir: Path,
           groups: dict[str, list[int]]) -> dict[str, Any]:
    """Resume bookkeeping at this size, three ways.

    - ``finished_points``: the sweeper's resume query, in process (median of three);
    - ``sweep``: ``python experiments/sweep.py -m`` with the same grid on the same store: it
      composes and de-duplicates the grid, opens the sweep (stale runs, finished points), finds
      every point FINISHED (checked: it must skip all ``runs``) and launches nothing. The
      seconds until each of its lines say where the time goes.

    Raises:
        RuntimeError: the sweep failed or did not skip every point.
    """
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        done = finished_points(uri, experiment)
        times.append(time.perf_counter() - t0)
    rc, lines, wall, cpu = timed_lines(
        [sys.executable, "experiments/sweep.py", "-m", *arguments,
         f"tracking.experiment={experiment}", f"hydra.sweep.dir={sweep_dir}"],
        ENV | {"MLFLOW_TRACKING_URI": uri}, 1800, groups)
    if rc != 0:
        _fail("the resumed sweep", rc, lines)

    def at(pattern: str) -> tuple[float, re.Match[str]]:
        return next((t, m) for t, text in lines if (m := re.search(pattern, text)))

    t_grid, grid = at(r"\[sweep\] grid: (\d+) points, (\d+) after de-duplication")
    t_skip, skip = at(r"\[sweep\] skipped (\d+) points already FINISHED")
    if int(skip.group(1)) != runs or int(grid.group(2)) != runs:
        raise RuntimeError(f"the resumed sweep planned {grid.group(2)} and skipped "
                           f"{skip.group(1)} points, not {runs}: the simulated runs are not "
                           "what the sweeper would have logged")
    return {"finished_points_s": statistics.median(times), "finished_points": len(done),
            "grid_points": int(grid.group(1)), "sweep_wall_s": wall,
            "sweep_until_planned_s": t_grid, "sweep_open_s": t_skip - t_grid,
            "sweep_after_s": wall - t_skip, "cpu": cpu}


def startup(sweep_dir: Path) -> float:
    """Seconds of ``python experiments/sweep.py -m`` until its one-point plan is printed (a dry
    run: Python, imports, Hydra): what every ``sweep`` figure contains before any work."""
    rc, lines, _, _ = timed_lines(
        [sys.executable, "experiments/sweep.py", "-m", "seed=0", "clip.enabled=false",
         "train.accum_steps=1", "precision=fp32", "hydra.sweeper.dry_run=true",
         f"hydra.sweep.dir={sweep_dir}"], ENV, 600, {})
    if rc != 0:
        _fail("the dry run", rc, lines)
    return next(t for t, text in lines if "[sweep] grid:" in text)


def ui(uri: str, experiment_id: str, sweep_id: str, chart_run: str, profile: Path,
       groups: dict[str, list[int]]) -> dict[str, Any]:
    """Seconds until the MLflow UI shows the sweep, in a fresh browser profile.

    - ``runs_page_cold_s``: the experiment's runs page (nothing cached) until the sweep's
      parent row (``sweep <id>``) is listed; ``runs_page_warm_s``: the same page again;
    - ``grouped_s``: the runs grouped by ``stability.sweep_id`` (a shared view state, as in
      tests/test_ui_browser.py) until training runs are listed by name;
    - ``chart_s``: a training run's "Model metrics" tab until a per-step metric's line is
      drawn (its full history fetched and plotted).
    """
    from stability.tracking.uri import client

    view = {"groupBy": {"aggregateFunction": "average",
                        "groupByKeys": [{"mode": "tag", "groupByData": "stability.sweep_id"}]},
            "groupsExpanded": {}}
    client(uri).set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{VIEW_KEY}",
                                   json.dumps(view))
    base = f"{uri}/#/experiments/{experiment_id}"
    parent_row = f"document.body.innerText.includes({json.dumps('sweep ' + sweep_id)})"
    cpu = CpuWindow(groups)
    cpu.start()
    b = Browser(profile)
    try:
        out = {"runs_page_cold_s": b.time_until(f"{base}/runs", parent_row),
               "runs_page_warm_s": b.time_until(f"{base}/runs", parent_row),
               "grouped_s": b.time_until(f"{base}/runs?viewStateShareKey={VIEW_KEY}", RUN_ROW),
               "chart_s": b.time_until(f"{base}/runs/{chart_run}/model-metrics",
                                       "document.querySelectorAll('path.js-line').length > 0")}
    finally:
        b.close()
    return out | {"cpu": cpu.stop()}
