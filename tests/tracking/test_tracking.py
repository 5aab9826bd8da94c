"""What one run puts in MLflow (docs/TRACKING.md), checked against a real ``mlflow server``."""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from stability.core.config import to_run_config
from stability.core.identity import fingerprint, flatten
from stability.sweep.job import train_tracked
from stability.tasks.sign_sum import SequenceClassifier
from stability.tracking.contract import STEP_METRICS
from stability.tracking.queries import finished_points
from stability.tracking.server import free_port
from stability.tracking.uri import (
    TrackingError,
    check_reachable,
    default_store_uri,
    ensure_experiment,
    local_artifact_root,
    resolve_tracking_uri,
)
from tests.helpers.stores import sqlite_store

pytestmark = pytest.mark.server

PROJECT = Path(__file__).resolve().parents[2]
EPOCH_METRICS = ("train_loss", "val_loss", "val_acc", "epoch_clip_fraction", "max_grad_norm",
                 "epoch_skip_count")
SUMMARY_METRICS = ("best_val_loss", "best_epoch", "clip_count", "clip_fraction", "skip_count",
                   "skip_nonfinite_loss", "skip_nonfinite_grad", "final_scaler_scale",
                   "fp16_underflow_fraction", "grad_norm_max", "grad_norm_p50", "grad_norm_p90",
                   "grad_norm_p99", "diverged", "effective_batch", "optimizer_steps",
                   "wall_time_s")


