"""Issue 55, items 1, 2 and 5: the sweep's own record cannot be forged, replaced or bypassed.

A real two-config sweep whose parent keeps its record (``tests/report/test_planted.py``) in a
SQLite store; a teammate who may create runs in the experiment plants, through the MLflow
client (or, for a location, in the store file), a second parent of the sweep, a deleted or
garbled record, or a parent whose ``artifact_uri`` is a listener on 127.0.0.1. The real report
runs; the victim's credentials are exported.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from pathlib import Path

import pytest
from mlflow.entities import Param

from stability.report.options import ReportError
from stability.tracking import children, origins
from stability.tracking.contract import Artifact
from tests.report.test_planted import recorded_sweep, report
from tests.tracking.test_origins import PASSWORD, Listener, listener, signed_in  # noqa: F401

pytestmark = pytest.mark.slow
# A listener path MLflow's HTTP artifact client lists (``http://host/loot`` fails inside MLflow
# before any request: the reproduction needs the proxied API's path)
LOOT = "/api/2.0/mlflow-artifacts/artifacts/loot"


def _promise(c, parent: str) -> None:
    """What a sweep of this version logs on its parent when it creates it."""
    c.log_batch(parent, params=[Param(children.RECORD_PARAM, Artifact.SWEEP_RUNS)])


def _record_file(c, parent: str) -> Path:
    uri = c.get_run(parent).info.artifact_uri
    return Path(urllib.parse.unquote(urllib.parse.urlsplit(uri).path)) / Artifact.SWEEP_RUNS


def test_a_second_parent_of_the_sweep_is_refused_naming_both(tmp_path: Path) -> None:
    """Item 1: mallory's second ``stability.kind=sweep`` run with the victim's sweep id, its
    tags and grid params copied and her own record naming her runs, was taken as the sweep's
    parent (the newest). Now the report refuses the sweep id, naming both runs and users."""
    uri, c, exp_id, parent, ids = recorded_sweep(tmp_path, "r1")
    real = c.get_run(parent)
    forged = c.create_run(exp_id, tags={**real.data.tags, "mlflow.user": "mallory"},
                          run_name=real.info.run_name).info.run_id
    children.write(c, forged, ids.keys(), [])  # her record: none of the victim's runs
    with pytest.raises(ReportError) as err:
        report(uri, "r1", tmp_path / "out")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("sweep_id='r1' is ambiguous: experiment 'r1' holds 2 parent runs")
    assert f"{forged} created by mallory" in line
    assert f"{parent} created by " in line
    assert not (tmp_path / "out" / "r1" / "report.md").exists()


def test_a_deleted_record_of_a_parent_that_promised_one_stops_the_report(tmp_path: Path) -> None:
    """Item 5: deleting the parent's ``sweep_runs.json`` made the report read the sweep by its
    tags, silently (forged copies then won). Now a parent created with the record's param
    (written once) and no record stops the report in one line."""
    uri, c, exp_id, parent, _ = recorded_sweep(tmp_path, "r5")
    _promise(c, parent)
    _record_file(c, parent).unlink()  # what MLflow's artifact API (DELETE) does on a server
    with pytest.raises(ReportError, match=(
            rf"^sweep_id='r5': the sweep's parent run {parent} was created keeping "
            r"sweep_runs.json \(param sweep.record\) and has none now: its own runs cannot be "
            r"told from planted ones; nothing is reported$")):
        report(uri, "r5", tmp_path / "out")


def test_a_garbled_record_stops_the_report(tmp_path: Path) -> None:
    """Item 5: a garbled record was one line, and the sweep was read by its tags. Now it is an
    error, promised or not."""
    uri, c, exp_id, parent, _ = recorded_sweep(tmp_path, "r6")
    origins.write_text(c, parent, '{"planted": "nonsense"', Artifact.SWEEP_RUNS)
    with pytest.raises(ReportError, match=(
            rf"^sweep_id='r6': the sweep's parent run {parent} has a sweep_runs.json that cannot "
            r"be read \(.*\): its own runs cannot be told from planted ones; nothing is "
            r"reported")):
        report(uri, "r6", tmp_path / "out")


def test_a_sweep_from_before_the_record_is_read_by_its_tags_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The one fallback left: a parent without the record's param and without the record."""
    uri, c, exp_id, parent, _ = recorded_sweep(tmp_path, "r7")
    _record_file(c, parent).unlink()
    report(uri, "r7", tmp_path / "out")
    assert (f"the sweep's parent run {parent} keeps no sweep_runs.json (a sweep from before the "
            "record existed): its runs are taken by their tags") in caplog.text


