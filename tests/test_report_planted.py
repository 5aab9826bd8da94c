"""Issue 46: runs planted into the store by anyone who can write to it, against the report.

Each test writes a real sweep (``tests/helpers/report_fixtures.py``) into a SQLite store in a
temp folder, plants one thing through the MLflow client as a hostile teammate would, and runs
the real report path (``build_report``); nothing is mocked.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from stability.core.identity import fingerprint
from stability.report import ReportConfig, build_report
from stability.tracking.contract import Tag
from tests.helpers.report_fixtures import Spec, make_sweep, run_config
from tests.helpers.stores import sqlite_store

WINNER = Spec("bf16", 1.0, 2, {0: 0.40, 1: 0.41})
BASELINE = Spec("fp32", None, 1, {0: 0.50, 1: 0.52})


def planted_sweep(tmp_path: Path, name: str) -> tuple[str, MlflowClient, str, str]:
    """A real two-config sweep; ``(uri, client, experiment id, parent run id)``."""
    uri = sqlite_store(tmp_path / "mlflow.db")
    make_sweep(uri, name, name, [WINNER, BASELINE], tmp_path / "runs")
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name(name).experiment_id
    parent = c.search_runs([exp_id], "tags.`stability.kind` = 'sweep'")[0].info.run_id
    return uri, c, exp_id, parent


def plant(c: MlflowClient, exp_id: str, parent: str, sweep: str, spec: Spec, seed: int,
          status: str, outcome: str, metrics: dict[str, float], user: str = "mallory") -> str:
    """A run with the contract's tags and only ``metrics``, ended ``status``."""
    fp = fingerprint(run_config(spec, seed, Path(".")))
    rid = c.create_run(exp_id, tags={
        Tag.KIND: "train", Tag.SWEEP_ID: sweep, Tag.FINGERPRINT: fp, Tag.SEED: str(seed),
        Tag.OUTCOME: outcome, Tag.PARENT_RUN_ID: parent, "mlflow.user": user}).info.run_id
    ts = int(time.time() * 1000)
    c.log_batch(rid, metrics=[Metric(k, v, ts, 0) for k, v in metrics.items()])
    c.set_terminated(rid, status=status)
    return rid


def report(uri: str, sweep: str, out: Path) -> tuple[object, str]:
    """The real report of ``sweep``; ``(result, report.md)``."""
    result = build_report(ReportConfig(tracking_uri=uri, experiment=sweep, sweep_id=sweep,
                                       output_dir=str(out), device="cpu", register=False,
                                       plots=False))
    return result, (out / sweep / "report.md").read_text()


@pytest.mark.slow
def test_a_killed_run_tagged_finished_is_killed_not_the_winner(tmp_path: Path) -> None:
    """Item 4: a KILLED run tagged ``stability.outcome=finished`` with best_val_loss 0.0001
    and no artifacts won (and was tested on 0 sequences). Its status decides: killed."""
    uri, c, exp_id, parent = planted_sweep(tmp_path, "p4")
    other = Spec("fp16", 5.0, 1, {0: 0.0001})
    plant(c, exp_id, parent, "p4", other, 0, "KILLED", "finished",
                {"best_val_loss": 0.0001, "best_epoch": 2.0})
    result, text = report(uri, "p4", tmp_path / "out")
    assert result.winner == fingerprint(run_config(WINNER, 0, tmp_path))
    assert "0 sequences" not in text
    from stability.report.fetch import outcome_of
    assert outcome_of("finished", "KILLED") == "killed"
    assert outcome_of("diverged", "FAILED") == "diverged"
    assert outcome_of("finished", "FAILED") == "failed"
    assert outcome_of("nonsense", "FINISHED") == "finished"  # then its artifacts are checked
    assert outcome_of(None, "RUNNING") == "running"
