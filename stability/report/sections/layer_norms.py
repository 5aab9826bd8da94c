"""The per-layer gradient-norm heatmap: ``layer_norms.csv`` of the representative runs.

``telemetry.per_layer`` (on by default) writes every parameter's pre-clip gradient norm per
optimizer step into the run's ``layer_norms.csv`` artifact (``stability/core/layers.py``).
The report fetches that table only for the runs it already plots, one representative seed
per plotted config (``sections.plotted``), and draws parameters x steps with the colour the
log10 norm. A skipped step keeps its ``inf``/``nan``: those cells are marked, and on the first
skipped step with one the first non-finite parameter (in ``named_parameters`` order, the order
``TrainStep`` checks them in) is named. Runs from before the table existed, or with it off,
have none; when no plotted run has it the report says so in one line and draws nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.ticker import MaxNLocator

from stability.core.steplog import COLUMN
from stability.report import fetch
from stability.report.format import save
from stability.report.html import one_line
from stability.report.plots import Figure, Series, plt  # plt: with the Agg backend chosen
from stability.report.sections.plotted import plotted
from stability.report.sections.section import Drawn, Part
from stability.report.study import Study
from stability.tracking import origins
from stability.tracking.adoption import MAX_STEPS_BYTES
from stability.tracking.contract import Artifact

log = logging.getLogger(__name__)

FILE = PurePosixPath(Artifact.LAYER_NORMS_FIGURE).name  # under the report's plots/ folder
TITLE = "Per-layer gradient norms"
NONFINITE_COLOR = "red"
SKIP_COLOR = "tab:orange"


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


def read_table(path: Path) -> pd.DataFrame:
    """``layer_norms.csv`` as floats (``inf``/``nan`` as written), sorted by step.

    Its column names are run data that reach the caption and the figure: each becomes one
    inert line (``html.one_line``: no newline, no link, no image, no closing backtick). A
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
            repo = origins.repo(c, run_id)  # a run whose artifacts are elsewhere: not read
            if Artifact.LAYER_NORMS not in {a.path for a in repo.list_artifacts()}:
                return None
            (dest / run_id).mkdir(parents=True, exist_ok=True)
            return read_table(Path(repo.download_artifacts(Artifact.LAYER_NORMS,
                                                           str(dest / run_id))))
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


def _grid(table: pd.DataFrame) -> tuple[list[str], np.ndarray, np.ndarray, int]:
    """Parameters x steps over every step from the first to the last recorded one.

    Returns the names, the norms (NaN where a step was not recorded, e.g. before a resume),
    whether each cell was recorded, and the first step.
    """
    names = [c for c in table.columns if c != "step"]
    first, last = int(table["step"].min()), int(table["step"].max())
    full = table.set_index("step").reindex(range(first, last + 1))
    recorded = np.repeat(full[names[0]].index.isin(table["step"])[None, :], len(names), axis=0)
    return names, full[names].to_numpy(dtype=float).T, recorded, first


def _colour_range(panels: Sequence[Panel]) -> tuple[float, float]:
    values = np.concatenate([p.table.drop(columns="step").to_numpy(dtype=float).ravel()
                             for p in panels])
    values = values[np.isfinite(values) & (values > 0)]
    if not len(values):
        return -1.0, 1.0
    low, high = np.percentile(np.log10(values), [1, 99])  # one outlier must not flatten it
    return (float(low), float(high)) if high > low else (float(low) - 0.5, float(high) + 0.5)