def test_a_real_sweep_promises_its_record(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The param is the sweep's own: logged when its parent is created."""
    from mlflow.tracking import MlflowClient

    from tests.helpers.in_process import in_process
    from tests.helpers.stores import sqlite_store

    uri = sqlite_store(tmp_path / "mlflow.db")
    done = in_process(["sweep", "-m", "data.num_samples=200", "device=cpu", "train.epochs=1",
                       "clip.enabled=false", "precision=fp32", "seed=0", "hydra/launcher=basic",
                       f"tracking.uri={uri}", "tracking.experiment=rec",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}"], capsys)
    assert done.code == 0, done.stdout[-2000:] + done.stderr[-2000:]
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name("rec").experiment_id
    (parent,) = c.search_runs([exp_id], "tags.`stability.kind` = 'sweep'")
    assert children.promised(parent.data.params)
    assert children.read(c, parent.info.run_id) is not None


def test_the_record_is_read_and_written_only_at_a_checked_location(
        tmp_path: Path, listener: Listener, signed_in: None) -> None:  # noqa: F811
    """Item 2: ``children.read`` and the sweep's ``children.write`` called MLflow's artifact
    client directly: one UPDATE of the parent's ``artifact_uri`` sent the victim's password to
    a listener. Now both refuse in one line, and the report stops; the listener got nothing."""
    uri, c, exp_id, parent, ids = recorded_sweep(tmp_path, "r2")
    with sqlite3.connect(tmp_path / "mlflow.db") as con:  # anyone who can write the file
        con.execute("UPDATE runs SET artifact_uri = ? WHERE run_uuid = ?",
                    (f"{listener.url}{LOOT}", parent))
    con.close()
    with pytest.raises(origins.ForeignArtifacts, match=f"run {parent} keeps its artifacts at"):
        children.read(c, parent)
    with pytest.raises(origins.ForeignArtifacts, match=f"run {parent} keeps its artifacts at"):
        children.write(c, parent, ids.keys(), ids.values())
    with pytest.raises(ReportError, match=f"keeps its artifacts at '{listener.url}{LOOT}'"):
        report(uri, "r2", tmp_path / "out")
    assert listener.seen == []


@pytest.mark.server
def test_on_a_server_the_record_is_read_only_at_a_checked_location(
        tmp_path: Path, listener: Listener, signed_in: None,  # noqa: F811
        mlflow_server) -> None:
    """Item 2 as reproduced: the project's own server, the parent's ``artifact_uri`` set to a
    listener by one UPDATE of its database; the report read the record through MLflow's own
    client and the listener got the victim's password (1 request). Now: one line, nothing
    sent."""
    from mlflow.tracking import MlflowClient

    from tests.helpers.report_fixtures import make_sweep
    from tests.report.test_planted import BASELINE, WINNER

    uri = mlflow_server.uri
    ids = make_sweep(uri, "r2-server", "r2-server", [WINNER, BASELINE], tmp_path / "runs")
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name("r2-server").experiment_id
    parent = c.search_runs([exp_id], "tags.`stability.kind` = 'sweep'")[0].info.run_id
    children.write(c, parent, ids.keys(), ids.values())
    with sqlite3.connect(mlflow_server.root / "mlflow.db") as con:
        con.execute("UPDATE runs SET artifact_uri = ? WHERE run_uuid = ?",
                    (f"{listener.url}{LOOT}", parent))
    con.close()
    with pytest.raises(ReportError, match=f"keeps its artifacts at '{listener.url}{LOOT}'"):
        report(uri, "r2-server", tmp_path / "out")
    assert listener.seen == []
