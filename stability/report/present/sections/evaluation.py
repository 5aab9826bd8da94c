"""The "Test evaluation" section: the chosen config's seeds on the sealed test split."""

from __future__ import annotations

import math

from stability.report.evidence.inert import inert
from stability.report.format import ACC_DIGITS, fmt, pm, table
from stability.report.present.sections.section import Part, lines
from stability.report.present.study import Study
from stability.report.sealed.evaluate import SeedTestResult


def _mlflow_state(s: SeedTestResult) -> str:
    """What the report did with a seed's test metrics in MLflow."""
    if s.logged:
        return "logged now"
    return "already logged" if math.isfinite(s.test_loss) else "not evaluated"


def markdown(st: Study) -> str:
    """One row per seed of the chosen config (a note from the run is data: made inert)."""
    t = st.test
    rows = [[str(s.seed), f"`{s.run_id}`", fmt(s.test_loss), fmt(s.test_acc, ACC_DIGITS),
             _mlflow_state(s), inert(s.note)] for s in t.seeds]
    tested = [s for s in t.seeds if math.isfinite(s.test_loss)]
    if tested:  # the answer's numbers, from the same values, in the same format
        rows.append([f"mean ± std ({len(tested)} seeds)", "", pm(t.loss.mean, t.loss.std),
                     pm(t.acc.mean, t.acc.std, ACC_DIGITS), "", "as in the answer"])
    return lines(
        "## Test evaluation (chosen config only)", "",
        table(["seed", "run", f"test loss ({st.fetched.loss_name})", "test acc", "MLflow",
               "note"], rows),
        "", f"Evaluated on `{t.device}` under each run's own precision from its "
        "`checkpoints/best.pt` artifact (the best-validation epoch).", "")


SECTION = Part("test evaluation", lambda st: st, markdown=markdown)
