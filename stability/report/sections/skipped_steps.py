"""Figure: skipped optimizer steps per config."""

from __future__ import annotations

from stability.report import plots
from stability.report.sections.section import Part, drawn

SECTION = Part("skipped steps", lambda st: st,
               figures=lambda st, folder: drawn(plots.skipped_steps(st.configs.frame(), folder)))
