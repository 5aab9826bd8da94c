"""The "Selection rule" section: how the winner was chosen, and that the test split was not."""

from __future__ import annotations

from stability.report.sections.section import Part, lines
from stability.report.select import SELECTION_RULE
from stability.report.study import Study


def markdown(st: Study) -> str:
    """The rule, word for word as ``select`` applies it."""
    return lines("## Selection rule", "", SELECTION_RULE + ".", "",
                 "The test split played no part in the choice: it was opened only after "
                 "selection, for the winner's seeds.", "")


SECTION = Part("selection rule", lambda st: st, markdown=markdown)
