"""The "Selection rule" section: what decides the chosen config, in order, and what decided it
here; the ranking ("lowest mean") beside it; and that the test split played no part."""

from __future__ import annotations

from stability.design.factors import level_name, title
from stability.report.decide.select import DECISION_RULE, RANKING_RULE
from stability.report.present.reasons import first_levels, why
from stability.report.present.sections.section import Part, lines
from stability.report.present.study import Study


def _here(st: Study) -> list[str]:
    """One line per decided group: the chosen level and the step that decided it."""
    dec = st.decided.decision
    if dec is None or not dec.choices:
        return []
    firsts = first_levels(dec, st.decided.steadied)
    out = []
    for c, first in zip(dec.choices, firsts, strict=True):
        level = ", ".join(level_name(f, lv) for f, lv in zip(c.factors, c.levels[c.chosen],
                                                             strict=True))
        heading = " × ".join(title(f) for f in c.factors)
        out.append(f"- {heading} → {level}: {why(dec, c, c.chosen, first, st.decided.steadied)}.")
    return ["What decided each choice of this study (the answer table's `why` column):", "",
            *out, ""]


def markdown(st: Study) -> str:
    """The rule, word for word as the decision applies it, then the ranking's."""
    w, lowest = st.findings.configs.winner, st.findings.configs.lowest
    rank = ("it also has the lowest mean" if w.rank == 1 else
            f"it ranks {w.rank} by its mean; the lowest mean is `{lowest.label}` (rank 1)")
    return lines("## Selection rule", "", DECISION_RULE + ".", "", *_here(st),
                 RANKING_RULE + ".", "",
                 "The ranking is the `rank` column of the ranked table (descriptive). The config "
                 f"to train with is the chosen one (the answer): `{w.label}`; {rank}.", "",
                 "The test split played no part in the choice: it was opened only after "
                 "selection, for the chosen config's seeds.", "")


SECTION = Part("selection rule", lambda st: st, markdown=markdown)
