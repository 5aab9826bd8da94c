"""Metric rows written straight into the embedded store equal the rows MLflow's store writes."""

from __future__ import annotations

import csv
import math
import sqlite3
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from stability.tracking.direct import DirectMetrics, sanitized
from tests.helpers.stores import sqlite_store

# Every rule MLflow applies: NaN, both infinities, an exact resend, steps out of order, a
# later point of a key at a lower step (latest_metrics keeps the highest step), equal steps
# told apart by timestamp, then by value.
POINTS = [("loss", 0.7, 1, 1000), ("loss", math.nan, 2, 1001), ("loss", 0.5, 3, 1002),
          ("loss", 0.5, 3, 1002), ("loss", 0.6, 1, 1003), ("scale", math.inf, 1, 1000),
          ("scale", -math.inf, 2, 1000), ("lr", 2e-3, 5, 1000), ("lr", 1e-3, 5, 1001),
          ("acc", 0.25, 4, 1000), ("acc", 0.75, 4, 1000), ("grad", math.nan, 9, 1000)]
LATER = [("loss", 0.4, 2, 2000), ("lr", 3e-3, 6, 900), ("grad", 1.0, 9, 1000)]


def store(tmp_path: Path) -> tuple[str, MlflowClient, str]:
    uri = sqlite_store(tmp_path / "mlflow.db")
    c = MlflowClient(uri)
    exp = c.create_experiment("direct", artifact_location=(tmp_path / "art").as_uri())
    return uri, c, exp


def rows(db: Path, table: str, run_id: str) -> list[tuple]:
    with sqlite3.connect(db) as con:
        cols = "key, value, timestamp, step, is_nan"
        return sorted(con.execute(f"SELECT {cols} FROM {table} WHERE run_uuid = ?", (run_id,)))


def via_mlflow(c: MlflowClient, run_id: str, points: list) -> None:
    c.log_batch(run_id, metrics=[Metric(k, v, ts, step) for k, v, step, ts in points],
                synchronous=True)


def test_direct_rows_equal_mlflows_own_and_read_back_the_same(tmp_path: Path) -> None:
    _, c, exp = store(tmp_path)
    db = tmp_path / "mlflow.db"
    ours, theirs = c.create_run(exp).info.run_id, c.create_run(exp).info.run_id
    fallbacks: list = []
    direct = DirectMetrics(db, lambda rid, pts: fallbacks.append(pts))
    for batch in (POINTS, LATER, POINTS):  # the last one: a whole resend, ignored
        direct.log(ours, batch)
        via_mlflow(c, theirs, batch)
    direct.close()
    assert direct.direct is True and fallbacks == []
    for table in ("metrics", "latest_metrics"):
        assert rows(db, table, ours) == rows(db, table, theirs), table
    assert len(rows(db, "metrics", ours)) == len(set(POINTS + LATER))  # resends dropped
    a, b = c.get_run(ours).data.metrics, c.get_run(theirs).data.metrics
    assert a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k])
                                        for k in a)
    assert a["loss"] == 0.5 and a["lr"] == 3e-3 and a["acc"] == 0.75
    for key in ("loss", "scale"):
        hist = [(m.step, m.timestamp, str(m.value)) for m in c.get_metric_history(ours, key)]
        ref = [(m.step, m.timestamp, str(m.value)) for m in c.get_metric_history(theirs, key)]
        assert sorted(hist) == sorted(ref)  # str: nan == nan


def test_a_deleted_run_refuses_metrics_as_mlflow_does(tmp_path: Path) -> None:
    _, c, exp = store(tmp_path)
    run_id = c.create_run(exp).info.run_id
    c.delete_run(run_id)
    direct = DirectMetrics(tmp_path / "mlflow.db", lambda rid, pts: None)
    with pytest.raises(MlflowException) as ours:
        direct.log(run_id, POINTS)
    with pytest.raises(MlflowException) as theirs:
        via_mlflow(c, run_id, POINTS)
    assert ours.value.error_code == theirs.value.error_code == "INVALID_PARAMETER_VALUE"
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(MlflowException) as missing:
        direct.log("0" * 32, POINTS)
    assert missing.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    assert rows(tmp_path / "mlflow.db", "metrics", run_id) == []


def test_a_schema_it_does_not_know_goes_through_mlflow(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as con:  # e.g. a later MLflow with one more column
        con.execute("CREATE TABLE metrics (key, value, timestamp, run_uuid, step, is_nan, "
                    "model_id)")
        con.execute("CREATE TABLE latest_metrics (key, value, timestamp, step, is_nan, "
                    "run_uuid)")
    sent: list = []
    direct = DirectMetrics(db, lambda rid, pts: sent.append((rid, pts)))
    direct.log("r1", POINTS[:2])
    assert direct.direct is False and sent == [("r1", POINTS[:2])]
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM metrics").fetchone() == (0,)


def test_a_run_on_the_embedded_store_keeps_every_per_step_point(tmp_path: Path) -> None:
    """The default path end to end: per-step histories equal steps.csv (a skipped step too)."""
    from stability.core.config import to_run_config
    from stability.sweep.job import train_tracked
    from stability.tracking.contract import EPOCH_METRICS, STEP_METRICS

    # every StepLog field marked metric (tests/tracking/test_contract.py pins the names the UI
    # charts)
    assert len(STEP_METRICS) >= 8

    uri = sqlite_store(tmp_path / "mlflow.db")
    cfg = to_run_config({
        "seed": 1, "device": "cpu", "output_dir": str(tmp_path / "run"),
        "data": {"num_samples": 300}, "train": {"epochs": 2, "batch_size": 32},
        "precision": {"name": "fp16", "growth_interval": 3}, "fault": {"inf_grad_at_step": 3},
        "clip": {"enabled": True, "max_norm": 0.5}, "tracking": {"uri": uri,
                                                                  "experiment": "direct-e2e"}})
    result = train_tracked(cfg)
    c = MlflowClient(uri)
    (run,) = c.search_runs([c.get_experiment_by_name("direct-e2e").experiment_id])
    assert run.info.status == "FINISHED"
    with result.csv_path.open() as f:
        csv_rows = list(csv.DictReader(f))
    assert any(r["skipped"] == "1" for r in csv_rows)  # the injected inf gradient
    for key in STEP_METRICS:
        history = sorted(c.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == list(range(1, len(csv_rows) + 1)), key
        # as MLflow's own store keeps them: an infinity as the largest double
        expected = [str(sanitized(float(r[key]))[0]) if r[key] != "nan" else "nan"
                    for r in csv_rows]
        assert [str(m.value) for m in history] == expected, key
    for key in EPOCH_METRICS:
        assert [m.step for m in c.get_metric_history(run.info.run_id, key)] == [1, 2], key
    assert run.data.metrics["optimizer_steps"] == len(csv_rows)
    assert run.data.metrics["loss"] == float(csv_rows[-1]["loss"])  # latest_metrics
