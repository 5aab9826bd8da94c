"""The tracking server used by the other tests really starts and answers."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.server


def test_real_server_round_trip(mlflow_server):
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    exp_id = client.create_experiment("fixture-check")
    run = client.create_run(exp_id)
    client.log_metric(run.info.run_id, "x", 1.5, step=3)
    history = client.get_metric_history(run.info.run_id, "x")
    assert [(m.step, m.value) for m in history] == [(3, 1.5)]
    assert mlflow_server.process.poll() is None


def test_many_concurrent_writers_do_not_exhaust_the_store_pool(mlflow_server, monkeypatch):
    # MLflow's SQL store takes a second pooled connection inside create_run and log_batch; with
    # SQLAlchemy's default pool (15) that many concurrent requests wait on each other until
    # the pool times out (30 s). start_server's environment (server.POOL_ENV) must prevent it:
    # 32 runs created and logged at once all answer within a request timeout below 30 s.
    from concurrent.futures import ThreadPoolExecutor

    from mlflow.entities import Metric

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    exp_id = client.create_experiment("pool-check")

    def writer(i: int) -> int:
        c = MlflowClient(tracking_uri=mlflow_server.uri)
        rid = c.create_run(exp_id).info.run_id
        c.log_batch(rid, metrics=[Metric("loss", float(s), 0, s) for s in range(200)])
        return len(c.get_metric_history(rid, "loss"))

    with ThreadPoolExecutor(max_workers=32) as pool:
        assert list(pool.map(writer, range(32))) == [200] * 32
