"""One bad run is one bad run (issue 31 H, I): a param no run could have trained with, or a
winner seed whose checkpoint does not fit its model, marks that run or seed with its reason and
the report goes on.

Real SQLite stores and real runs (tests/helpers/report_fixtures.py); nothing is mocked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.entities import Metric, Param, Run, RunData, RunInfo, RunTag
from mlflow.tracking import MlflowClient

from stability.core.identity import fingerprint
from stability.report import ReportConfig, build_report
from stability.report.evidence.fetch import TYPED_PARAMS, UNREADABLE, _row
from stability.tracking.contract import Tag
from tests.helpers.report_fixtures import Spec, make_sweep, run_config
from tests.helpers.stores import sqlite_store

WINNER = Spec(precision="bf16", clip=1.0, accum=2, losses={0: 0.40, 1: 0.41})
BASELINE = Spec(precision="fp32", clip=None, accum=1, losses={0: 0.50, 1: 0.52})
# train.lr swept: its own config, whose two runs carry an lr no run could have trained with
BAD_LR = Spec(precision="fp32", clip=None, accum=1, losses={0: 0.45, 1: 0.46}, lr=3e-3,
              planted=((0, "train.lr", "abc"), (1, "train.lr", "inf")))


def a_run(params: dict[str, str], tags: dict[str, str] | None = None) -> Run:
    """An MLflow ``Run`` entity as ``search_runs`` returns it (built in-process, no server)."""
    info = RunInfo(run_id="0" * 32, experiment_id="1", user_id="u", status="FINISHED",
                   start_time=1, end_time=2, lifecycle_stage="active", run_name="r")
    tags = {Tag.FINGERPRINT: "fp", Tag.SEED: "0", Tag.OUTCOME: "finished", **(tags or {})}
    return Run(info, RunData(metrics=[Metric("best_val_loss", 0.1, 1, 0)],
                             params=[Param(k, v) for k, v in params.items()],
                             tags=[RunTag(k, v) for k, v in tags.items()]))


@pytest.mark.parametrize("key", sorted(TYPED_PARAMS))
@pytest.mark.parametrize("value", ["abc", "inf", "-inf", "nan", "None", "0", "-1", "1e400",
                                   "9" * 5000, ""])
def test_every_typed_param_that_does_not_parse_marks_its_run(key: str, value: str) -> None:
    good = {"clip.enabled": "True", "clip.max_norm": "1.0", "clip.clip_value": "0.5",
            "train.accum_steps": "2", "train.epochs": "3", "train.lr": "0.001"}
    assert set(good) == set(TYPED_PARAMS)
    assert _row(a_run(good))["outcome"] == "finished"
    row = _row(a_run(good | {key: value}))
    assert row["outcome"] == UNREADABLE, (key, value)
    assert row["reason"].startswith(f"unreadable run: param {key}=")
    assert isinstance(row[key], bool | int | float)  # a hole nowhere: a neutral value
    assert row["seed"] == 0


def test_a_seed_tag_that_does_not_parse_marks_its_run() -> None:
    row = _row(a_run({}, {Tag.SEED: "0; drop"}))
    assert row["outcome"] == UNREADABLE and row["seed"] == -1
    assert row["reason"] == ("unreadable run: seed '0; drop' is invalid (invalid literal for "
                             "int() with base 10: '0; drop')")


@pytest.fixture(scope="module")
def bad_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, Path, object]:
    tmp = tmp_path_factory.mktemp("bad")
    uri = sqlite_store(tmp / "mlflow.db")
    ids = make_sweep(uri, "bad", "bad", [WINNER, BASELINE, BAD_LR], tmp / "runs")
    c = MlflowClient(uri)
    # the winner's seed 1: a weights-only best.pt with the wrong keys (loads, does not fit)
    wrong = tmp / "wrong" / "best.pt"
    wrong.parent.mkdir()
    torch.save({"evil.weight": torch.zeros(3)}, wrong)
    seed1 = ids[(fingerprint(run_config(WINNER, 1, Path("."))), 1)]
    c.log_artifact(seed1, str(wrong), "checkpoints")
    result = build_report(ReportConfig(tracking_uri=uri, experiment="bad", sweep_id="bad",
                                       output_dir=str(tmp / "reports"), device="cpu",
                                       register=False, plots=False))
    return uri, ids, tmp / "reports" / "bad" / "report.md", result


@pytest.mark.slow
def test_a_bad_lr_marks_its_runs_and_a_seed_that_cannot_be_rebuilt_is_listed(bad_study):
    uri, ids, md, result = bad_study
    text = md.read_text()
    c = MlflowClient(uri)
    assert c.get_run(result.report_run_id).info.status == "FINISHED"
    bad = {s: ids[(fingerprint(run_config(BAD_LR, s, Path("."))), s)] for s in (0, 1)}
    assert (f"run {bad[0]} is unreadable, counted as not finished: unreadable run: param "
            "train.lr='abc' is invalid (could not convert string to float: 'abc')") in text
    assert (f"run {bad[1]} is unreadable, counted as not finished: unreadable run: param "
            "train.lr='inf' is invalid ('inf' is not a finite number > 0)") in text
    seeds = {s: ids[(fingerprint(run_config(WINNER, s, Path("."))), s)] for s in (0, 1)}
    table = text.split("test loss (", 1)[1].split("\n\n", 1)[0]
    row = next(line for line in table.splitlines() if seeds[1] in line)
    assert "| not evaluated | CheckpointMismatch: checkpoints/best.pt does not fit the model its " \
           "config.yaml builds (missing: head.bias, head.weight, rnn.bias_hh_l0 (+3 more); " \
           "unexpected: evil.weight) |" in row
    assert "logged now" in next(line for line in table.splitlines() if seeds[0] in line)
    assert "already logged" not in table
    assert "Traceback" not in text
