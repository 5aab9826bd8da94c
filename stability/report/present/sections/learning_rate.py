"""The "Learning rate" section: LR sensitivity and the stable LR range per setting."""

from __future__ import annotations

from stability.report.examine import lr
from stability.report.format import table
from stability.report.present.sections.section import Part, lines
from stability.report.present.study import Study


def analyse(st: Study) -> tuple[lr.LrCurve, ...] | None:
    """The curves when ``train.lr`` was swept; None otherwise."""
    return st.findings.lr_curves or None


def markdown(curves: tuple[lr.LrCurve, ...]) -> str:
    """The table and how to read it."""
    return lines(
        "## Learning rate (LR sensitivity per setting)", "",
        table(lr.HEADER, lr.table_rows(list(curves))), "",
        "`LR sensitivity`: the mean over the swept learning rates of min(loss(lr), "
        "loss_init) − the best loss(lr), with loss(lr) the final validation loss averaged "
        "over seeds and `loss_init` the validation loss before training (Wortsman et al. "
        "2023); a run that did not finish counts as loss_init. Lower is less sensitive. "
        "`stable LR range`: the largest swept LR up to which every swept LR has a verdict "
        "other than unstable and a mean final loss below loss_init (docs/report.md).", "")


SECTION = Part("learning rate", analyse, markdown=markdown)
