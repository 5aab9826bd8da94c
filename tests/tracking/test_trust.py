"""Nothing a run records holds a password, and nothing is lost to bad files (issue 19).

Real processes, a real ``mlflow server`` on 127.0.0.1 and real SQLite stores; nothing mocked.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from stability.core import rundir
from stability.tracking import journal
from stability.tracking.server import MlflowServer, free_port
from stability.tracking.uri import redact_uri
from tests.helpers.in_process import Done, call, in_process
from tests.helpers.processes import ENV, PROJECT, rows, start
from tests.helpers.stores import sqlite_store

TINY = ("data.num_samples=200", "device=cpu")
ONE_CONFIG = ("clip.enabled=false", "clip.max_norm=1.0", "train.accum_steps=1", "precision=fp32")
PASSWORD = "PLANTED-pw-7f3a9c"


def _run(script: str, *args: str, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"experiments/{script}", *args], cwd=PROJECT,
                          capture_output=True, text=True, env=env or ENV, timeout=timeout)


def _files(*roots: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for root in roots for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.server
def test_a_planted_password_is_in_no_output(mlflow_server: MlflowServer, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """user:password@ in tracking.uri and in $MLFLOW_TRACKING_URI: a run, a sweep, a report, a
    sync and a SLURM script later, no param, tag, artifact, log, journal or file holds it."""
    port = mlflow_server.uri.rsplit(":", 1)[1]
    secret_uri = f"http://alice:{PASSWORD}@127.0.0.1:{port}"
    exp = "pw-planted"
    outputs = []
    # The single run, the sync and the two refusals run in this process (the same entry point
    # as the shell's, ``tests/helpers/in_process.py``); the sweep and the report are processes.
    monkeypatch.chdir(PROJECT)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    one = in_process(["sweep", *TINY, "train.epochs=1", f"tracking.uri={secret_uri}",
                      f"tracking.experiment={exp}", f"hydra.run.dir={tmp_path / 'one'}"], capsys)
    assert one.code == 0, one.stderr[-3000:]
    env = ENV | {"MLFLOW_TRACKING_URI": secret_uri}
    sweep = _run("sweep.py", "-m", *TINY, *ONE_CONFIG, "train.epochs=1", "seed=0,1",
                 "hydra/launcher=basic", f"tracking.experiment={exp}",
                 f"hydra.sweep.dir={tmp_path / 'sweep'}", env=env)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    report = _run("report.py", f"experiment={exp}", f"tracking.uri={secret_uri}",
                  f"output_dir={tmp_path / 'reports'}", "plots=false", "registry.enabled=false",
                  "device=cpu", f"hydra.run.dir={tmp_path / 'report-log'}")
    assert report.returncode == 0, report.stderr[-3000:]
    sync = _sync(capsys, str(tmp_path), "--uri", secret_uri)
    assert sync.code == 0, sync.stderr[-3000:]
    refused = in_process(["sweep", "-m", *TINY, "seed=0", f"tracking.uri={secret_uri}",
                          f"hydra.sweep.dir={tmp_path / 'refused'}"], capsys)
    assert refused.code == 2  # a -m sweep refuses it in tracking.uri (Hydra records it)
    unreachable = in_process(["report", "tracking.uri=http://alice:"
                              f"{PASSWORD}@127.0.0.1:{free_port()}",
                              f"hydra.run.dir={tmp_path / 'report-log2'}"], capsys)
    assert unreachable.code == 2 and "is not reachable" in unreachable.stderr
    outputs += [one, sweep, report, sync, refused, unreachable]

    # the SLURM script a sweep would submit with that environment
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from submitit.slurm.slurm import _make_sbatch_string

    with initialize_config_dir(config_dir=str(PROJECT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    os.environ["MLFLOW_TRACKING_URI"] = secret_uri
    try:
        setup = OmegaConf.to_container(cfg.hydra.launcher.setup, resolve=True)
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    script = _make_sbatch_string(command="python job.py", folder=str(tmp_path / "slurm"),
                                 setup=setup)
    assert f"export MLFLOW_TRACKING_URI=http://127.0.0.1:{port}" in script

    c = MlflowClient(mlflow_server.uri)
    # this test's experiment only: the shared server holds other tests' planted runs (one keeps
    # its artifacts at a listener that is gone), which are not this test's outputs
    ids = [c.get_experiment_by_name(exp).experiment_id]
    runs = c.search_runs(ids, max_results=1000)
    assert len(runs) >= 4  # a run, a sweep parent and its 2 runs, a report run
    records = [json.dumps([r.data.params, r.data.tags, r.info.run_name]) for r in runs]
    art = tmp_path / "downloaded"
    for r in runs:
        c.download_artifacts(r.info.run_id, "", str(art / r.info.run_id))
    files = _files(tmp_path)  # run folders, journals, .hydra, logs, reports, downloads
    assert any(p.name == rundir.JOURNAL_NAME for p in files)
    assert any(p.name == "report.md" for p in files)
    leaks = [str(p) for p, data in files.items() if PASSWORD.encode() in data]
    leaks += [f"run record {i}" for i, text in enumerate(records) if PASSWORD in text]
    leaks += [f"output of command {i}" for i, p in enumerate(outputs)
              if PASSWORD in p.stdout + p.stderr]
    leaks += ["SLURM script"] if PASSWORD in script else []
    assert leaks == []
    one_run = next(r for r in runs if r.data.tags.get("stability.output_dir", "").endswith("one"))
    assert not [k for k in one_run.data.params if k.startswith("tracking.")]
    assert "tracking" not in (tmp_path / "one" / rundir.CONFIG_NAME).read_text()


class Listener:
    """A TCP listener on 127.0.0.1 that counts connections (the server a crafted journal names)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