def _draw_panel(ax: plt.Axes, p: Panel, vmin: float, vmax: float) -> tuple[Any, str]:
    names, values, recorded, first = _grid(p.table)
    last = first + values.shape[1] - 1
    extent = (first - 0.5, last + 0.5, len(names) - 0.5, -0.5)
    finite_positive = np.isfinite(values) & (values > 0)
    logs = np.where(finite_positive, np.log10(np.where(finite_positive, values, 1.0)), np.nan)
    # grey: a zero norm (no gradient) or a step not recorded
    cmap = plt.get_cmap("viridis").with_extremes(bad="lightgrey")
    image = ax.imshow(np.ma.masked_invalid(logs), aspect="auto", interpolation="nearest",
                      cmap=cmap, vmin=vmin, vmax=vmax, extent=extent)
    bad = ~np.isfinite(values) & recorded
    if bad.any():
        ax.imshow(np.ma.masked_where(~bad, np.ones_like(values)), aspect="auto",
                  interpolation="nearest", cmap=ListedColormap([NONFINITE_COLOR]), extent=extent)
        rows, cols = np.nonzero(bad)  # markers keep a one-step cell visible in a long run
        ax.scatter(cols + first, rows, marker="X", s=36, fc=NONFINITE_COLOR, ec="black",
                   lw=0.6, zorder=3)
    if p.skipped:
        steps = sorted(s for s in p.skipped if first <= s <= last)
        ax.scatter(steps, [-0.5] * len(steps), marker="v", s=22, color=SKIP_COLOR,
                   clip_on=False, zorder=4)
    mark = first_non_finite(p.table, p.skipped)
    note = ""
    if mark is not None:
        row = names.index(mark.parameter)
        right, low = mark.step > (first + last) / 2, row >= len(names) / 2
        ax.annotate(f"first non-finite: {mark.parameter} (step {mark.step})",
                    xy=(mark.step, row), xytext=(-24 if right else 24, 16 if low else -16),
                    textcoords="offset points", ha="right" if right else "left",
                    va="bottom" if low else "top", fontsize=8,
                    color="black", bbox={"boxstyle": "round", "fc": "white", "ec": "red"},
                    arrowprops={"arrowstyle": "->", "color": NONFINITE_COLOR})
        note = (f"{p.series.role} (seed {p.seed}): first non-finite `{mark.parameter}` at step "
                f"{mark.step}")
    every = max(1, len(names) // 40)  # at most ~40 readable labels
    ax.set_yticks(range(0, len(names), every), names[::every],
                  fontsize=7 if len(names) <= 20 else 6)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{p.series.role}: {p.series.label} (seed {p.seed})", fontsize=9)
    return image, note


def heatmap(panels: Sequence[Panel], folder: Path) -> tuple[Figure | None, list[str]]:
    """Parameters x optimizer steps, colour log10 of the norm, one panel per run.

    Returns:
        The figure (``None`` when no panel has a row) and, per panel with one, the sentence
        naming its first non-finite parameter.
    """
    panels = [p for p in panels if len(p.table) and p.table.shape[1] > 1]
    if not panels:
        return None, []
    vmin, vmax = _colour_range(panels)
    heights = [max(1.3, 0.16 * (p.table.shape[1] - 1) + 0.7) for p in panels]
    fig, axes = plt.subplots(len(panels), 1, squeeze=False, layout="constrained",
                             figsize=(11, max(3.6, sum(heights) + 1.2)),
                             gridspec_kw={"height_ratios": heights})
    image, notes = None, []
    for ax, p in zip(axes[:, 0], panels, strict=True):
        image, note = _draw_panel(ax, p, vmin, vmax)
        if note:
            notes.append(note)
    axes[-1, 0].set_xlabel("optimizer step")
    fig.colorbar(image, ax=axes[:, 0].tolist(), extend="both",
                 label="log10 pre-clip gradient L2 norm")
    handles = [plt.Line2D([], [], marker="X", mfc=NONFINITE_COLOR, mec="black", ls="",
                          label="non-finite (inf/nan) norm"),
               plt.Line2D([], [], marker="v", color=SKIP_COLOR, ls="", label="skipped step"),
               plt.Rectangle((0, 0), 1, 1, color="lightgrey", label="zero (no gradient) or "
                             "not recorded")]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle("Per-parameter pre-clip gradient norm per optimizer step "
                 "(one representative seed per config)", fontsize=10)
    save(fig, folder, FILE, tight=False)  # constrained layout: no tight_layout
    return Figure(FILE, TITLE, ""), notes


def figure(c: Any, runs: Sequence[tuple[Series, pd.Series]], steps: dict[str, pd.DataFrame],
           folder: Path, dest: Path, workers: int, remarks: list[str]) -> Figure | None:
    """Fetch the representative runs' tables and draw them; a line in ``remarks`` if none has one.

    Args:
        c: the MLflow client.
        runs: ``(series, run row)`` of each representative run, in the report's role order.
        steps: the fetched ``steps.csv`` tables by run id (their ``skipped`` column).
        folder: the report's ``plots/`` folder.
        dest: a scratch folder for the downloads.
        workers: parallel downloads.
        remarks: one-line statements for the report's figure section.
    """
    runs = list({str(r["run_id"]): (s, r) for s, r in runs}.values())
    tables = fetch_tables(c, [str(r["run_id"]) for _, r in runs], dest, workers)
    if not tables:
        remarks.append(f"{TITLE}: none of the {len(runs)} representative runs has "
                       f"`{Artifact.LAYER_NORMS}` (recorded with `telemetry.per_layer=true`; "
                       "older runs and runs with it off have none), so no heatmap is drawn.")
        return None
    panels = []
    for s, r in runs:
        table = tables.get(str(r["run_id"]))
        if table is None:
            continue
        df = steps.get(str(r["run_id"]))
        skipped = (frozenset(int(x) for x in df.loc[df[COLUMN.skipped] == 1, COLUMN.step])
                   if df is not None and COLUMN.skipped in df else None)
        panels.append(Panel(s, int(r["seed"]), table, skipped))
    fig, notes = heatmap(panels, folder)
    if fig is None:
        return None
    missing = [f"{s.role}: {s.label}" for s, r in runs if str(r["run_id"]) not in tables]
    caption = (
        "log10 of each parameter's pre-clip gradient L2 norm (`layer_norms.csv`) at each "
        "optimizer step, for the seed with the median best validation loss of each plotted "
        "config; colours span the 1st-99th percentile of all finite norms. Red cells and "
        "crosses: a non-finite norm (the step was skipped); orange triangles: skipped steps; "
        "grey: a zero norm (no gradient, e.g. a step skipped for a non-finite loss) or a step "
        "not recorded. "
        + ("; ".join(notes) + "." if notes else "No plotted run has a non-finite norm.")
        + (f" Without `{Artifact.LAYER_NORMS}`: {', '.join(missing)}." if missing else ""))
    return Figure(fig.file, fig.title, caption)


def _figures(st: Study, folder: Path) -> Sequence[Drawn]:
    p = plotted(st)
    remarks: list[str] = []
    fig = figure(st.client, [(p.series[fp], r) for fp, r in p.rep.items() if r is not None],
                 dict(st.steps), folder, st.cache / "layers", st.options.history_workers, remarks)
    return [*remarks, *([fig] if fig is not None else [])]


SECTION = Part("per-layer norms", lambda st: st, figures=_figures)
