"""Figure: the fp16 GradScaler's scale per step (best fp16 config, and the one skipping most)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stability.report.present import plots
from stability.report.present.sections.section import Drawn, Part, drawn
from stability.report.present.study import Study


def figures(st: Study, folder: Path) -> Sequence[Drawn]:
    """One curve per fp16 config shown whose representative run has a ``steps.csv``."""
    p = st.findings.plotted
    ids = p.rep_ids
    return drawn(plots.scaler_scale([(p.series[fp], st.findings.steps[ids[fp]]) for fp in p.scaler
                                     if ids.get(fp) in st.findings.steps], folder))


SECTION = Part("fp16 scaler", lambda st: st, figures=figures)