def _pending_run(folder: Path, experiment: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A run trained while its server (a dead port) was away: its folder is pending sync."""
    done = in_process(["sweep", *TINY, "train.epochs=2",
                       f"tracking.uri=http://127.0.0.1:{free_port()}",
                       f"tracking.experiment={experiment}", "tracking.retry_s=1",
                       f"hydra.run.dir={folder}"], capsys)
    assert done.code == 0 and journal.is_pending(folder), done.stdout[-3000:] + done.stderr


def _sync(capsys: pytest.CaptureFixture[str], *args: str) -> Done:
    """``stability sync ARGS`` in this process (test_durability runs experiments/sync.py)."""
    from stability.cli import sync

    return call(lambda: sync(list(args)), capsys)


def _rewrite_journal(folder: Path, edit) -> None:  # noqa: ANN001
    path = folder / rundir.JOURNAL_NAME
    lines = path.read_text().splitlines()
    path.write_text("".join(x + "\n" for x in edit(lines)))


@pytest.mark.slow
@pytest.mark.server
def test_sync_sends_only_to_the_configured_server(
        mlflow_server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A crafted journal names a listener: the sync stops with one line, nothing is sent."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    out, listener = tmp_path / "run", Listener()
    _pending_run(out, "crafted", capsys)
    try:
        _rewrite_journal(out, lambda lines: [
            json.dumps(json.loads(x) | {"uri": f"http://127.0.0.1:{listener.port}"})
            if json.loads(x)["k"] == "run" else x for x in lines])
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
        for args in ([str(out), "--uri", mlflow_server.uri], [str(out)]):
            done = _sync(capsys, *args)
            assert done.code == 2, done.stdout + done.stderr
            (line,) = done.stderr.strip().splitlines()
            assert line.startswith(f"error: {out / rundir.JOURNAL_NAME} names tracking store "
                                   f"'http://127.0.0.1:{listener.port}', not the configured")
            assert "nothing was sent" in line and done.stdout == ""
        time.sleep(0.5)
        assert listener.connections == 0
        assert journal.is_pending(out)
        c = MlflowClient(mlflow_server.uri)
        assert c.get_experiment_by_name("crafted") is None
    finally:
        listener.close()


@pytest.mark.slow
@pytest.mark.server
def test_a_bad_journal_line_keeps_the_folder_pending(
        mlflow_server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A corrupted params line: nothing sent, still pending, file and line named; a torn last
    line alone is tolerated."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    out = tmp_path / "run"
    _pending_run(out, "corrupt", capsys)
    _rewrite_journal(out, lambda lines: [
        json.dumps(json.loads(x) | {"uri": mlflow_server.uri}) if json.loads(x)["k"] == "run"
        else x for x in lines])
    original = (out / rundir.JOURNAL_NAME).read_text()
    lines = original.splitlines()
    n = next(i for i, x in enumerate(lines) if json.loads(x)["k"] == "params")
    _rewrite_journal(out, lambda _: [*lines[:n], lines[n][:40] + "#garbage", *lines[n + 1:]])
    done = _sync(capsys, str(out), "--uri", mlflow_server.uri)
    assert done.code == 2
    assert done.stderr.strip() == (f"error: {out / rundir.JOURNAL_NAME}:{n + 1}: not a JSON "
                                   "record; nothing was sent, the folder stays pending")
    assert journal.is_pending(out)
    assert MlflowClient(mlflow_server.uri).get_experiment_by_name("corrupt") is None

    (out / rundir.JOURNAL_NAME).write_text(original + '{"k": "metrics", "ts": 1, "metr')
    done = _sync(capsys, str(out), "--uri", mlflow_server.uri)
    assert done.code == 0, done.stdout + done.stderr
    assert "8 params" not in done.stdout and " 0 params" not in done.stdout
    assert not journal.is_pending(out)
    c = MlflowClient(mlflow_server.uri)
    (r,) = c.search_runs([c.get_experiment_by_name("corrupt").experiment_id])
    assert r.info.status == "FINISHED" and r.data.params["train.epochs"] == "2"


def test_a_bad_steps_csv_cell_keeps_the_folder_pending(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    out = tmp_path / "run"
    _pending_run(out, "badcell", capsys)
    uri = sqlite_store(tmp_path / "store" / "mlflow.db")
    _rewrite_journal(out, lambda lines: [
        json.dumps(json.loads(x) | {"uri": uri}) if json.loads(x)["k"] == "run" else x
        for x in lines])
    csv_path = out / rundir.CSV_NAME
    table = csv_path.read_text().splitlines()
    cells = table[2].split(",")
    cells[table[0].split(",").index("skipped")] = "abc"
    csv_path.write_text("\n".join([table[0], table[1], ",".join(cells), *table[3:]]) + "\n")
    caplog.clear()
    done = _sync(capsys, str(out), "--uri", uri)
    assert done.code == 1  # one folder stays pending (logged with its reason)
    assert "synced 0 of 1 pending runs; 1 stay pending" in done.stdout
    # logged at WARNING or above: what the command's stderr shows (logging.basicConfig)
    assert any(f"{csv_path}:3: a row that is not numbers" in r.getMessage()
               for r in caplog.records if r.levelno >= logging.WARNING)
    assert journal.is_pending(out)
    assert not MlflowClient(uri).search_runs(
        [e.experiment_id for e in MlflowClient(uri).search_experiments()])


def test_a_new_run_moves_another_runs_records_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 1 started in seed 0's pending folder: seed 0's records move aside, whole."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    out = tmp_path / "run"
    _pending_run(out, "aside", capsys)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*")
              if p.is_file() and ".hydra" not in p.parts and p.suffix != ".log"}
    assert Path(rundir.JOURNAL_NAME) in before and Path(rundir.PENDING_NAME) in before
    # in this process, as _pending_run (the password test runs experiments/sweep.py itself)
    again = in_process(["sweep", *TINY, "train.epochs=1", "seed=1", "tracking.enabled=false",
                        f"hydra.run.dir={out}"], capsys)
    assert again.code == 0, again.stdout[-3000:] + again.stderr[-3000:]
    (aside,) = [p for p in out.iterdir() if p.name.startswith("aside-")]
    assert f"moved the previous run's records in {out} aside to {aside} (a run MLflow does " \
           "not hold completely (marked pending sync))" in again.stdout
    assert {rel: (aside / rel).read_bytes() for rel in before} == before
    assert rows(out / rundir.CSV_NAME) == 3 and not journal.is_pending(out)
    assert [p.parent for p in out.rglob(rundir.PENDING_NAME)] == [aside]  # sync finds it


def test_journal_reader_tolerates_only_a_torn_last_line(tmp_path: Path) -> None:
    j = journal.Journal(tmp_path, append=False)
    j.write("run", run_id="r1", uri="http://h", experiment="e", run_name="n", tags={})
    j.write("params", params={"a": "1"})
    j.close()
    path = tmp_path / rundir.JOURNAL_NAME
    whole = path.read_text()
    path.write_text(whole + '{"k": "params", "ts": 1, "par')  # killed mid-line
    assert journal.read(tmp_path).params == {"a": "1"}
    j = journal.Journal(tmp_path, append=True)  # a resumed run appends after the torn line
    j.write("params", params={"b": "2"})
    j.close()
    assert journal.read(tmp_path).params == {"a": "1", "b": "2"}
    path.write_text(whole.replace('"a": "1"', '"a": 1]') + whole)
    with pytest.raises(journal.JournalError, match=rf"{path}:2: not a JSON record"):
        journal.read(tmp_path)
    path.write_text(whole.replace('{"a": "1"}', '"oops"'))
    with pytest.raises(journal.JournalError, match=rf"{path}:2: a 'params' record"):
        journal.read(tmp_path)


def test_disk_full_is_one_line_and_leaves_no_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """best.pt's temp file leads to /dev/full (ENOSPC from the kernel): one line, exit 1."""
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "best.tmp").symlink_to("/dev/full")
    monkeypatch.chdir(tmp_path)
    done = in_process(["sweep", *TINY, "train.epochs=1", "tracking.enabled=false",
                       f"hydra.run.dir={out}"], capsys)
    assert done.code == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: disk full: cannot write {out / rundir.CHECKPOINT_NAME} (no space left on "
        "device); free space and run again (it resumes from its last whole epoch)")
    assert "Traceback" not in done.stderr
    assert not os.path.lexists(out / "checkpoints" / "best.tmp")
    assert not (out / rundir.CHECKPOINT_NAME).exists()


