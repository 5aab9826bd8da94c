"""The "Flags" section: configs with missing or unfinished seeds."""

from __future__ import annotations

from stability.report.present.sections.section import Part, lines
from stability.report.present.study import Study


def markdown(st: Study) -> str:
    """One line per flagged config."""
    return lines("## Flags", "", [f"- `{r.label}`: {r.flag}" for r in st.findings.configs if r.flag]
                 or ["- none: every config has every seed, all finished."], "")


SECTION = Part("flags", lambda st: st, markdown=markdown)
