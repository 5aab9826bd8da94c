"""Tracking that survives the network (issue 13): real servers, real processes, real kills.

Each test records what MLflow held afterwards against ``steps.csv``: one point per CSV row for
every per-step metric, the summary, the artifacts and the final status.

What is killed, restarted or raced is a real process; a run that only sets the scene (a
reference run, a run that finds no server, a report) is the ``stability`` command in this
process (``tests/helpers/in_process.py``), which skips the ~7 s of imports of a new interpreter.
"""

from __future__ import annotations

import csv
import json
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from stability.core import rundir
from stability.tracking.contract import EPOCH_METRICS, STEP_METRICS, Tag
from stability.tracking.server import free_port, start_server
from stability.tracking.sync import sync_folder, sync_paths
from tests.helpers.in_process import in_process
from tests.helpers.processes import kill_group, rows, run, start, wait_for
from tests.helpers.stores import sqlite_store

pytestmark = pytest.mark.slow  # real processes; the ones with a real mlflow server: server
TINY = ("data.num_samples=200", "device=cpu")
# Every key of the study grid narrowed to one value (then seed=... is the whole grid).
ONE_CONFIG = ("clip.enabled=false", "clip.max_norm=1.0", "train.accum_steps=1", "precision=fp32")


def _runs(uri: str, experiment: str) -> list:
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment} at {uri}"
    return c.search_runs([exp.experiment_id], filter_string="tags.`stability.kind` = 'train'")


def _first_epoch_sent(uri: str, experiment: str) -> bool:
    """Whether the server holds the run's first epoch (sent in one batch at its end)."""
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(experiment)
    runs = [] if exp is None else c.search_runs([exp.experiment_id])
    return any(c.get_metric_history(r.info.run_id, "train_loss") for r in runs)


