"""`experiments/report.py` with bad arguments: a clear line naming the key, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers.in_process import in_process
from tests.helpers.report_fixtures import Spec, make_sweep

pytestmark = pytest.mark.server

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server_with_sweep(mlflow_server, tmp_path_factory):
    """One experiment with a sweep, one empty experiment."""
    make_sweep(mlflow_server.uri, "cli-has-sweep", "real-sweep",
               [Spec(precision="fp32", clip=None, accum=1, losses={0: 0.5})],
               tmp_path_factory.mktemp("cli"))
    MlflowClient(mlflow_server.uri).create_experiment("cli-empty")
    return mlflow_server.uri


def report(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"MLFLOW_TRACKING_URI": ""}
    return subprocess.run([sys.executable, str(PROJECT / "experiments" / "report.py"), *args,
                           f"output_dir={cwd / 'reports'}"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("args", "expected"), [
    (["experiment=cli-has-sweep", "sweep_id=no-such-sweep"],
     "sweep_id='no-such-sweep' is invalid: experiment 'cli-has-sweep' has no training runs "
     "with that sweep id; allowed values are its sweeps (latest first): real-sweep"),
    (["experiment=cli-empty"], "experiment='cli-empty' has no sweeps"),
    (["experiment=no-such-experiment"],
     "experiment='no-such-experiment' is invalid: no such experiment"),
    (["experiment=cli-has-sweep", "device=gpu"],
     "device='gpu' is invalid: allowed values are auto | cpu | cuda"),
])
def test_bad_arguments_fail_with_a_clear_message(server_with_sweep, tmp_path, args, expected,
                                                 monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    done = in_process(["report", f"tracking.uri={server_with_sweep}", *args,
                       f"output_dir={tmp_path / 'reports'}"], capsys)
    assert done.code == 2, done.stderr[-2000:]
    assert f"error: {expected}" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not (tmp_path / "reports").exists()  # nothing written for a rejected request


@pytest.mark.slow  # an end-to-end run over a few seconds (pyproject's marker)
def test_a_sweep_whose_runs_all_diverged_gets_a_one_line_answer_and_exit_3(mlflow_server,
                                                                           tmp_path):
    make_sweep(mlflow_server.uri, "cli-all-diverged", "dead",
               [Spec(precision="fp16", clip=None, accum=1, losses={0: "diverged", 1: "diverged"}),
                Spec(precision="fp32", clip=1.0, accum=1, losses={0: "failed"})],
               tmp_path / "sweep")
    done = report(f"tracking.uri={mlflow_server.uri}", "experiment=cli-all-diverged",
                  cwd=tmp_path)
    assert done.returncode == 3, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("answer: ")]
    assert lines == ["answer: nothing to recommend: none of the 3 training runs of sweep 'dead' "
                     "finished (2 diverged, 1 failed)"]
    assert "Traceback" not in done.stderr + done.stdout
    assert not (tmp_path / "reports").exists()
    c = MlflowClient(mlflow_server.uri)
    exp_id = c.get_experiment_by_name("cli-all-diverged").experiment_id
    assert not c.search_runs([exp_id], "tags.`stability.kind` = 'report'")  # no report run
