"""The MLflow contract: one module names everything, the docs list it, nobody else spells it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from stability.tracking import contract
from stability.tracking.contract import Artifact, Kind, Outcome, SkipReason, Tag

ROOT = Path(__file__).resolve().parents[1]
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
