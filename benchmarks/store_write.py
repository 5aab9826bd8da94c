"""What one metric point costs to write into the embedded SQLite store, in the writing process.

Two routes into the same fresh store, interleaved (A B A B, paired per round): MLflow's own
``log_batch`` (its SQL store in process: what a run on the embedded store paid before
``stability.tracking.direct``) and ``DirectMetrics`` (one transaction a flush, the rows MLflow
writes). Each round writes one full batch of ``BATCH`` per-step points (the eight per-step
metrics of 125 steps) to a run of its own route; the figure is process CPU (``time.process_time``)
per point, the median over rounds. Wall time is not reported: a commit waits for the disk,
which a sender thread does off the training thread.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from stability.tracking.buffer import send_metrics
from stability.tracking.contract import STEP_METRICS
from stability.tracking.direct import DirectMetrics

BATCH = 1000  # a full log_batch (MLflow's limit per call), as the sender sends them
ROUNDS = 7


def _points(first_step: int) -> list[tuple[str, float, int, int]]:
    ts = int(time.time() * 1000)
    steps = range(first_step, first_step + BATCH // len(STEP_METRICS))
    return [(k, 0.5 + 1e-3 * s, s, ts) for s in steps for k in STEP_METRICS]


def store_write_part(root: Path, rounds: int = ROUNDS) -> dict[str, Any]:
    """CPU microseconds per point of both routes, median over ``rounds`` paired rounds."""
    from mlflow.tracking import MlflowClient

    db = root / "store-write.db"
    c = MlflowClient(f"sqlite:///{db}")
    exp = c.create_experiment("store-write", artifact_location=(root / "art").as_uri())
    runs = {"mlflow": c.create_run(exp).info.run_id, "direct": c.create_run(exp).info.run_id}
    direct = DirectMetrics(db, lambda rid, pts: send_metrics(c, rid, pts))
    write = {"mlflow": lambda rid, pts: send_metrics(c, rid, pts), "direct": direct.log}
    for route in runs:  # warm-up: sessions, the connection, statement caches
        write[route](runs[route], _points(0))
    per_point: dict[str, list[float]] = {route: [] for route in runs}
    for r in range(1, rounds + 1):
        order = list(runs) if r % 2 else list(reversed(runs))
        for route in order:
            points = _points(r * BATCH)
            t0 = time.process_time()
            write[route](runs[route], points)
            per_point[route].append((time.process_time() - t0) / len(points) * 1e6)
    direct.close()
    ratios = [m / d for m, d in zip(per_point["mlflow"], per_point["direct"], strict=True)]
    return {"cpu_us_per_point": {k: statistics.median(v) for k, v in per_point.items()},
            "per_round": per_point, "mlflow_over_direct": statistics.median(ratios),
            "points_per_round": BATCH, "rounds": rounds}
