"""The per-layer gradient-norm heatmap: parameters x steps of the representative runs.

Draws what the ``layer_norms`` stage read (``stability.report.examine.layer_norms``): one panel per
representative run, the colour the log10 norm. Non-finite cells are marked, and the first
non-finite parameter of the first skipped step with one is named. When no plotted run has a
``layer_norms.csv`` the report says so in one line and draws nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.ticker import MaxNLocator

from stability.report.examine.layer_norms import LayerNorms, Panel
from stability.report.format import save
from stability.report.present.plots import Figure, plt  # plt: with the Agg backend chosen
from stability.report.present.sections.section import Drawn, Part
from stability.tracking.contract import Artifact

FILE = PurePosixPath(Artifact.LAYER_NORMS_FIGURE).name  # under the report's plots/ folder
TITLE = "Per-layer gradient norms"
NONFINITE_COLOR = "red"
SKIP_COLOR = "tab:orange"


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
    mark = p.mark
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


def figures(ln: LayerNorms, folder: Path) -> Sequence[Drawn]:
    """The heatmap with its caption, or one line saying why none is drawn."""
    if not ln.panels:
        return [f"{TITLE}: none of the {ln.runs} representative runs has "
                f"`{Artifact.LAYER_NORMS}` (recorded with `telemetry.per_layer=true`; "
                "older runs and runs with it off have none), so no heatmap is drawn."]
    fig, notes = heatmap(ln.panels, folder)
    if fig is None:
        return []
    caption = (
        "log10 of each parameter's pre-clip gradient L2 norm (`layer_norms.csv`) at each "
        "optimizer step, for the seed with the median best validation loss of each plotted "
        "config; colours span the 1st-99th percentile of all finite norms. Red cells and "
        "crosses: a non-finite norm (the step was skipped); orange triangles: skipped steps; "
        "grey: a zero norm (no gradient, e.g. a step skipped for a non-finite loss) or a step "
        "not recorded. "
        + ("; ".join(notes) + "." if notes else "No plotted run has a non-finite norm.")
        + (f" Without `{Artifact.LAYER_NORMS}`: {', '.join(ln.missing)}." if ln.missing else ""))
    return [Figure(fig.file, fig.title, caption)]


# ``st.findings.layer_norms`` is None when the report draws no figures (``report.plots=false``).
SECTION = Part("per-layer norms", lambda st: st.findings.layer_norms, figures=figures)
