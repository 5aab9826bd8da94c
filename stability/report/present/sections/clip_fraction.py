"""Figure: the fraction of clipped steps against max_norm, per config."""

from __future__ import annotations

from stability.report.present import plots
from stability.report.present.sections.section import Part, drawn

SECTION = Part("clip fraction", lambda st: st,
               figures=lambda st, folder: drawn(plots.clip_fraction(st.findings.configs.frame(),
                                                                    folder)))
