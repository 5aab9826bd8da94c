"""Figure: the pre-clip gradient norm per step of each plotted config's representative run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from stability.report.present import plots
from stability.report.present.sections.section import Drawn, Part, drawn
from stability.report.present.study import Study


def figures(st: Study, folder: Path) -> Sequence[Drawn]:
    """One curve per plotted config that has a ``steps.csv``; the swept max_norms as lines."""
    p, steps = st.findings.plotted, st.findings.steps
    swept = list(dict.fromkeys(r.max_norm for r in st.findings.configs
                               if not math.isnan(r.max_norm)))
    ids = p.rep_ids
    return drawn(plots.grad_norm([(p.series[fp], steps[ids[fp]]) for _, fp in p.roles
                                  if ids.get(fp) in steps],
                                 folder, swept))


SECTION = Part("grad norm", lambda st: st, figures=figures)
