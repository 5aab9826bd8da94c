"""The "Stability verdicts" section: each config that is not stable, and why."""

from __future__ import annotations

from stability.report.present.sections.section import Part, lines
from stability.report.present.study import Study


def markdown(st: Study) -> str:
    """One line per config that is not stable (the reason comes from ``health.judge``), then a
    failed ``stability check`` of the same task, if the experiment holds one
    (``Findings.check_lines``)."""
    named = [f"- `{r.label}`: **{r.stability}**: {r.stability_reason}"
             for r in st.findings.configs if r.stability != "stable"]
    return lines("## Stability verdicts", "", named or ["- every config is stable."],
                 st.findings.check_lines, "",
                 "Judged per seed from `steps.csv` and the run's outcome, worst seed wins; "
                 "thresholds are `verdict.*` in `conf/report.yaml` (docs/report.md).", "")


SECTION = Part("stability verdicts", lambda st: st, markdown=markdown)