def test_redact_uri_strips_userinfo_everywhere_in_a_text() -> None:
    assert redact_uri("at http://alice:s3cret@h:5000/x and postgresql+psycopg2://u:p@db/x "
                      "sqlite:////tmp/a@b/mlflow.db") == (
        "at http://h:5000/x and postgresql+psycopg2://db/x sqlite:////tmp/a@b/mlflow.db")


@pytest.mark.slow
@pytest.mark.server
def test_make_ui_and_a_sweep_on_a_fresh_store_do_not_race(tmp_path: Path) -> None:
    """`make ui` (python -m stability.tracking.server) and a sweep start on a new store."""
    for attempt in range(3):
        store = tmp_path / f"fresh{attempt}" / "mlflow.db"
        store.parent.mkdir()
        uri = f"sqlite:///{store}"
        ui = subprocess.Popen([sys.executable, "-m", "stability.tracking.server", "--store", uri,
                               "--port", str(free_port())], cwd=PROJECT, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
        try:
            sweep = start("sweep.py", "-m", *TINY, *ONE_CONFIG, "train.epochs=1", "seed=0",
                          "hydra/launcher=basic", f"tracking.uri={uri}",
                          f"hydra.sweep.dir={tmp_path / f'sweep{attempt}'}")
            output = sweep.communicate(timeout=300)[0]
            assert sweep.returncode == 0, output[-3000:]
            assert "finished=1" in output, output[-3000:]
        finally:
            os.killpg(ui.pid, 15)
            ui.wait(timeout=30)


def test_a_dead_sweeps_parent_is_ended_killed(tmp_path: Path) -> None:
    """A sweep parent whose process exited is ended KILLED with a reason; a live one is not."""
    from stability.tracking.contract import Kind, Tag
    from stability.tracking.orphans import end_stale_runs
    from stability.tracking.uri import client, ensure_experiment

    uri = sqlite_store(tmp_path / "mlflow.db")
    exp_id = ensure_experiment(uri, "parents")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    c = client(uri)
    now = str(int(time.time() * 1000))
    gone = c.create_run(exp_id, tags={Tag.KIND: Kind.SWEEP, Tag.SWEEP_ID: "s1",
                                      Tag.PROCESS: f"{socket.gethostname()}:{dead}",
                                      Tag.HEARTBEAT: now}).info.run_id
    alive = c.create_run(exp_id, tags={Tag.KIND: Kind.SWEEP, Tag.SWEEP_ID: "s2",
                                       Tag.PROCESS: f"{socket.gethostname()}:{os.getpid()}",
                                       Tag.HEARTBEAT: now}).info.run_id
    assert end_stale_runs(uri, "parents") == 1
    ended = c.get_run(gone)
    assert ended.info.status == "KILLED" and ended.data.tags[Tag.OUTCOME] == "killed"
    assert ended.data.tags[Tag.REASON].startswith(
        "the sweep process ended without closing its run: no heartbeat since ")
    assert c.get_run(alive).info.status == "RUNNING"


def test_filter_values_are_plain_names() -> None:
    """MLflow does not unescape \\' in a filter: a quote can never reach one."""
    from stability.core.config import ConfigError
    from stability.tracking.contract import Kind, search_filter

    assert search_filter(Kind.TRAIN, "20261201-101010-abc123").endswith("'20261201-101010-abc123'")
    with pytest.raises(ConfigError, match="sweep_id=\"x'y\" is invalid"):
        search_filter(Kind.TRAIN, "x'y")


def test_a_lost_migration_race_is_recognised(tmp_path: Path) -> None:
    """The errors another opener's migration leaves are "already exists"-class (retried once);
    any other error is not."""
    import sqlalchemy

    from stability.tracking.uri import already_exists

    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE t (a INTEGER)"))
    errors = []
    for sql in ("CREATE TABLE t (a INTEGER)", "ALTER TABLE t ADD COLUMN a INTEGER",
                "SELECT * FROM missing"):
        try:
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text(sql))
        except sqlalchemy.exc.OperationalError as err:
            errors.append(err)
    assert [already_exists(e) for e in errors] == [True, True, False]


