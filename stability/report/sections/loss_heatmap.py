"""Figure: best validation loss over the swept settings, with each cell's stability verdict."""

from __future__ import annotations

from stability.report import plots
from stability.report.sections.section import Part, drawn

SECTION = Part("heatmap", lambda st: st,
               figures=lambda st, folder: drawn(plots.heatmap(st.configs.frame(), folder,
                                                              st.loss_name)))
