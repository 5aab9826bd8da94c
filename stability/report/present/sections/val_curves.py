"""Figure: the validation loss per epoch of the chosen config against its closest rivals.

Draws what the validation-curves stage read (``stability.report.examine.val_curves``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stability.report.examine.val_curves import ValCurves
from stability.report.present import plots
from stability.report.present.sections.section import Drawn, Part, drawn


def figures(vc: ValCurves, folder: Path) -> Sequence[Drawn]:
    """The shown configs' curves; histories that could not be read fail this figure alone."""
    if vc.error is not None:
        raise vc.error  # one line under Problems (render.write_sections)
    return drawn(plots.val_loss_curves(list(vc.curves), folder, vc.loss_name))


# ``st.findings.val_curves`` is None when the report draws no figures (``report.plots=false``).
SECTION = Part("validation curves", lambda st: st.findings.val_curves, figures=figures)
