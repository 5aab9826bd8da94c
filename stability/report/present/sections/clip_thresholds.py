"""The "Clipping thresholds from the norms (not tested)" section, below the decision.

Each accumulation setting's clip-off runs give the max_norm that would have clipped the target
share of their steps (``advice.recommend``). It is read from gradient norms, not from the
validation loss, and no run trained with it: it is advice for a run that wants clipping, never
a second answer. So it sits here, after the decision and its evidence, as one table with how
each threshold stands to the decision's clipping choice (``advice.against``).
"""

from __future__ import annotations

from stability.report.examine.advice import Recommendation, nearest_swept
from stability.report.format import DASH, table
from stability.report.present.sections.section import Part, lines
from stability.report.present.study import Study

HEADER = ["accumulation", "threshold (not tested)", "range over seeds", "steps read",
          "share of these steps each swept max_norm clips", "nearest swept",
          "against the decision"]


def _row(r: Recommendation) -> list[str]:
    near = nearest_swept(r)
    swept = ", ".join(f"{m:g}: {s:.0%}" for m, s in sorted(r.swept_share.items()))
    spread = (f"{r.low:.3g}–{r.high:.3g} ({len(r.per_seed)} seeds)" if len(r.per_seed) > 1
              else "1 seed")
    return [f"accum {r.accum_steps}", f"{r.max_norm:.3g} (clips {r.target_share:.0%})", spread,
            str(r.steps), swept or DASH, DASH if near != near else f"{near:g}",
            r.decided or DASH]


def markdown(st: Study) -> str:
    """The thresholds, or nothing when no clip-off run has norms."""
    recs = [r for r in st.findings.advice if r.steps]
    if not recs:
        return ""
    share = f"{recs[0].target_share:.0%}"
    return lines(
        "## Clipping thresholds from the norms (not tested)", "",
        f"Where the clip-off runs' pre-clip gradient norms lie: the max_norm that would have "
        f"clipped {share} of their steps (only the spikes), per accumulation setting, the median "
        "over seeds. No run trained with these thresholds and the decision does not read them: "
        "the clipping to train with is the answer's, chosen on the validation loss; a "
        "threshold here is for a run that wants clipping (a longer or larger one).", "",
        table(HEADER, [_row(r) for r in recs]), "",
        "`share of these steps each swept max_norm clips` is counterfactual (the clip-off runs' "
        "steps above it), not the clip rate of the runs that trained with it (the ranked "
        "table's `clipped`, the factor table's `clips`).", "")


SECTION = Part("clipping thresholds", lambda st: st, markdown=markdown)
