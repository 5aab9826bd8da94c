"""The per-layer norms stage: ``layer_norms.csv`` of the representative runs, read and marked.

``telemetry.per_layer`` (on by default) writes every parameter's pre-clip gradient norm per
optimizer step into the run's ``layer_norms.csv`` artifact (``stability/core/layers.py``).
The report fetches that table only for the runs it already plots, one representative seed
per plotted config (``report.examine.plotted``). A skipped step keeps its ``inf``/``nan``; on the
first skipped step with one, the first non-finite parameter (in ``named_parameters`` order, the
order ``TrainStep`` checks them in) is found. Runs from before the table existed, or with it off,
have none. ``sections.layer_norms`` draws what this stage read.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stability.core.steplog import COLUMN
from stability.report.evidence import fetch
from stability.report.evidence.inert import one_line
from stability.report.examine.plotted import Series
from stability.tracking import origins
from stability.tracking.adoption import MAX_STEPS_BYTES
from stability.tracking.contract import Artifact

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FirstNonFinite:
    """Where a run first went non-finite: the step and the parameter."""

    step: int
    parameter: str


@dataclass(frozen=True)
class Panel:
    """One representative run: its config's series, its seed and its norm table."""

    series: Series
    seed: int
    table: pd.DataFrame  # ``step``, then one column per parameter (``layer_norms.csv``)
    skipped: frozenset[int] | None = None  # steps.csv's skipped steps; None: not known

    @property
    def mark(self) -> FirstNonFinite | None:
        """Where the run first went non-finite (``first_non_finite``); None if it never did."""
        return first_non_finite(self.table, self.skipped)


def read_table(path: Path) -> pd.DataFrame:
    """``layer_norms.csv`` as floats (``inf``/``nan`` as written), sorted by step.

    Its column names are run data that reach the caption and the figure: each becomes one
    inert line (``inert.one_line``: no newline, no link, no image, no closing backtick). A
    file over ``MAX_STEPS_BYTES`` is refused before it is read.
    """
    size = path.stat().st_size
    if size > MAX_STEPS_BYTES:
        raise ValueError(f"{path.name} is {size:,} bytes, over the report's cap of "
                         f"{MAX_STEPS_BYTES:,}")
    table = pd.read_csv(path)
    table.columns = [c if c == "step" else one_line(str(c)) for c in table.columns]
    norms = table.drop(columns="step").astype(float)
    return pd.concat([table[["step"]].astype(int), norms], axis=1).sort_values(
        "step", kind="stable").reset_index(drop=True)


def fetch_tables(c: Any, run_ids: Sequence[str], dest: Path,
                 workers: int = 8) -> dict[str, pd.DataFrame]:
    """``{run_id: table}`` for the runs that have a ``layer_norms.csv`` artifact.

    The artifact list is read first, so a run without the table (an older run, or
    ``telemetry.per_layer=false``) costs one request and no failed download. A run that cannot
    be read is left out with a warning: the heatmap is never worth failing the report.
    """

    def one(run_id: str) -> pd.DataFrame | None:
        try:
            uri = origins.run_uri(c, run_id)  # a run whose artifacts are elsewhere: not read
            if Artifact.LAYER_NORMS not in {a.path for a in origins.listing(
                    c, run_id, artifact_uri=uri)}:
                return None
            (dest / run_id).mkdir(parents=True, exist_ok=True)
            return read_table(origins.download(c, run_id, Artifact.LAYER_NORMS, dest / run_id,
                                               uri))
        except Exception as err:  # an unreadable table must not end the report
            log.warning("run %s: %s not read (%s)", run_id, Artifact.LAYER_NORMS, err)
            return None

    tables = fetch.parallel(one, run_ids, workers)
    return {k: v for k, v in tables.items() if v is not None}


def first_non_finite(table: pd.DataFrame,
                     skipped: Collection[int] | None = None) -> FirstNonFinite | None:
    """The first skipped step whose row holds a non-finite norm, and its first such parameter.

    Args:
        table: ``step`` then one column per parameter, in ``named_parameters`` order.
        skipped: the run's skipped steps (``steps.csv``); ``None`` treats every row with a
            non-finite norm as skipped, which is what such a row means: ``TrainStep`` takes
            no step on a non-finite gradient.

    Returns:
        ``None`` when no (skipped) row holds a non-finite value; a step skipped for a
        non-finite loss has no gradients (its row reads 0) and is passed over.
    """
    names = [c for c in table.columns if c != "step"]
    if not names:
        return None
    bad = ~np.isfinite(table[names].to_numpy(dtype=float))
    rows = bad.any(axis=1)
    if skipped is not None:
        rows &= table["step"].isin(list(skipped)).to_numpy()
    hits = np.flatnonzero(rows)
    if not len(hits):
        return None
    i = hits[0]
    return FirstNonFinite(int(table["step"].iloc[i]), names[int(np.argmax(bad[i]))])


@dataclass(frozen=True)
class LayerNorms:
    """The representative runs' norm tables, as the heatmap shows them.

    Attributes:
        panels: one per representative run with a table, in the report's role order.
        runs: the representative runs looked at.
        missing: ``role: label`` of each representative run without a table.
    """

    panels: tuple[Panel, ...]
    runs: int
    missing: tuple[str, ...]


def gather(c: Any, runs: Sequence[tuple[Series, pd.Series]], steps: Mapping[str, pd.DataFrame],
           dest: Path, workers: int) -> LayerNorms:
    """Fetch the representative runs' tables and pair each with its skipped steps.

    Args:
        c: the MLflow client.
        runs: ``(series, run row)`` of each representative run, in the report's role order.
        steps: the fetched ``steps.csv`` tables by run id (their ``skipped`` column).
        dest: a scratch folder for the downloads.
        workers: parallel downloads.
    """
    runs = list({str(r["run_id"]): (s, r) for s, r in runs}.values())
    tables = fetch_tables(c, [str(r["run_id"]) for _, r in runs], dest, workers)
    panels = []
    for s, r in runs:
        table = tables.get(str(r["run_id"]))
        if table is None:
            continue
        df = steps.get(str(r["run_id"]))
        skipped = (frozenset(int(x) for x in df.loc[df[COLUMN.skipped] == 1, COLUMN.step])
                   if df is not None and COLUMN.skipped in df else None)
        panels.append(Panel(series=s, seed=int(r["seed"]), table=table, skipped=skipped))
    missing = tuple(f"{s.role}: {s.label}" for s, r in runs if str(r["run_id"]) not in tables)
    return LayerNorms(tuple(panels), len(runs), missing)
