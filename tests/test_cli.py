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


@pytest.mark.parametrize(("command", "key", "meant", "config"), [
    ("sweep", "train.acum_steps=2", "train.accum_steps", "config"),
    ("report", "margn=2%", "margin", "report"),
])
def test_a_misspelled_key_is_one_line_with_did_you_mean(
        command: str, key: str, meant: str, config: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 59 item 7: Hydra's seven lines and ``+`` hint become one line naming the key."""
    monkeypatch.chdir(tmp_path)
    done = in_process([command, *(["-m"] if command == "sweep" else []), key, "seed=0,1"
                       if command == "sweep" else "experiment=x"], capsys)
    name = key.split("=")[0]
    assert done.code == 2
    assert done.stderr.strip() == (f"error: {name} is not a key of conf/{config}.yaml; did you "
                                   f"mean {meant}? (a key of your own is added with a leading "
                                   f"+: +{name}=...)")
    assert list(tmp_path.iterdir()) == []  # before Hydra: no outputs/, no store


def test_a_presets_own_keys_are_keys_and_a_misspelled_one_is_named() -> None:
    """A group added on the command line (``+study=gpu_lm``) brings its task's keys: they are no
    misspelling (the shrunk GPU study in tests/tasks/test_tasks.py), a near miss of one is."""
    from stability.groups import misspelled_key

    assert misspelled_key("config", ["-m", "+study=gpu_lm", "model.d_model=16",
                                     "precision=fp32,bf16"]) is None
    line = misspelled_key("config", ["-m", "+study=gpu_lm", "model.d_modl=16"])
    assert line is not None and "did you mean model.d_model?" in line
    assert misspelled_key("config", ["-m", "task=adding,sign_sum", "model.hidden=3"]) is None


def test_a_report_in_a_folder_without_a_store_names_it_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    done = in_process(["report"], capsys)
    assert done.code == 2
    assert done.stderr.strip() == (
        f"error: no MLflow store at sqlite:///{tmp_path / 'mlflow.db'} (the embedded store of "
        "this folder), so no study to report: run one first (make run, or stability sweep -m "
        "in this folder), or name the store that holds it (tracking.uri=http://host:5000 or "
        "sqlite:///path/mlflow.db)")
    assert list(tmp_path.iterdir()) == []  # no mlflow.db, no outputs/


def test_the_ui_banner_links_each_studys_runs_or_says_what_to_run(tmp_path: Path) -> None:
    from stability.tracking.contract import UI_TRAINING_VIEW
    from stability.tracking.server import prepare_store, ui_banner
    from stability.tracking.uri import client
    from tests.helpers.stores import sqlite_store

    uri = sqlite_store(tmp_path / "mlflow.db")
    prepare_store(uri)
    assert ui_banner(uri, 5000).splitlines()[1].startswith("no study in this store yet: run one")
    c = client(uri)
    exp = c.create_experiment("study-a")
    c.create_run(exp)
    c.create_experiment("empty-b")  # no runs: not listed
    lines = ui_banner(uri, 5000).splitlines()
    assert lines[0] == f"MLflow UI for {uri}: http://127.0.0.1:5000"
    assert lines[2:] == [f"  study-a: http://127.0.0.1:5000/#/experiments/{exp}{UI_TRAINING_VIEW}"]


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
