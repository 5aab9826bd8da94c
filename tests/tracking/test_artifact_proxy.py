"""Artifacts logged by a client travel through the tracking server (proxied artifacts).

    .venv/bin/pytest tests/tracking/test_artifact_proxy.py

The ``mlflow_server`` fixture runs ``mlflow server --serve-artifacts --artifacts-destination
<root>/artifacts``, as docker-compose.yml does with ``s3://<bucket>/``: a run's artifact URI is
``mlflow-artifacts:/...``, so a sweep worker needs only ``MLFLOW_TRACKING_URI`` (no S3 keys,
no shared filesystem) and the server writes to its destination.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import mlflow
import pytest
from mlflow.artifacts import download_artifacts
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.server


@pytest.fixture
def tracking_uri(mlflow_server, monkeypatch):
    """The fluent API pointed at the server, and no S3 credentials in this client."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_S3_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    mlflow.set_tracking_uri(mlflow_server.uri)
    yield mlflow_server.uri
    mlflow.set_tracking_uri(None)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_logged_artifacts_land_in_the_server_destination_and_come_back_identical(
    mlflow_server, tracking_uri, tmp_path
):
    src = tmp_path / "src"
    (src / "checkpoints").mkdir(parents=True)
    csv = src / "steps.csv"
    csv.write_text("step,loss\n1,0.69\n2,0.52\n")
    ckpt = src / "checkpoints" / "best.pt"
    ckpt.write_bytes(os.urandom(64 * 1024))  # binary, not text-safe

    exp_id = MlflowClient(tracking_uri).create_experiment(f"artifact-proxy-{uuid.uuid4().hex[:8]}")
    with mlflow.start_run(experiment_id=exp_id) as run:
        mlflow.log_artifact(str(csv))
        mlflow.log_artifact(str(ckpt), artifact_path="checkpoints")
    run_id = run.info.run_id

    # Proxied: the client only ever saw an mlflow-artifacts:/ URI, never a path or s3:// URI.
    artifact_uri = MlflowClient(tracking_uri).get_run(run_id).info.artifact_uri
    assert artifact_uri.startswith("mlflow-artifacts:/"), artifact_uri
    assert artifact_uri.endswith(f"/{run_id}/artifacts")

    # The server wrote them under its --artifacts-destination.
    dest = mlflow_server.root / "artifacts"
    stored = {p.relative_to(dest).as_posix(): p for p in dest.rglob("*") if p.is_file()}
    run_prefix = artifact_uri.removeprefix("mlflow-artifacts:/").strip("/")
    assert f"{run_prefix}/steps.csv" in stored, sorted(stored)
    assert f"{run_prefix}/checkpoints/best.pt" in stored, sorted(stored)
    assert sha256(stored[f"{run_prefix}/checkpoints/best.pt"]) == sha256(ckpt)

    # And they download back byte-identical through the server.
    listed = {f.path for f in MlflowClient(tracking_uri).list_artifacts(run_id)}
    assert listed == {"steps.csv", "checkpoints"}
    out = Path(download_artifacts(run_id=run_id, dst_path=str(tmp_path / "dl"),
                                  tracking_uri=tracking_uri))
    assert (out / "steps.csv").read_text() == csv.read_text()
    assert sha256(out / "checkpoints" / "best.pt") == sha256(ckpt)
    one = download_artifacts(artifact_uri=f"{artifact_uri}/checkpoints/best.pt",
                             dst_path=str(tmp_path / "one"), tracking_uri=tracking_uri)
    assert sha256(Path(one)) == sha256(ckpt)
