"""Figure: the recommended max_norm from the clip-off runs' pre-clip norms."""

from __future__ import annotations

from stability.report import plots
from stability.report.sections.section import Part, drawn

SECTION = Part("max_norm advice", lambda st: st,
               figures=lambda st, folder: drawn(plots.max_norm_advice(st.advice, folder)))
