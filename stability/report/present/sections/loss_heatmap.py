"""Figure: best validation loss over the swept settings, with each cell's stability verdict.

Its rows, columns and panels are the study's design (``stability.design``): clipping x
accumulation, a panel per level of every other factor.
"""

from __future__ import annotations

from stability.report.present import plots
from stability.report.present.sections.section import Part, drawn

SECTION = Part("heatmap", lambda st: st,
               figures=lambda st, folder: drawn(plots.heatmap(
                   st.findings.configs.frame(), folder, st.evidence.design.of,
                   st.fetched.loss_name)))