def assert_complete(uri: str, run_id: str, folder: Path) -> int:
    """MLflow holds every CSV row once per step metric, each epoch, the summary, artifacts."""
    c = MlflowClient(uri)
    r = c.get_run(run_id)
    with (folder / rundir.CSV_NAME).open() as f:
        table = list(csv.DictReader(f))
    steps = [int(row["step"]) for row in table]
    for key in STEP_METRICS:
        history = sorted(c.get_metric_history(run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == steps, key  # one point per row, no duplicates
        if key == "loss":
            assert [m.value for m in history] == [float(row["loss"]) for row in table]
    epochs = int(r.data.params["train.epochs"])
    for key in EPOCH_METRICS:
        assert [m.step for m in c.get_metric_history(run_id, key)] == list(
            range(1, epochs + 1)), key
    assert r.data.metrics["optimizer_steps"] == len(table)
    assert {"best_val_loss", "wall_time_s", "clip_fraction"} <= set(r.data.metrics)
    names = {a.path for a in c.list_artifacts(run_id)}
    assert {"steps.csv", "config.yaml", "checkpoints"} <= names
    return len(table)


@pytest.mark.server
def test_server_restart_mid_run_loses_nothing(tmp_path: Path) -> None:
    """The server dies after the first epoch went out and comes back on the same port/store.

    It comes back once the run has found it gone (a send failed: the run logged "not
    answering"), so the run certainly met the gap; the run may still be training then, or
    already be delivering its last calls: either way it has not ended, and nothing may be lost.
    """
    root, port, exp = tmp_path / "server", free_port(), f"blink-{uuid.uuid4().hex[:6]}"
    server = start_server(root, port)
    out = tmp_path / "run"
    # 100 epochs: the server stops after the first reached it (~10 epochs in under load); a
    # batch of 1000 points (~33 epochs of 30 points) or the end of the run then meets it down.
    proc = start("sweep.py", *TINY, "train.epochs=100", f"tracking.uri={server.uri}",
                 f"tracking.experiment={exp}", f"hydra.run.dir={out}")
    try:
        wait_for(lambda: _first_epoch_sent(server.uri, exp), proc, every=0.2)
        server.stop()  # the run has sent its first epoch; the rest must survive the gap
        log = out / "sweep.log"  # the job's log (hydra.job.name: sweep)
        wait_for(lambda: log.exists() and "tracking store not answering" in log.read_text(),
                 proc)
        server = start_server(root, port)
        output = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            kill_group(proc)
    try:
        assert proc.returncode == 0, output[-3000:]
        (r,) = _runs(server.uri, exp)
        assert r.info.status == "FINISHED", output[-3000:]
        assert r.data.tags[Tag.OUTCOME] == "finished"
        n = assert_complete(server.uri, r.info.run_id, out)
        assert n == 300  # 100 epochs x 3 optimizer steps (140 training samples, batch 64)
        assert not (out / rundir.PENDING_NAME).exists()
        assert "run kept locally" not in output
    finally:
        server.stop()


@pytest.mark.server
def test_server_down_for_the_whole_run_then_sync(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing answers: exit 0, folder pending; sync after the server is up; a re-sync adds 0."""
    port, exp = free_port(), f"offline-{uuid.uuid4().hex[:6]}"
    uri, out = f"http://127.0.0.1:{port}", tmp_path / "run"
    done = in_process(["sweep", *TINY, "train.epochs=3", f"tracking.uri={uri}",
                       f"tracking.experiment={exp}", "tracking.retry_s=1",
                       f"hydra.run.dir={out}"], capsys)
    assert done.code == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"run kept locally: `stability sync {out} --uri {uri}`" in done.stdout
    assert "finished: best val_loss" in done.stdout  # the job's own result
    assert (out / rundir.PENDING_NAME).exists()

    server = start_server(tmp_path / "server", port)
    try:
        first = run("sync.py", str(out), "--uri", uri)  # only the configured store
        assert first.returncode == 0, first.stdout + first.stderr
        assert "synced 1 of 1 pending runs" in first.stdout
        (r,) = _runs(uri, exp)
        assert r.info.status == "FINISHED"
        assert r.data.tags[Tag.OUTCOME] == "finished"
        assert r.data.params["train.epochs"] == "3"
        assert assert_complete(uri, r.info.run_id, out) == 9
        assert not (out / rundir.PENDING_NAME).exists()

        assert sync_paths([out], uri) == []  # nothing pending: nothing sent
        again = sync_folder(out, uri)  # even replayed in full (the function the CLI calls)...
        assert (again.run_id, again.created, again.points, again.params, again.artifacts) == (
            r.info.run_id, False, 0, 0, [])
        (r2,) = _runs(uri, exp)  # ...still one run with one point per step
        assert r2.info.run_id == r.info.run_id
        assert_complete(uri, r.info.run_id, out)
    finally:
        server.stop()


def test_two_sweeps_at_once_on_a_fresh_sqlite_store(tmp_path: Path) -> None:
    """Two terminals, two sweeps, a store that does not exist yet: both train."""
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    args = (*TINY, *ONE_CONFIG, "train.epochs=2", "seed=0,1", "hydra/launcher=basic",
            f"tracking.uri={uri}", "tracking.experiment=race")
    procs = [start("sweep.py", "-m", *args, f"hydra.sweep.dir={tmp_path}/s{i}") for i in (0, 1)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, output in zip(procs, outputs, strict=True):
        assert p.returncode == 0, output[-3000:]
        assert "OperationalError" not in output
    runs = _runs(uri, "race")
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    assert len({r.data.tags[Tag.SWEEP_ID] for r in runs}) == 2


@pytest.mark.server
def test_sigkilled_sweep_rerun_finishes_every_point_once(
        mlflow_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGKILL the sweep's whole process group mid-way, run the same command again.

    The killed sweep is a real process; the second one (which finds what the kill left) and the
    report run in this process.
    """
    exp = f"killed-{uuid.uuid4().hex[:6]}"
    args = ("-m", *TINY, *ONE_CONFIG, "train.epochs=20", "seed=0,1,2", "hydra/launcher=basic",
            f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={exp}",
            f"hydra.sweep.dir={tmp_path}")
    proc = start("sweep.py", *args)
    try:  # killed in the second point, after a few epochs (it has a resume checkpoint)
        wait_for(lambda: rows(tmp_path / "1" / rundir.CSV_NAME) > 9
                 and (tmp_path / "1" / rundir.RESUME_NAME).exists(), proc)
    finally:
        kill_group(proc)
    killed_run = [r for r in _runs(mlflow_server.uri, exp) if r.info.status == "RUNNING"]
    assert len(killed_run) == 1  # what MLflow shows after a SIGKILL, before the fix-up

    again = in_process(["sweep", *args], capsys)
    assert again.code == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "1 points resume from a checkpoint" in again.stdout, again.stdout[-3000:]
    runs = _runs(mlflow_server.uri, exp)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    c = MlflowClient(mlflow_server.uri)  # the killed sweep's parent was ended too (issue 19)
    parents = c.search_runs([c.get_experiment_by_name(exp).experiment_id],
                            "tags.`stability.kind` = 'sweep'", order_by=["start_time ASC"])
    assert [p.info.status for p in parents] == ["KILLED", "FINISHED"]
    assert "has exited" in parents[0].data.tags[Tag.REASON]
    finished = [r for r in runs if r.info.status == "FINISHED"]
    points = [(r.data.tags[Tag.FINGERPRINT], r.data.tags[Tag.SEED]) for r in finished]
    assert sorted(s for _, s in points) == ["0", "1", "2"] and len(set(points)) == 3
    resumed = [r for r in finished if r.info.run_id == killed_run[0].info.run_id]
    assert len(resumed) == 1  # the killed point went on in its own MLflow run
    assert Tag.REASON not in resumed[0].data.tags  # why the first attempt ended is history
    assert assert_complete(mlflow_server.uri, resumed[0].info.run_id, tmp_path / "1") == 60

    report = in_process(["report", f"tracking.uri={mlflow_server.uri}", f"experiment={exp}",
                         f"output_dir={tmp_path / 'reports'}", "plots=false",
                         "registry.enabled=false", "device=cpu",
                         f"hydra.run.dir={tmp_path / 'report-log'}"], capsys)
    assert report.code == 0, report.stdout[-3000:] + report.stderr[-3000:]
    assert list((tmp_path / "reports").glob("*/report.md"))


def test_killed_run_resumes_byte_identical(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """fp32 on CPU: SIGKILL after some epochs, run again in the folder: the same steps.csv.

    The uninterrupted reference run is the command in this process; the killed run and its
    resumption are real processes.
    """
    args = (*TINY, "train.epochs=30", "tracking.enabled=false", "seed=5")
    whole = in_process(["sweep", *args, f"hydra.run.dir={tmp_path / 'whole'}"], capsys)
    assert whole.code == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    out = tmp_path / "killed"
    proc = start("sweep.py", *args, f"hydra.run.dir={out}")
    try:
        wait_for(lambda: rows(out / rundir.CSV_NAME) > 15 and (out / rundir.RESUME_NAME).exists(),
                 proc)
    finally:
        kill_group(proc)
    assert rows(out / rundir.CSV_NAME) < 90  # really cut short (30 epochs x 3 steps)
    resumed = run("sweep.py", *args, f"hydra.run.dir={out}")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming after epoch" in resumed.stdout + resumed.stderr
    assert (out / "steps.csv").read_bytes() == (tmp_path / "whole" / "steps.csv").read_bytes()
    # per-layer norms (on by default): on disk each epoch, cut back to the resume point
    layers = (out / rundir.LAYER_NORMS_NAME).read_bytes()
    assert layers == (tmp_path / "whole" / rundir.LAYER_NORMS_NAME).read_bytes()
    assert len(layers.splitlines()) == rows(out / rundir.CSV_NAME) + 1  # + the header
    assert not (out / rundir.RESUME_NAME).exists()  # a run that ended leaves nothing to resume


def test_sync_into_sqlite_rides_out_a_locked_database(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The embedded store: a sync waits out a database another connection holds locked.

    (MLflow's own SQLite busy timeout, 20 s, covers this lock; a longer one raises ``database
    is locked``, which ``retry_call`` retries: tracking/test_tracking.py checks that part on its
    own.)
    """
    import sqlite3
    import threading

    from stability.tracking.uri import ensure_experiment

    out = tmp_path / "run"
    done = in_process(["sweep", *TINY, "train.epochs=2",
                       f"tracking.uri=http://127.0.0.1:{free_port()}", "tracking.experiment=locked",
                       "tracking.retry_s=1", f"hydra.run.dir={out}"], capsys)
    assert done.code == 0 and (out / rundir.PENDING_NAME).exists(), done.stdout[-3000:]
    db = tmp_path / "store" / "mlflow.db"
    uri = sqlite_store(db)
    # a sync sends only to the store its journal names: say the run was started on this one
    journal = out / rundir.JOURNAL_NAME
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    journal.write_text("".join(json.dumps(r | {"uri": uri} if r["k"] == "run" else r) + "\n"
                               for r in lines))
    ensure_experiment(uri, "locked")
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")  # what a busy writer does; SQLite's own wait is 5 s
    release = threading.Timer(8.0, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        result = sync_folder(out, uri)
    finally:
        release.join()
        holder.close()
    assert result.created and result.status == "FINISHED"
    (r,) = _runs(uri, "locked")
    assert r.info.status == "FINISHED" and r.info.run_id == result.run_id
    assert assert_complete(uri, r.info.run_id, out) == 6