# -- L: a sync writes only into the run its own journal created for that folder ----------------

def _handed_over(folder: Path, uri: str, run_id: str | None, secret: Path) -> Path:
    """A run folder as an attacker hands it over: its journal names ``run_id`` (or no run),
    asks for new params and a FAILED end, and its ``config.yaml`` is a symlink to a secret."""
    folder.mkdir(parents=True)
    j = journal.Journal(folder, append=False)
    j.write("run", run_id=run_id, uri=uri, experiment="l31", run_name="handed over",
            tags={"stability.kind": "train", "stability.outcome": "failed"})
    j.write("params", params={"train.lr": "999", "planted": "1"})
    j.write("end", status="FAILED", outcome="failed")
    j.close()
    (folder / rundir.CONFIG_NAME).symlink_to(secret)
    (folder / rundir.CSV_NAME).write_text("step,epoch,loss\n")
    journal.mark_pending(folder, "handed over")
    return folder


def test_sync_writes_only_into_the_folders_own_run_and_never_through_a_symlink(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """L: a handed-over folder whose journal names the victim's run id changes nothing of it
    (another folder's run, or a FINISHED one), in one line each; a folder whose run never
    reached the server gets a run of its own, and its symlinked config.yaml stays local."""
    from stability.cli import sync
    from stability.tracking.artifacts import uploaded
    from stability.tracking.contract import Tag
    from stability.tracking.sync import SyncError, sync_folder
    from stability.tracking.uri import ensure_experiment

    uri = sqlite_store(tmp_path / "mlflow.db")
    c = MlflowClient(uri)
    exp_id = ensure_experiment(uri, "l31")
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-l31\n")
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()

    def victim(folder: Path) -> str:
        rid = c.create_run(exp_id, tags={Tag.OUTPUT_DIR: str(folder),
                                         Tag.OUTCOME: "finished"}).info.run_id
        c.log_param(rid, "train.lr", "0.002")
        c.set_terminated(rid, "FINISHED")
        return rid

    def state(rid: str) -> tuple[Any, ...]:
        r = c.get_run(rid)
        return r.info.status, r.data.params, r.data.tags, uploaded(c, rid)

    theirs = victim(victim_dir)
    before = state(theirs)
    folder = _handed_over(tmp_path / "handed" / "a", uri, theirs, secret)
    with pytest.raises(SyncError) as err:
        sync_folder(folder, uri)
    assert str(err.value) == (
        f"run {theirs} records folder '{victim_dir}' (stability.output_dir), not "
        f"{folder.resolve()}: a sync writes only into the folder's own run; nothing was sent, "
        "the folder stays pending")
    assert state(theirs) == before and journal.is_pending(folder)
    # the command: the folder stays pending (exit 1), its reason on one line
    assert sync([str(folder), "--uri", uri]) == 1
    out = capsys.readouterr()
    assert "synced 0 of 1 pending runs; 1 stay pending" in out.out
    [line] = [r.getMessage() for r in caplog.records if theirs in r.getMessage()]
    assert line.startswith(f"not synced, stays pending: {folder.resolve()}: run {theirs} "
                           "records folder") and "\n" not in line
    assert state(theirs) == before

    # a FINISHED run that does record this folder: nothing of it changes either
    own = _handed_over(tmp_path / "handed" / "b", uri, None, secret)
    finished = victim(own)
    journal.append(own, "run_id", run_id=finished)
    before = state(finished)
    with pytest.raises(SyncError, match=(
            rf"^run {finished} is FINISHED: a sync never changes a finished run \(this one "
            r"would send 1 params; tags stability.kind, stability.outcome; artifacts steps.csv; "
            rf"status FAILED\); nothing was sent, {own} stays pending$")):
        sync_folder(own, uri)
    assert state(finished) == before

    # never reached the server: created, everything sent but the symlink
    fresh = _handed_over(tmp_path / "handed" / "c", uri, None, secret)
    done = sync_folder(fresh, uri)
    assert done.created and done.status == "FAILED"
    assert set(uploaded(c, done.run_id)) == {rundir.CSV_NAME}
    assert c.get_run(done.run_id).data.params == {"train.lr": "999", "planted": "1"}
