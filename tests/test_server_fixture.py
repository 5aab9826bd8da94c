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
