"""The MLflow contract: one module names everything, the docs list it, nobody else spells it."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from stability.tracking import contract
from stability.tracking.contract import Artifact, Kind, Outcome, SkipReason, Tag

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "TRACKING.md").read_text()
TAGS = [v for k, v in vars(Tag).items() if k.isupper()]


@pytest.mark.parametrize("name", [*TAGS, *contract.STEP_METRICS, *contract.EPOCH_METRICS,
                                  *contract.COST_METRICS, *contract.RUN_METRICS, *Artifact.ALL,
                                  *(k.value for k in Kind)])
def test_every_contract_name_is_documented(name: str) -> None:
    """docs/TRACKING.md mentions every tag, metric, artifact and run kind by its exact name."""
    assert f"`{name}" in DOC, f"{name} is missing from docs/TRACKING.md"


def test_step_metrics_are_the_csv_columns() -> None:
    """One word per quantity: every per-step metric is a steps.csv column of the same name."""
    from stability.core.steplog import CSV_COLUMNS

    assert set(contract.STEP_METRICS) <= set(CSV_COLUMNS)


def test_step_metrics_are_the_steplog_fields_marked_metric() -> None:
    """StepLog is the one source: the contract's per-step metrics are its ``metric`` fields, and
    the buffer sends each one's value as a float (bools as 0/1)."""
    from stability.core.steplog import METRIC, StepLog
    from stability.tracking.buffer import step_points

    marked = tuple(f.name for f in fields(StepLog) if f.metadata[METRIC])
    assert marked == contract.STEP_METRICS
    # The metrics the UI has always charted keep their names (a new field adds one).
    assert {"loss", "lr", "grad_l2_pre_clip", "grad_l2_post_clip", "clipped", "skipped",
            "scaler_scale", "skips_cumulative"} <= set(marked)
    log = StepLog(step=4, lr=1e-3, grad_l2_pre_clip=2.0, grad_l2_post_clip=1.0, loss=0.5,
                  skipped=False, skip_reason="", scaler_scale=8.0, clipped=True,
                  micro_batches=2, samples=16, skips_cumulative=3)
    points = step_points(log, ts=1234)
    assert [p[0] for p in points] == list(marked)
    assert all(type(v) is float and step == 4 and ts == 1234 for _, v, step, ts in points)
    assert {k: v for k, v, _, _ in points} == {k: float(getattr(log, k)) for k in marked}


def test_every_steps_csv_column_is_documented() -> None:
    """A new StepLog field (a new column) comes with its line in docs/TRACKING.md."""
    from stability.core.steplog import CSV_COLUMNS

    missing = [c for c in CSV_COLUMNS if f"`{c}`" not in DOC]
    assert missing == [], f"steps.csv columns missing from docs/TRACKING.md: {missing}"


def _schema_reads(path: Path) -> list[tuple[int, str]]:
    """``COLUMN.<name>`` reads of a module (the steps.csv names it takes from the schema)."""
    tree = ast.parse(path.read_text())
    return [(n.lineno, n.attr) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "COLUMN"]


def test_the_report_reads_steps_csv_columns_from_the_schema() -> None:
    """Every column the report reads through ``steplog.COLUMN`` is a StepLog column, the
    figures among them read it so, and no module spells a column's name (one with an
    underscore: single words such as ``step`` and ``loss`` name other tables' columns too)."""
    from stability.core.steplog import CSV_COLUMNS

    report = sorted((ROOT / "stability" / "report").rglob("*.py"))
    reads = [(f"{p.relative_to(ROOT)}:{line}", name) for p in report
             for line, name in _schema_reads(p)]
    assert [(at, name) for at, name in reads if name not in CSV_COLUMNS] == []
    assert {"grad_l2_pre_clip", "scaler_scale", "skipped", "step"} <= {n for _, n in reads}
    spelled = [f"{p.relative_to(ROOT)}:{line}: {value!r}"
               for p in sorted((ROOT / "stability").rglob("*.py"))
               if p != ROOT / "stability" / "core" / "steplog.py"
               for line, value in _string_constants(p)
               if value in CSV_COLUMNS and "_" in value]
    assert spelled == []


@pytest.mark.parametrize(("outcome", "status", "back"), [
    (Outcome.FINISHED, "FINISHED", Outcome.FINISHED),
    (Outcome.DIVERGED, "FAILED", Outcome.FAILED),  # MLflow has no "diverged" status
    (Outcome.FAILED, "FAILED", Outcome.FAILED),
    (Outcome.KILLED, "KILLED", Outcome.KILLED),
    (Outcome.RUNNING, "RUNNING", Outcome.RUNNING),
])
def test_outcome_maps_to_its_mlflow_status_and_back(outcome: Outcome, status: str,
                                                     back: Outcome) -> None:
    assert outcome.status == status
    assert Outcome.from_status(status) is back


def test_a_run_closed_as_scheduled_reads_back_as_running() -> None:
    """MLflow's SCHEDULED status has no outcome of its own: the run has not ended."""
    assert Outcome.from_status("SCHEDULED") is Outcome.RUNNING


def test_skip_reasons_are_the_csv_values() -> None:
    assert [r.value for r in SkipReason] == ["", "nonfinite_loss", "nonfinite_grad"]


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """String literals of a module, docstrings left out (prose may name a tag)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


def test_no_module_spells_a_tag_key_itself() -> None:
    """Outside the contract, library code names tags through ``Tag``, never as a literal."""
    offenders = []
    for path in sorted((ROOT / "stability").rglob("*.py")):
        if path == ROOT / "stability" / "tracking" / "contract.py":
            continue
        for line, value in _string_constants(path):
            if value in TAGS or any(f"`{tag}`" in value for tag in TAGS):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    assert offenders == []


def test_a_renamed_tag_is_read_under_its_old_name_on_an_older_run() -> None:
    """Issue 59: the report's "winner" tags became "chosen"; a store written before keeps the
    old names, and a reader takes either (the new name first)."""
    from stability.tracking.contract import RENAMED, Tag, read_tag

    assert RENAMED[Tag.WINNER] == "stability.winner" and Tag.WINNER == "stability.chosen"
    assert read_tag({"stability.winner": "abc"}, Tag.WINNER) == "abc"
    assert read_tag({"stability.winner": "old", Tag.WINNER: "new"}, Tag.WINNER) == "new"
    assert read_tag({}, Tag.WINNER_STABILITY, "none") == "none"
    assert read_tag({"stability.sweep_id": "s"}, Tag.SWEEP_ID) == "s"
