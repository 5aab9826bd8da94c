"""The MLflow UI really shows a sweep: headless Chromium renders the runs page of the server.

The UI is a React app, so the page is rendered with virtual time and its DOM dumped. Runs
nest under the sweep's parent (collapsed by default); grouping the runs table by the tag
``stability.sweep_id`` (a view state shared through an experiment tag, as the UI's Share
button does) shows every training run of the sweep by name.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from stability.core.config import TrackingConfig, to_run_config
from stability.sweep.job import train_tracked
from stability.sweep.parent import SweepSetup, open_sweep_run

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def render(url: str, profile: Path) -> str:
    """The DOM of ``url`` after 15 s of virtual time in headless Chromium."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--no-first-run", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=15000",
         "--dump-dom", url],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_sweep_runs_appear_in_the_mlflow_ui(mlflow_server, tmp_path: Path) -> None:
    assert Path(CHROMIUM).exists(), "install Chromium: apt-get install chromium (make setup-dev)"
    uri, exp = mlflow_server.uri, f"ui-{uuid.uuid4().hex[:8]}"
    sweep_id = f"ui-{uuid.uuid4().hex[:6]}"
    setup = SweepSetup(sweep_id=sweep_id, grid_size=2, arguments=("seed=0,1",),
                       grid={"seed": "0,1"})
    parent, _ = open_sweep_run(TrackingConfig(uri=uri, experiment=exp), setup, unique=2,
                               resume=True)
    names = []
    for seed in (0, 1):
        cfg = to_run_config({
            "seed": seed, "device": "cpu", "output_dir": str(tmp_path / str(seed)),
            "data": {"num_samples": 300}, "train": {"epochs": 1},
            "precision": {"name": "bf16"},
            "tracking": {"uri": uri, "experiment": exp, "sweep_id": sweep_id,
                         "parent_run_id": parent.run_id}})
        assert train_tracked(cfg).status == "finished"
        names.append(f"bf16 noclip acc=1 s={seed}")
    parent.close("FINISHED", {"runs_launched": 2})

    base = f"{uri}/#/experiments/{parent.experiment_id}/runs"
    nested = render(base, tmp_path / "profile-1")
    assert f"sweep {sweep_id}" in nested  # the parent row ...
    assert not any(n in nested for n in names)  # ... with its runs collapsed under it

    view = {"groupBy": {"aggregateFunction": "average",
                        "groupByKeys": [{"mode": "tag", "groupByData": "stability.sweep_id"}]},
            "groupsExpanded": {}}
    MlflowClient(uri).set_experiment_tag(parent.experiment_id, "mlflow.sharedViewState.bysweep",
                                         json.dumps(view))
    grouped = render(f"{base}?viewStateShareKey=bysweep", tmp_path / "profile-2")
    assert "Error loading shared view state" not in grouped
    assert sweep_id in grouped
    assert all(n in grouped for n in names), "the sweep's runs are not listed by name"
