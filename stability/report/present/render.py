"""report.md from the sections, and ``summary.csv``: the frame around what the sections write.

The frame is the title (where the study was read, when and by which report run), then each
section's Markdown in registry order, "Problems" (what went wrong without stopping the report),
"Figures" and how to reproduce. Every number comes from the sweep's runs or from the winner's
test evaluation; nothing is typed in by hand.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from stability.report.decide.table import ConfigTable
from stability.report.evidence.inert import one_line
from stability.report.present.plots import Figure
from stability.report.present.sections import SECTIONS, Section
from stability.report.present.study import Study

log = logging.getLogger(__name__)

# Figures shown right under the answer (the first screen: the answer and why), not under
# "Figures": the main effects are the answer's table drawn.
LEAD_FIGURES = ("main_effects.png",)
BEHIND = "Behind the decision:"  # where the answer's first screen ends (sections/answer.py)

@dataclass(frozen=True)
class Written:
    """What the sections produced.

    Attributes:
        body: each section's Markdown, in registry order.
        figures: the figures drawn, in registry order.
        remarks: one line each for a figure that had nothing to draw, and why.
        notes: one line each for a figure that could not be drawn (for "Problems").
    """

    body: tuple[str, ...]
    figures: tuple[Figure, ...]
    remarks: tuple[str, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Header:
    """The report run's own facts for the title lines."""

    report_run_id: str
    model_version: str  # "" when not registered
    elapsed_s: float
    generated_at: str
    git_commit: str


def write_sections(study: Study, plots: Path | None,
                   sections: Sequence[Section] = SECTIONS) -> Written:
    """Analyse every section, draw its figures into ``plots`` (None: no figures), write it.

    A figure that fails is one line under Problems, never the end of the report.
    """
    body: list[str] = []
    figures: list[Figure] = []
    remarks: list[str] = []
    notes: list[str] = []
    for section in sections:
        result = section.analyse(study)
        if result is None:
            continue
        if plots is not None:
            try:
                drawn = section.figures(result, plots)
            except Exception as err:  # one broken figure must not cost the whole report
                # one line on the terminal (the report's Problems say it too); traceback at debug
                log.warning("figure %s could not be drawn: %s: %s", section.name,
                            type(err).__name__, err)
                log.debug("figure %s failed", section.name, exc_info=True)
                notes.append(f"figure '{section.name}' could not be drawn: "
                             f"{type(err).__name__}: {err}")
                drawn = ()
            figures += [d for d in drawn if isinstance(d, Figure)]
            remarks += [d for d in drawn if isinstance(d, str)]
        text = section.markdown(result)
        if text:
            body.append(text)
    return Written(tuple(body), tuple(figures), tuple(remarks), tuple(notes))


def _flat(text: str) -> str:
    """Our own line of Markdown with any control character (a newline) as a space."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def render(study: Study, written: Written, header: Header, notes: Sequence[str]) -> str:
    """The whole report.md; ``notes`` are its Problems (every one made inert: they hold data)."""
    s, runs = study.fetched.sweep, study.fetched.runs
    seeds = sorted(runs["seed"].unique())
    parts = [
        f"# Training-stability report: sweep `{s.sweep_id}`", "",
        f"Experiment `{s.experiment}` at `{study.tracking_uri}`; {len(runs)} training runs, "
        f"{len(study.findings.configs)} configs, seeds {', '.join(map(str, seeds))}. Generated "
        f"{header.generated_at} (git `{header.git_commit[:12] or 'unknown'}`) in "
        f"{header.elapsed_s:.1f} s; MLflow report run `{header.report_run_id}`"
        + (f", registered model version {header.model_version}." if header.model_version
           else "."), "",
    ]
    # Problems, remarks and captions quote run data (a column name, a reason): each is one
    # line (the data in a remark or caption made inert where it was read), so a newline in it
    # can never start a section of its own
    lead = [f for f in written.figures if f.file in LEAD_FIGURES]
    for i, text in enumerate(written.body):
        if i == 0 and lead:  # the answer's first screen, its figure, then what is behind it
            first, behind = (text.split(BEHIND, 1) + [""])[:2]
            parts.append(first.rstrip("\n") + "\n")
            for f in lead:
                parts += _figure(f)
            if behind:
                parts.append(BEHIND + behind)
            continue
        parts.append(text)
    if notes:
        parts += ["## Problems while writing this report", "",
                  *[f"- {one_line(note)}" for note in notes], ""]
    parts += ["## Figures", ""]
    for remark in written.remarks:
        parts += [_flat(remark), ""]
    for f in written.figures:
        if f not in lead:
            parts += _figure(f)
    parts += ["## Reproduce", "", "```bash",
              f"python experiments/report.py experiment={s.experiment} sweep_id={s.sweep_id}",
              "```", "", "`summary.csv` holds the ranked table with every aggregate above.", ""]
    return "\n".join(parts)


# A spreadsheet formula's first character (OWASP's CSV injection list, and ``|``: a DDE call
# in LibreOffice and older Excel)
FORMULA_STARTS = ("=", "+", "-", "@", "|", "\t", "\r")


def _cell(value: object) -> object:
    """A text cell a spreadsheet would run as a formula, prefixed with ``'`` (OWASP's CSV
    injection advice); numbers, and text that is a plain number (``-1``), stay as they are.

    Judged on the text as a spreadsheet reads it: compatibility forms folded (NFKC: the
    full-width ``＝`` is ``=``) and leading white space dropped (`` =1+1`` is a formula in
    LibreOffice; a tab became that space when the value was read, ``html.one_line``).
    """
    if not isinstance(value, str):
        return value
    folded = unicodedata.normalize("NFKC", value).lstrip()
    if not folded.startswith(FORMULA_STARTS) and not value.startswith(FORMULA_STARTS):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def _figure(f: Figure) -> list[str]:
    """One figure's lines: its title, the image (alt text: the title) and its caption."""
    return [f"### {f.title}", "", f"![{f.title}](plots/{f.file})", "", _flat(f.caption), ""]


def write_summary(configs: ConfigTable, path: Path) -> None:
    """One row per config with every aggregate the report uses (``table.SUMMARY_COLUMNS``);
    a text cell read from runs that starts like a formula is prefixed with ``'``."""
    table = configs.summary()
    for col in table.columns:
        if not pd.api.types.is_numeric_dtype(table[col]):  # numbers stay numbers
            table[col] = table[col].map(_cell)
    table.to_csv(path, index=False)
