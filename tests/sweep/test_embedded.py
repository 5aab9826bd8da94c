"""The embedded default: a sweep with parallel workers on a brand-new SQLite store.

Two processes that open a fresh SQLite store at once race MLflow's schema migrations; the
sweeper creates store, experiment and parent run before any worker starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow

PROJECT = Path(__file__).resolve().parents[2]


def test_parallel_workers_on_a_fresh_sqlite_store(tmp_path: Path) -> None:
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    uri = f"sqlite:///{db}"
    cmd = [sys.executable, "experiments/sweep.py", "-m", "+sweep=smoke", "device=cpu",
           "hydra.launcher.n_jobs=2", "clip.enabled=false", "train.accum_steps=1",
           "precision=fp32,bf16", "seed=0,1", f"tracking.uri={uri}",
           "tracking.experiment=embedded", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    done = subprocess.run(cmd, cwd=PROJECT, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"MLFLOW_TRACKING_URI": ""})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    # MLflow's own INFO lines stay out of the terminal (its store is made by the sweeper alone,
    # under a lock: a second migration of a fresh store would have crashed the run above)
    assert "Creating initial MLflow database tables" not in out
    assert "runs 4/4 done," in done.stdout

    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("embedded")
    runs = c.search_runs([exp.experiment_id], filter_string="tags.`stability.kind` = 'train'")
    assert sorted(r.info.run_name for r in runs) == [
        "bf16 noclip acc=1 s=0", "bf16 noclip acc=1 s=1",
        "fp32 noclip acc=1 s=0", "fp32 noclip acc=1 s=1"]
    assert all(r.info.status == "FINISHED" for r in runs)
    # the joblib launcher really ran two workers: two runs were open at the same time
    spans = sorted((r.info.start_time, r.info.end_time) for r in runs)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False)), spans
    (parent,) = c.search_runs([exp.experiment_id],
                              filter_string="tags.`stability.kind` = 'sweep'")
    assert parent.info.status == "FINISHED"
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in runs)
    # Artifacts sit beside the store, not in the project's ./mlruns.
    for r in runs:
        assert (db.parent / "mlruns" / "embedded" / r.info.run_id / "artifacts" /
                "steps.csv").is_file()
    assert "mlflow ui --backend-store-uri " + uri in done.stdout
