"""The "Flags" section: configs with missing or unfinished seeds."""

from __future__ import annotations

from stability.report.sections.section import Part, lines
from stability.report.study import Study


def markdown(st: Study) -> str:
    """One line per flagged config."""
    flagged = st.configs[st.configs["flag"] != ""]
    return lines("## Flags", "", [f"- `{r['label']}`: {r['flag']}" for _, r in flagged.iterrows()]
                 or ["- none: every config has every seed, all finished."], "")


SECTION = Part("flags", lambda st: st, markdown=markdown)
