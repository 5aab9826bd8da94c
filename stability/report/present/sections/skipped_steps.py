"""Figure: skipped optimizer steps per config, only the configs that skipped one.

A study where no config skipped a step gets one line under "Figures" instead of a chart of
empty bars.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stability.report.present import plots
from stability.report.present.sections.section import Drawn, Part
from stability.report.present.study import Study

NONE_SKIPPED = "Skipped steps: no config skipped an optimizer step, so there is no chart of them."


def figures(st: Study, folder: Path) -> Sequence[Drawn]:
    """The skipped-steps bars of the configs that skipped, or the line saying none did."""
    fig = plots.skipped_steps(st.findings.configs.frame(), folder)
    return (fig,) if fig is not None else (NONE_SKIPPED,)


SECTION = Part("skipped steps", lambda st: st, figures=figures)
