"""The report's stages hand the sections computed values: the config table's frame is made once,
and a section that shows what a stage could not read fails alone, as it did when it read it."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from stability.report.decide.compare import versus
from stability.report.decide.select import aggregate, put_first
from stability.report.decide.table import COLUMNS, ConfigTable
from stability.report.examine import health
from stability.report.examine.layer_norms import LayerNorms
from stability.report.examine.plotted import Series
from stability.report.examine.val_curves import ValCurves
from stability.report.options import Thresholds
from stability.report.present.render import write_sections
from stability.report.present.sections import layer_norms as layer_norms_section
from stability.report.present.sections import val_curves as val_curves_section
from tests.report.test_select import runs_table


def _table() -> ConfigTable:
    runs = runs_table([
        ("low", "fp16", True, 1.0, 2, {0: 0.30, 1: 0.31, 2: 0.29}),
        ("base", "fp32", False, 1.0, 1, {0: 0.35, 1: 0.36, 2: 0.34}),
        ("lost", "bf16", True, 0.5, 1, {0: 0.20, 1: "diverged", 2: 0.21}),
    ])
    ranked = put_first(aggregate(runs), "base")
    return ConfigTable.assemble(ranked, versus(runs, ranked),
                                health.verdicts(runs, ranked, {}, Thresholds()))


def test_the_frame_is_made_once_at_assembly_and_equals_the_rows() -> None:
    table = _table()
    from_rows = pd.DataFrame([asdict(r) for r in table.rows], columns=list(COLUMNS))
    pd.testing.assert_frame_equal(table.frame(), from_rows)  # dtypes too: summary.csv's bytes
    pd.testing.assert_frame_equal(ConfigTable(table.rows).frame(), from_rows)
    mutated = table.frame()
    mutated.loc[0, "label"] = "changed"  # a consumer's copy, never the table's own frame
    assert table.frame().loc[0, "label"] == table.winner.label


def _study(**findings: object) -> SimpleNamespace:
    """A stand-in for the ``Study`` with only the ``Findings`` fields a figure section reads."""
    return SimpleNamespace(findings=SimpleNamespace(**findings))


def test_histories_a_stage_could_not_read_fail_that_figure_alone(tmp_path: Path) -> None:
    study = _study(val_curves=ValCurves("loss", error=RuntimeError("store down")))
    written = write_sections(study, tmp_path, [val_curves_section.SECTION])
    assert written.notes == ("figure 'validation curves' could not be drawn: RuntimeError: "
                             "store down",)
    assert written.figures == ()


def test_no_figures_no_stage_work_and_no_layer_table_one_remark(tmp_path: Path) -> None:
    none = _study(val_curves=None, layer_norms=None)  # report.plots=false
    sections = [val_curves_section.SECTION, layer_norms_section.SECTION]
    assert write_sections(none, tmp_path, sections) == write_sections(none, None, sections)
    missing = _study(layer_norms=LayerNorms((), 2, ("winner: fp32", "baseline: bf16")))
    written = write_sections(missing, tmp_path, [layer_norms_section.SECTION])
    assert written.figures == () and len(written.remarks) == 1
    assert written.remarks[0].startswith("Per-layer gradient norms: none of the 2 representative "
                                         "runs has `layer_norms.csv`")


def test_val_curves_draw_what_the_stage_read(tmp_path: Path) -> None:
    curve = pd.Series([0.5, 0.4, 0.35], index=[0, 1, 2], dtype=float)
    vc = ValCurves("loss", curves=((Series("chosen", "fp32 noclip acc=1", "tab:red"),
                                    {0: curve, 1: curve + 0.01}),))
    written = write_sections(_study(val_curves=vc), tmp_path, [val_curves_section.SECTION])
    assert [f.file for f in written.figures] == ["val_loss_curves.png"]
    assert (tmp_path / "val_loss_curves.png").exists()
