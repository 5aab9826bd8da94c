"""The "Factor effects" section: what each swept factor does, from every run, seeds as blocks."""

from __future__ import annotations

from stability.report.decide.factors import FactorAnalysis
from stability.report.format import size, table
from stability.report.present.sections import decision_text
from stability.report.present.sections.section import Part, lines
from stability.report.present.study import Study


def markdown(st: Study) -> str:
    """The section's heading and table, or the line that says why there is none."""
    return lines("## Factor effects (every run, seeds as blocks)", "", *_body(st))


def _body(st: Study) -> list[str]:
    an = st.evidence.analysis
    if an is None or not an.main:
        if an is not None and an.factors:
            return ["No level of a swept factor pairs with its reference on the same seeds (no "
                    "two configs differ in that factor alone): no factor effects.", ""]
        return ["The study swept no factor with two or more levels: no factor effects.", ""]
    seq = st.evidence.sequential
    parts = [*decision_text.adaptive_line(seq),
             table(decision_text.FACTOR_HEADER, decision_text.factor_table(an, seq)), "",
             _method(an)]
    if an.dropped_cells:
        parts += ["", f"{an.dropped_cells} cell(s) of a contrast lacked a seed on one side: only "
                  "those points were left out (each seed's difference is the mean over the cells "
                  "it has; a seed with none is not counted)."]
    if an.interactions:
        parts += ["", "Two-way interactions (the effect's difference between a level of the "
                  "other factor and its reference; Holm over this table):", "",
                  table(decision_text.INTERACTION_HEADER, decision_text.interaction_rows(an))]
    return parts + [""]


def _method(an: FactorAnalysis) -> str:
    return (f"Every contrast pairs runs that differ only in that factor: each cell of the other "
            f"factors and each seed gives one difference (`cells × seeds`). Each seed's mean "
            f"over the cells is one observation and the effect's t-test runs over the seeds "
            f"(`df` = seeds − 1): every run counts, the seed stays the unit (docs/report.md, "
            f"\"Factor effects\"). `helps` / `hurts`: two-sided t-test, Holm over this table "
            f"at α = {an.alpha}; `equivalent`: TOST against ±{size(an.margin, 'nonfinite')} "
            f"(report.margin), Holm over this table; `undecided`: neither. `detectable` is "
            f"the effect found with α / m (Holm's first step) at the report's power. Unfinished "
            "runs count at the study's worst finished loss and a contrast with any is never "
            "called equivalent. `training time ×`: the level's training seconds per run "
            "(median step time × optimizer steps; a run without them counts its wall time and is "
            "named under Problems) over the reference's, geometric means over their runs: the "
            "decision's measure and the answer's `time × reference`.")


SECTION = Part("factor effects", lambda st: st, markdown=markdown)
