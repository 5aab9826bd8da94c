"""Issue 55, item 7 (CSV): no summary.csv cell a spreadsheet would run as a formula.

A real sweep whose third config's runs record a planted ``precision.name`` (a teammate's runs:
``tests/helpers/report_fixtures.Spec.planted``): a tab before ``=``, a full-width ``＝`` and a
``|`` DDE call reached summary.csv without the ``'`` prefix (a tab becomes a space on the way
in, and the check looked at the first character only).
"""

from __future__ import annotations

import csv
import unicodedata
from pathlib import Path

import pytest

from stability.report import ReportConfig, build_report
from stability.report.present.render import FORMULA_STARTS, _cell
from tests.helpers.report_fixtures import Spec, make_sweep
from tests.helpers.stores import sqlite_store
from tests.report.test_planted import BASELINE, WINNER

PLANTED = ["\t=1+1", " =1+1", "＝1+1", "|calc'!A1", "\u3000@SUM(A1)", "＋1+1"]


def _as_a_spreadsheet_reads(cell: str) -> str:
    return unicodedata.normalize("NFKC", cell).lstrip()


def test_a_cell_is_judged_as_a_spreadsheet_reads_it() -> None:
    for value in PLANTED:
        assert _cell(value) == "'" + value, value
    for value in ("-1", " -1.5", "fp32", "1e-3", "clip=1.0", "", "a=b"):
        assert _cell(value) == value, value
    assert _cell(3.5) == 3.5


@pytest.mark.slow
@pytest.mark.parametrize("formula", PLANTED)
def test_summary_csv_holds_no_formula_however_it_is_spaced_or_spelled(
        tmp_path: Path, formula: str) -> None:
    hostile = Spec(precision="fp32", clip=None, accum=1, losses={0: 0.60, 1: 0.61},
                   planted=((0, "precision.name", formula), (1, "precision.name", formula)))
    uri = sqlite_store(tmp_path / "mlflow.db")
    make_sweep(uri, "c7", "c7", [WINNER, BASELINE, hostile], tmp_path / "runs")
    out = tmp_path / "out"
    build_report(ReportConfig(tracking_uri=uri, experiment="c7", sweep_id="c7",
                              output_dir=str(out), device="cpu", register=False, plots=False))
    with (out / "c7" / "summary.csv").open(newline="") as f:
        cells = [v for row in csv.DictReader(f) for v in row.values()]
    planted = [v for v in cells if formula.strip().lstrip("\u3000")[1:] in v]
    assert planted, cells  # the value is there, as text
    bad = [v for v in cells if _as_a_spreadsheet_reads(v).startswith(FORMULA_STARTS)
           and not v.startswith("'") and _cell(v) != v]
    assert bad == [], bad
    assert all(v.startswith("'") for v in planted), planted
