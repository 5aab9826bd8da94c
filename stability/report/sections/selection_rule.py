"""The "Selection rule" section: the ranking's rule, how it stands to the decision, and that
the test split played no part."""

from __future__ import annotations

from stability.report.sections.section import Part, lines
from stability.report.select import SELECTION_RULE
from stability.report.study import Study


def markdown(st: Study) -> str:
    """The rule, word for word as ``select`` applies it."""
    w = st.winner
    rank = ("ranks first by it" if w.rank == 1 else
            f"ranks {w.rank} by it: the decision reads the factor effects, not the ranking")
    return lines("## Selection rule", "", SELECTION_RULE + ".", "",
                 "This ordering is the `rank` column of the ranked table (descriptive). The "
                 f"config to train with is the decision's (the answer): `{w.label}`, which "
                 f"{rank}.", "",
                 "The test split played no part in the choice: it was opened only after "
                 "selection, for the winner's seeds.", "")


SECTION = Part("selection rule", lambda st: st, markdown=markdown)