def _raw(uri: str, experiment: str, out: Path, **sections: dict) -> dict:
    raw = {"seed": 3, "device": "cpu", "output_dir": str(out),
           "data": {"num_samples": 300}, "train": {"epochs": 2, "batch_size": 32},
           "tracking": {"uri": uri, "experiment": experiment}}
    for key, value in sections.items():
        raw[key] = raw.get(key, {}) | value
    return raw


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def test_finished_run_follows_the_contract(mlflow_server, tmp_path: Path) -> None:
    """fp16 + clipping + accumulation: names, tags, params, metrics, artifacts, batching."""
    exp = f"contract-{uuid.uuid4().hex[:8]}"
    c = MlflowClient(mlflow_server.uri)
    exp_id = ensure_experiment(mlflow_server.uri, exp)
    parent = c.create_run(exp_id, run_name="sweep t").info.run_id
    raw = _raw(mlflow_server.uri, exp, tmp_path,
               precision={"name": "fp16", "growth_interval": 3},
               clip={"enabled": True, "max_norm": 0.5}, train={"accum_steps": 2},
               tracking={"sweep_id": "t", "parent_run_id": parent})
    cfg = to_run_config(raw)
    overrides = ["precision=fp16", "clip.enabled=true", f"tracking.uri={mlflow_server.uri}",
                 "tracking.sweep_id=t"]
    log = Path(mlflow_server.root / "server.log")
    log_start = log.stat().st_size
    result = train_tracked(cfg, overrides)
    requests = log.read_text()[log_start:]

    run = c.search_runs([exp_id], filter_string="tags.`stability.kind` = 'train'")[0]
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "fp16 clip=0.5 acc=2 s=3"
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == parent
    assert tags["stability.sweep_id"] == "t"
    assert tags["stability.fingerprint"] == fingerprint(cfg)
    assert tags["stability.seed"] == "3"
    assert tags["stability.overrides"] == "precision=fp16 clip.enabled=true"
    assert tags["stability.outcome"] == "finished"
    assert len(tags["stability.git_commit"]) == 40
    expected = {k: str(v) for k, v in flatten(cfg).items()
                if k != "output_dir" and not k.startswith("tracking.")}  # URIs: no credentials
    assert run.data.params == expected | {"trainer": "ours"}

    rows = _csv_rows(result.csv_path)
    n = len(rows)
    assert n == result.summary["optimizer_steps"] == run.data.metrics["optimizer_steps"] > 2
    for key in STEP_METRICS:
        history = sorted(c.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == list(range(1, n + 1)), key
        for m, row in zip(history, rows, strict=True):
            assert _same(m.value, float(row[key])), (key, m.step)
    scales = [float(r["scaler_scale"]) for r in rows]
    assert len(set(scales)) > 1  # growth_interval=3: the GradScaler's scale really moves
    for key in EPOCH_METRICS:
        assert [m.step for m in c.get_metric_history(run.info.run_id, key)] == [1, 2], key
    assert set(SUMMARY_METRICS) <= set(run.data.metrics)
    assert not [k for k in run.data.metrics if k.startswith("test_")]
    assert run.data.metrics["effective_batch"] == 64

    # One log-batch per epoch (plus params and the summary), never a request per value.
    assert "/runs/log-metric " not in requests
    assert 3 <= requests.count("/runs/log-batch ") <= 6

    names = {a.path for a in c.list_artifacts(run.info.run_id)}
    assert {"steps.csv", "config.yaml", "checkpoints"} <= names
    ckpt = c.download_artifacts(run.info.run_id, "checkpoints/best.pt", str(tmp_path / "dl"))
    model = SequenceClassifier(cfg.model)
    model.load_state_dict(torch.load(ckpt, weights_only=True))
    csv_copy = c.download_artifacts(run.info.run_id, "steps.csv", str(tmp_path / "dl"))
    assert Path(csv_copy).read_bytes() == result.csv_path.read_bytes()
    assert finished_points(mlflow_server.uri, exp) == {(fingerprint(cfg), 3)}


def test_diverged_run_ends_failed_with_reason(mlflow_server, tmp_path: Path) -> None:
    exp = f"diverge-{uuid.uuid4().hex[:8]}"
    raw = _raw(mlflow_server.uri, exp, tmp_path, fault={"inf_grad_at_step": 2},
               monitor={"max_skip_rate": 0.0, "abort_after": 1})
    result = train_tracked(to_run_config(raw))
    assert result.status == "diverged"
    c = MlflowClient(mlflow_server.uri)
    run = c.search_runs([c.get_experiment_by_name(exp).experiment_id])[0]
    assert run.info.status == "FAILED"
    assert run.data.tags["stability.outcome"] == "diverged"
    assert "monitor.max_skip_rate" in run.data.tags["stability.reason"]
    assert [m.step for m in c.get_metric_history(run.info.run_id, "skipped")] == [1, 2]
    # Non-finite values are logged as they are; MLflow's SQL store keeps an inf as the largest
    # float (SQL has no inf), so the injected inf gradient's norm comes back as 1.8e308.
    norms = sorted(c.get_metric_history(run.info.run_id, "grad_l2_pre_clip"),
                   key=lambda m: m.step)
    assert norms[0].value < 100 and norms[1].value == sys.float_info.max
    assert run.data.metrics["diverged"] == 1
    assert finished_points(mlflow_server.uri, exp) == set()


@pytest.mark.slow
def test_sigterm_marks_run_killed_and_keeps_every_step(mlflow_server, tmp_path: Path) -> None:
    exp = f"sigterm-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "experiments/sweep.py", "train.epochs=500", "data.num_samples=300",
           "device=cpu", f"tracking.uri={mlflow_server.uri}", f"tracking.experiment={exp}",
           f"hydra.run.dir={tmp_path}"]
    proc = subprocess.Popen(cmd, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=os.environ | {"MLFLOW_TRACKING_URI": ""})
    csv_path = tmp_path / "steps.csv"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if csv_path.exists() and len(csv_path.read_text().splitlines()) > 40:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]  # as a shell reports it

    rows = _csv_rows(csv_path)
    assert [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1))
    c = MlflowClient(mlflow_server.uri)
    run = c.search_runs([c.get_experiment_by_name(exp).experiment_id])[0]
    assert run.info.status == "KILLED", output[-3000:]
    assert run.data.tags["stability.outcome"] == "killed"
    assert "Terminated" in run.data.tags["stability.reason"]
    loss = c.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in loss) == [int(r["step"]) for r in rows]
    assert "steps.csv" in {a.path for a in c.list_artifacts(run.info.run_id)}


