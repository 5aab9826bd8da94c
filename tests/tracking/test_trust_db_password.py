"""A database password is in no file we or our launchers write, nor on any command line (46, 2).

A real PostgreSQL cluster on 127.0.0.1 (``tests/helpers/postgres.py``) with password
authentication over TCP; the store URI ``postgresql+psycopg2://user:<password>@host/db``. A
``-m`` sweep through submitit's local launcher and ``stability ui`` run as a user runs them;
every file under the sweep folder (``multirun.yaml``, ``.hydra/``, ``.submitit/`` pickles, run
folders, logs) and every command line of the started server is searched for the password.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from stability.tracking.server import free_port
from tests.helpers.in_process import in_process
from tests.helpers.processes import PROJECT

pytestmark = [pytest.mark.slow, pytest.mark.server]

USER, PASSWORD, DB = "stab", "dbpw46secret", "tracking"


@pytest.fixture(scope="module")
def store() -> Iterator[str]:
    """The URI of a fresh PostgreSQL database, password included (as a user would write it)."""
    from tests.helpers.postgres import start_postgres

    pg = start_postgres(USER, PASSWORD, DB, "auth")
    try:
        yield pg.url(DB)
    finally:
        pg.stop()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGPASSWORD", "MLFLOW_TRACKING_URI")}
    return env | {"PYTHONPATH": str(PROJECT)} | extra


def _leaks(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]


def test_a_sweep_through_submitit_writes_the_password_nowhere(store: str, tmp_path: Path) -> None:
    """``MLFLOW_TRACKING_URI`` holds the password: the sweep and its submitit job run against
    PostgreSQL (the password travels in ``PGPASSWORD``), and no file holds it."""
    sweep_dir = tmp_path / "multirun"
    done = subprocess.run(
        [sys.executable, str(PROJECT / "experiments" / "sweep.py"), "-m", "+sweep=smoke",
         "device=cpu", "seed=0", "clip.enabled=false", "train.accum_steps=1", "precision=fp32",
         "hydra/launcher=submitit_local", "tracking.experiment=pw",
         f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path, env=_env(MLFLOW_TRACKING_URI=store),
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "runs 1/1 done," in done.stdout
    assert list(sweep_dir.glob(".submitit/*/*_submitted.pkl"))
    assert list(sweep_dir.glob(".submitit/*/*_result.pkl"))
    assert (sweep_dir / "multirun.yaml").is_file()
    assert _leaks(tmp_path) == []  # the sweep folder, and mlruns/ (the store's artifacts)
    assert PASSWORD not in done.stdout + done.stderr

    from mlflow.tracking import MlflowClient

    c = MlflowClient(store)  # the password is in this URI: our own check reads the store
    exp = c.get_experiment_by_name("pw")
    runs = c.search_runs([exp.experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]  # parent + run


def test_a_password_in_tracking_uri_of_a_sweep_is_refused_before_any_file(
        store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """On the command line, Hydra would record it in ``multirun.yaml`` and in every job's
    overrides: refused in one line (exit 2), the password not shown, no file written."""
    monkeypatch.chdir(PROJECT)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.delenv("PGPASSWORD", raising=False)
    done = in_process(["sweep", "-m", "+sweep=smoke", "device=cpu", "seed=0",
                       f"tracking.uri={store}", f"hydra.sweep.dir={tmp_path / 'multirun'}"],
                      capsys)
    assert done.code == 2, done.stderr[-3000:]
    assert "tracking.uri must not carry a password" in done.stderr
    assert "PGPASSWORD" in done.stderr and PASSWORD not in done.stdout + done.stderr
    assert _leaks(tmp_path) == []


def _cmdlines(session: int) -> list[str]:
    """The command lines of every process of a session (``ps`` shows them to anyone)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.getsid(int(proc.name)) == session:
                out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ProcessLookupError):
            continue
    return out


def test_the_ui_gets_its_store_and_password_through_the_environment(store: str,
                                                                    tmp_path: Path) -> None:
    """``stability ui`` on the PostgreSQL store: the server answers from the database, and
    neither its command line nor its uvicorn workers' shows the password (or the URI)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from stability.cli import main; main(sys.argv[1:])",
         "ui", "--port", str(port)], cwd=tmp_path, env=_env(MLFLOW_TRACKING_URI=store),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline, answered = time.monotonic() + 120, b""
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=5"
        while time.monotonic() < deadline and proc.poll() is None and not answered:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    answered = r.read()
            except OSError:
                time.sleep(0.5)
        assert answered, proc.stdout.read() if proc.poll() is not None else "no answer"
        assert b'"experiments"' in answered  # read from PostgreSQL: the password reached it
        lines = _cmdlines(proc.pid)
        assert len(lines) >= 2  # mlflow server and its uvicorn worker(s)
        assert [x for x in lines if PASSWORD in x or "postgresql" in x] == []
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert PASSWORD not in proc.stdout.read()
