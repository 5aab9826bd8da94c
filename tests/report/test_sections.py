"""The report's sections: the registry, what a failing figure costs, the formatting module."""

from __future__ import annotations

import math
import pkgutil
from pathlib import Path

import pytest

from stability.report import format as fm
from stability.report.present import sections
from stability.report.present.plots import Figure
from stability.report.present.render import write_sections
from stability.report.present.sections import SECTIONS, Part

NOT_SECTIONS = {"section", "decision_text"}  # the protocol; the decision in words (two sections)


def test_every_section_module_is_registered_once_under_its_own_name() -> None:
    modules = {m.name for m in pkgutil.iter_modules(sections.__path__)} - NOT_SECTIONS
    registered = {s.analyse.__module__.rsplit(".", 1)[-1] for s in SECTIONS
                  if s.analyse.__module__.startswith("stability.report.present.sections.")}
    registered |= {getattr(s.markdown, "__module__", "").rsplit(".", 1)[-1] for s in SECTIONS}
    registered |= {getattr(s.figures, "__module__", "").rsplit(".", 1)[-1] for s in SECTIONS}
    assert modules <= registered
    names = [s.name for s in SECTIONS]
    assert len(names) == len(set(names))


def _raise(result: object, folder: Path) -> list[Figure]:
    raise ValueError("no axes")


def test_a_figure_that_raises_is_one_problem_line_and_the_rest_is_written(tmp_path: Path) -> None:
    # The study is not read by these parts: any object stands for it.
    parts = [Part("broken", lambda st: 1, markdown=lambda r: "## A", figures=_raise),
             Part("absent", lambda st: None, markdown=lambda r: "## never"),
             Part("remark", lambda st: 2, markdown=lambda r: "## B",
                  figures=lambda r, f: ["nothing to draw: no run has it"]),
             Part("figure", lambda st: 3, figures=lambda r, f: [Figure("f.png", "F", "c")])]
    written = write_sections(object(), tmp_path, parts)  # type: ignore[arg-type]
    assert written.body == ("## A", "## B")
    assert written.notes == ("figure 'broken' could not be drawn: ValueError: no axes",)
    assert written.remarks == ("nothing to draw: no run has it",)
    assert written.figures == (Figure("f.png", "F", "c"),)
    unplotted = write_sections(object(), None, parts)  # type: ignore[arg-type]
    assert unplotted.body == ("## A", "## B")
    assert unplotted.notes == unplotted.remarks == unplotted.figures == ()


@pytest.mark.parametrize(("text", "expected"), [
    (fm.signed(1e-4), "+0.0001"), (fm.signed(2e-5), "+0.0000"), (fm.signed(-0.25), "-0.2500"),
    (fm.signed(math.nan), "—"),
    (fm.signed(math.inf), "+inf"), (fm.signed(math.inf, "nonfinite"), "—"),
    (fm.size(2e-4), "0.0002"), (fm.size(3e-4), "0.0003"), (fm.size(4e-5), "<0.0001"),
    (fm.size(math.nan, "never"), "nan"),
    (fm.size(math.inf), "inf"), (fm.size(math.inf, "nonfinite"), "—"),
    (fm.fixed_signed(1e-5), "+0.0000"), (fm.fmt(math.inf), "inf"), (fm.fmt(None), "—"),
    (fm.pm(0.5, math.nan), "0.5000"), (fm.seeds(math.inf), "> 10000"),
    (fm.pval(1.6e-5), "<0.0001"), (fm.pval(0.0001), "0.0001"), (fm.pval(0.0432), "0.043"),
])
def test_each_number_shape_keeps_its_call_sites_output(text: str, expected: str) -> None:
    assert text == expected


def test_a_table_cell_from_mlflow_stays_on_one_line_and_in_its_column() -> None:
    assert fm.table(["a", "b"], [["x|y", "two\nlines"]]).splitlines() == [
        "| a | b |", "|---|---|", "| x\\|y | two lines |"]