class _SignalledFinalizer:
    """Receives SIGTERM while its ``__del__`` runs: Python prints what the handler raises there
    ("Exception ignored in ...") and drops it, as for a generator the garbage collector closes."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGTERM)


def test_a_sigterm_a_finalizer_swallowed_is_raised_at_the_next_check() -> None:
    from stability.core.signals import Terminated, raise_if_terminated, sigterm_as_exception

    with pytest.raises(Terminated, match="signal 15"), sigterm_as_exception():
        _SignalledFinalizer()  # freed at once; its Terminated is dropped
        raise_if_terminated()
    raise_if_terminated()  # outside the block, nothing is pending


def test_a_sigterm_a_finalizer_swallowed_still_ends_the_run_killed(tmp_path: Path) -> None:
    """The signal lands in a finalizer during step 5: the run ends KILLED at step 6, before
    that step's record, with 5 rows in steps.csv and in MLflow."""
    from stability.core.signals import Terminated
    from stability.sweep.job import train_tracked

    class AtStep5:
        def on_step(self, log, epoch: int) -> None:  # noqa: ANN001
            if log.step == 5:
                _SignalledFinalizer()

        def on_epoch(self, log) -> None:  # noqa: ANN001
            pass

        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, state: dict) -> None:
            pass

    uri = sqlite_store(tmp_path / "mlflow.db")
    with pytest.raises(Terminated):
        train_tracked(to_run_config(_raw(uri, "swallowed", tmp_path / "run")), sinks=[AtStep5()])
    rows = _csv_rows(tmp_path / "run" / "steps.csv")
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5]
    c = MlflowClient(uri)
    (run,) = c.search_runs([c.get_experiment_by_name("swallowed").experiment_id])
    assert run.info.status == "KILLED" and run.data.tags["stability.outcome"] == "killed"
    assert sorted(m.step for m in c.get_metric_history(run.info.run_id, "loss")) == [1, 2, 3, 4, 5]


def test_unreachable_server_fails_fast_with_a_clear_message() -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    from concurrent.futures import ThreadPoolExecutor

    # a hang fails the test through the result's timeout; what is asserted is the error
    with ThreadPoolExecutor(1) as pool, pytest.raises(TrackingError, match="not reachable") as err:
        pool.submit(check_reachable, uri).result(timeout=60)
    assert uri in str(err.value)


def test_default_store_is_mlflow_db_in_the_current_folder(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    """MLflow's own convention: ./mlflow.db of the folder the command runs in, made absolute."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    expected = f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert resolve_tracking_uri(None) == default_store_uri() == expected
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert resolve_tracking_uri(None) == "http://127.0.0.1:1"
    assert resolve_tracking_uri("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_sqlite_artifacts_live_beside_the_store(tmp_path: Path) -> None:
    uri = sqlite_store(tmp_path / "mlflow.db")
    assert local_artifact_root(uri, "my study") == str(tmp_path / "mlruns" / "my_study")
    assert local_artifact_root("http://127.0.0.1:5000", "x") is None
    exp_id = ensure_experiment(uri, "my study")
    assert MlflowClient(uri).get_experiment(exp_id).artifact_location == str(
        tmp_path / "mlruns" / "my_study")


def test_heartbeat_and_dead_process_run_is_ended_killed(mlflow_server, tmp_path: Path) -> None:
    """A run's heartbeat tag moves; a RUNNING run whose process is gone is ended KILLED."""
    from stability.tracking.contract import Tag
    from stability.tracking.orphans import end_stale_runs

    exp = f"beat-{uuid.uuid4().hex[:8]}"
    raw = _raw(mlflow_server.uri, exp, tmp_path / "a", train={"epochs": 30},
               tracking={"heartbeat_s": 0.2})
    train_tracked(to_run_config(raw))
    c = MlflowClient(mlflow_server.uri)
    exp_id = c.get_experiment_by_name(exp).experiment_id
    (run,) = c.search_runs([exp_id])
    assert int(run.data.tags[Tag.HEARTBEAT]) > run.info.start_time
    assert run.data.tags[Tag.PROCESS].endswith(f":{os.getpid()}")

    # A process that trained and vanished (here: exited) leaves its run RUNNING.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    orphan = c.create_run(exp_id, tags={"stability.kind": "train",
                                        Tag.PROCESS: f"{os.uname().nodename}:{dead}",
                                        Tag.HEARTBEAT: str(int(time.time() * 1000))})
    alive = c.create_run(exp_id, tags={"stability.kind": "train",
                                       Tag.PROCESS: f"{os.uname().nodename}:{os.getpid()}",
                                       Tag.HEARTBEAT: str(int(time.time() * 1000))})
    assert end_stale_runs(mlflow_server.uri, exp) == 1
    ended = c.get_run(orphan.info.run_id)
    assert ended.info.status == "KILLED"
    assert ended.data.tags["stability.outcome"] == "killed"
    assert ended.data.tags["stability.reason"].startswith("no heartbeat since ")
    assert c.get_run(alive.info.run_id).info.status == "RUNNING"  # its process is this one
    assert end_stale_runs(mlflow_server.uri, exp, stale_after_s=0.001) == 1  # stale heartbeat
    assert c.get_run(alive.info.run_id).info.status == "KILLED"


