"""The ``stability`` command: the own-task example end to end, and a non-editable install.

The console script runs as a real subprocess (``stability ui``, a non-editable install); the
own-task study and the unknown command call the same entry point in this process
(``tests.helpers.in_process``), with Hydra, the joblib-free basic launcher and the store all real;
nothing is mocked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from stability.tracking.contract import Kind, Tag
from stability.tracking.server import MlflowServer
from tests.helpers.in_process import in_process

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "own_task"
SCRIPT = Path(sys.executable).parent / "stability"  # this venv's console script


def _run(cmd: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # an end-to-end run over a few seconds (pyproject's marker)
@pytest.mark.server
def test_ui_serves_the_store_of_the_folder_it_runs_in(tmp_path: Path) -> None:
    """``stability ui`` (``make ui`` runs the same server) answers /health on ./mlflow.db."""
    import signal
    import time
    import urllib.request

    from stability.tracking.server import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen([str(SCRIPT), "ui", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline, healthy = time.monotonic() + 120, False
        while time.monotonic() < deadline and proc.poll() is None and not healthy:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    healthy = r.status == 200
            except OSError:
                time.sleep(0.5)
        assert healthy, proc.stdout.read() if proc.poll() is not None else "no /health"
        assert (tmp_path / "mlflow.db").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_unknown_command_names_the_allowed_ones(capsys: pytest.CaptureFixture[str]) -> None:
    proc = in_process(["train"], capsys)
    assert proc.code == 2
    assert proc.stderr.strip() == ("error: unknown command 'train': allowed values are "
                                   "sweep | report | check | ui | sync")


@pytest.mark.slow
@pytest.mark.server
def test_the_own_task_example_sweeps_and_reports_against_a_server(
    tmp_path: Path, mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """README "Study your own model": -m sweep and report of examples/own_task (narrowed)."""
    folder = tmp_path / "own_task"
    shutil.copytree(EXAMPLE, folder)
    monkeypatch.chdir(folder)  # `stability` puts the folder it runs in on the import path
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delitem(sys.modules, "my_task", raising=False)
    uri = f"tracking.uri={mlflow_server.uri}"
    sweep = in_process(["sweep", "-m", "--config-dir", ".", "task=my_task", uri,
                        "hydra/launcher=basic", "train.epochs=2", "task.num_samples=400",
                        "seed=0", "precision=fp32", "tracking.experiment=own-e2e"], capsys)
    assert sweep.code == 0, sweep.stderr[-3000:]
    assert "finished=4" in sweep.stdout + sweep.stderr  # clip off/on x accum 1/4, one seed
    c = mlflow.MlflowClient(mlflow_server.uri)
    exp = c.get_experiment_by_name("own-e2e")
    runs = c.search_runs([exp.experiment_id], f"tags.`{Tag.KIND}` = '{Kind.TRAIN}'")
    assert len(runs) == 4
    assert {r.data.params["task._target_"] for r in runs} == {"my_task.MyTask"}
    assert {r.data.params["task.num_samples"] for r in runs} == {"400"}

    report = in_process(["report", "experiment=own-e2e", "task_target=my_task.MyTask", uri],
                        capsys)
    assert report.code == 0, report.stderr[-3000:]
    md = next(folder.glob("reports/*/report.md")).read_text()
    assert "Train with" in md
    winners = [r for r in c.search_runs([exp.experiment_id], f"tags.`{Tag.KIND}` = "
                                        f"'{Kind.TRAIN}'") if "test_acc" in r.data.metrics]
    assert winners and all(0 <= r.data.metrics["test_acc"] <= 1 for r in winners)
    assert not (folder / "mlflow.db").exists()  # everything went to the server


@pytest.mark.slow
def test_a_non_editable_install_runs_a_sweep_from_any_folder(tmp_path: Path) -> None:
    """``pip install .`` (no -e) into a fresh venv: ``stability`` works in an empty folder."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # The dependencies (torch, mlflow, hydra...) come from this venv's site-packages through a
    # .pth line; a path added that way is not scanned for .pth files, so this venv's editable
    # finder for stability stays inactive and only the installed copy can be imported.
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    site.mkdir(parents=True, exist_ok=True)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = venv / "bin" / "python"
    install = _run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", str(ROOT)], tmp_path)
    assert install.returncode == 0, install.stderr[-3000:]

    work = tmp_path / "somewhere"
    work.mkdir()
    where = _run([str(python), "-c", "import stability; print(stability.__file__)"], work)
    # the installed copy, not the checkout (by resolved folder, not a prefix of the text)
    assert Path(where.stdout.strip()).resolve().is_relative_to(site.resolve())
    proc = _run([str(venv / "bin" / "stability"), "sweep", "train.epochs=1",
                 "data.num_samples=100", "tracking.experiment=installed"], work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (work / "mlflow.db").exists()
    assert not (site / "mlflow.db").exists() and not (ROOT / "stability" / "mlflow.db").exists()
    exp = mlflow.MlflowClient(f"sqlite:///{work / 'mlflow.db'}").get_experiment_by_name(
        "installed")
    assert exp is not None


@pytest.mark.slow
def test_the_own_task_examples_study_chooses_a_config_no_worse_than_the_median(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """The README's three commands on examples/own_task as shipped (24 runs): the chosen config's
    mean best validation loss is not worse than the median config's by more than the margin
    (accum 4 makes fewer optimizer steps in the same epochs: cheaper by undertraining, never the
    answer), and its clipping threshold clips."""
    folder = tmp_path / "own_task"
    shutil.copytree(EXAMPLE, folder)
    monkeypatch.chdir(folder)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delitem(sys.modules, "my_task", raising=False)
    sweep = _run([str(SCRIPT), "sweep", "-m", "--config-dir", ".", "task=my_task"], folder, 900)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    report = in_process(["report", "experiment=my_task", "task_target=my_task.MyTask"], capsys)
    assert report.code == 0, report.stderr[-3000:]
    assert "Train with `" in report.stdout and "at most (MCB 95%)" in report.stdout
    summary = pd.read_csv(next(folder.glob("reports/*/summary.csv")))
    c = mlflow.MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    exp = c.get_experiment_by_name("my_task")
    runs = [r for r in c.search_runs([exp.experiment_id], f"tags.`{Tag.KIND}` = '{Kind.TRAIN}'")]
    assert len(runs) == 24
    by_config: dict[str, list[float]] = {}
    for r in runs:
        by_config.setdefault(r.data.tags[Tag.FINGERPRINT], []).append(
            r.data.metrics["best_val_loss"])
    means = {fp: float(np.mean(v)) for fp, v in by_config.items()}
    chosen = str(summary.loc[summary["winner"].astype(str) == "True", "fingerprint"].iloc[0])
    margin = 0.05 * min(means.values())
    assert means[chosen] <= float(np.median(list(means.values()))) + margin
    clipped = [r.data.metrics["clip_fraction"] for r in runs
               if r.data.params["clip.enabled"] == "True"]
    assert min(clipped) > 0.01