def test_embedded_store_follows_the_working_directory_not_the_package(tmp_path: Path) -> None:
    """Installed anywhere (site-packages included), the default store is ./mlflow.db of the cwd.

    Simulated non-editable install: the package is imported from a copy outside any checkout.
    """
    import shutil

    site = tmp_path / "site-packages"
    shutil.copytree(PROJECT / "stability", site / "stability",
                    ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    code = ("import stability.tracking.uri as u; print(u.__file__); "
            "print(u.resolve_tracking_uri(None))")
    out = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True,
                         env=os.environ | {"PYTHONPATH": str(site), "MLFLOW_TRACKING_URI": ""})
    assert out.returncode == 0, out.stderr
    module, uri = out.stdout.split()
    assert Path(module).resolve().is_relative_to(site.resolve())  # the copy, not the checkout
    assert uri == f"sqlite:///{work}/mlflow.db"


def test_a_locked_sqlite_database_is_retried_until_it_is_released(tmp_path: Path) -> None:
    """``retry_call`` (every sync call) backs off on SQLite's ``database is locked``."""
    import sqlite3
    import threading

    from stability.tracking.buffer import retry_call

    db = tmp_path / "busy.db"
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t(x)")
    holder.execute("BEGIN EXCLUSIVE")
    attempts: list[str] = []

    def write() -> None:
        con = sqlite3.connect(db, timeout=0)  # no SQLite-side waiting: only our back-off
        try:
            con.execute("INSERT INTO t VALUES (1)")
            con.commit()
            attempts.append("ok")
        except sqlite3.OperationalError as err:
            attempts.append(str(err))
            raise
        finally:
            con.close()

    release = threading.Timer(1.5, lambda: holder.execute("COMMIT"))
    release.start()
    retry_call(write, retry_s=30)
    release.join()
    assert attempts[0] == "database is locked" and attempts[-1] == "ok"
    assert holder.execute("SELECT count(*) FROM t").fetchone() == (1,)
    calls: list[int] = []

    def bad_query() -> None:
        calls.append(1)
        holder.execute("SELECT * FROM missing")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        retry_call(bad_query, retry_s=30)
    assert len(calls) == 1  # a bug, not an outage: not retried
    holder.close()


def test_a_run_tracked_without_a_run_config_is_one_the_report_reads(tmp_path: Path) -> None:
    """Any loop: plain params, tags and a folder make a run the report fetches and labels."""
    from stability.core.config import TrackingConfig
    from stability.report.evidence.fetch import fetch_runs, find_sweep, loss_name
    from stability.tracking.contract import Kind, Rebuild, Tag, missing_records
    from stability.tracking.run import RunRecord, TrackedRun

    uri, exp = sqlite_store(tmp_path / "mlflow.db"), "foreign-loop"
    tags = {Tag.KIND: Kind.TRAIN, Tag.SWEEP_ID: "mine-1", Tag.FINGERPRINT: "f00d", Tag.SEED: "4",
            Tag.LOSS_NAME: "MSE"}
    params = {"task._target_": "my_lab.tasks.Regression", "task.width": "8",
              "precision.name": "fp32", "train.accum_steps": "1", "clip.enabled": "False"}
    assert missing_records(tags, {}) == ["param task._target_"]
    assert missing_records(tags | {Tag.LOSS_NAME: ""}, params) == [f"tag {Tag.LOSS_NAME}"]
    assert missing_records(tags, params) == []
    record = RunRecord(params=params, tags=tags, folder=tmp_path / "run", name="my loop s=4",
                       tracking=TrackingConfig(uri=uri, experiment=exp))
    with TrackedRun(record) as tracked:
        for epoch, val in enumerate((0.9, 0.4), start=1):
            tracked.sink.add({"val_loss": val}, step=epoch)
        tracked.finish({"best_val_loss": 0.4}, "finished")
    assert not tracked.pending and tracked.run_id

    c = MlflowClient(uri)
    runs = fetch_runs(c, find_sweep(c, exp, "mine-1"))
    [row] = runs.to_dict("records")
    assert (row["fingerprint"], row["seed"], row["outcome"]) == ("f00d", 4, "finished")
    assert row["best_val_loss"] == 0.4 and row["task._target_"] == "my_lab.tasks.Regression"
    assert loss_name(runs) == "MSE" and row["run_name"] == "my loop s=4"
    run = c.get_run(tracked.run_id)
    assert set(Rebuild.TAGS) <= set(run.data.tags) and run.data.params == params
    assert [m.value for m in c.get_metric_history(tracked.run_id, "val_loss")] == [0.9, 0.4]
