"""Review figures (matplotlib Agg, PNG): one idea per figure, labelled axes, legends.

Every function takes plain DataFrames/Series already fetched, writes one PNG and returns a
``Figure`` (file name and caption for report.md), or ``None`` when there is nothing to draw
(e.g. no fp16 config in the sweep).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: the report runs on servers and in CI

import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from stability.core.precision import Precision  # noqa: E402
from stability.core.steplog import COLUMN  # noqa: E402
from stability.core.task import DEFAULT_LOSS_NAME  # noqa: E402
from stability.design.design import Design  # noqa: E402
from stability.design.factors import CLIP, MAX_NORM, PRECISION, kind, precision_rank  # noqa: E402
from stability.report.examine.plotted import Series  # noqa: E402
from stability.report.format import fmt, save  # noqa: E402

PRECISION_COLORS = {Precision.FP32: "tab:blue", Precision.BF16: "tab:green",
                    Precision.FP16: "tab:orange"}


@dataclass(frozen=True)
class Figure:
    """A written figure: its file name (relative to the report folder) and caption."""

    file: str
    title: str
    caption: str


def _log_if_wide(ax: plt.Axes, values: Sequence[float] | np.ndarray, axis: str = "y") -> bool:
    """Log scale when the positive finite values span more than a decade."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if len(v) and v.max() / v.min() > 10:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
        return True
    return False


def grad_norm(curves: Sequence[tuple[Series, pd.DataFrame]], folder: Path,
              thresholds: Sequence[float] = ()) -> Figure | None:
    """Pre-clip gradient norm over optimizer steps: one panel per config (small multiples).

    Each panel holds one config's curve and, dashed, its own max_norm; ``thresholds`` (the
    sweep's max_norm values) are drawn faintly in every panel, so the plot shows where clipping
    would act even when the config does not clip. Panels share both axes.
    """
    curves = [(s, df) for s, df in curves if len(df)]
    if not curves:
        return None
    fig, axes = plt.subplots(len(curves), 1, figsize=(11, 1.9 * len(curves) + 1.0),
                             sharex=True, sharey=True, squeeze=False)
    values = [v for _, df in curves for v in df[COLUMN.grad_l2_pre_clip] if np.isfinite(v)]
    for ax, (s, df) in zip(axes[:, 0], curves, strict=True):
        ok = df[np.isfinite(df[COLUMN.grad_l2_pre_clip])]
        for i, t in enumerate(sorted(set(thresholds) - {s.max_norm})):
            ax.axhline(t, color="gray", ls=":", lw=1,
                       label="other swept max_norm values" if i == 0 else None)
        ax.plot(ok[COLUMN.step], ok[COLUMN.grad_l2_pre_clip], lw=0.8, color=s.color,
                label="pre-clip norm")
        if math.isfinite(s.max_norm):
            ax.axhline(s.max_norm, color=s.color, ls="--", lw=1.4,
                       label=f"its max_norm={s.max_norm:g}")
        ax.set_title(f"{s.role}: {s.label}", fontsize=10, loc="left")
        # outside the axes, right of the traces: a legend never covers the curve it explains
        ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        ax.grid(alpha=0.3)
    _log_if_wide(axes[0, 0], [*values, *thresholds])
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1, 0].set_xlabel("optimizer step")
    fig.supylabel("global L2 norm of gradients before clipping", fontsize=9)
    fig.suptitle("Pre-clip gradient norm per optimizer step (one representative seed per config)",
                 fontsize=10)
    name = save(fig, folder, "grad_norm.png")
    return Figure(name, "Pre-clip gradient norm",
                  "Global L2 gradient norm before clipping at each optimizer step, one panel per "
                  "plotted config (the seed with the median best validation loss); dashed: the "
                  "config's own max_norm, dotted grey: the sweep's other max_norm values. "
                  "Skipped (non-finite) steps are not drawn.")


def clip_fraction(configs: pd.DataFrame, folder: Path) -> Figure | None:
    """Share of clipped steps vs max_norm, one line per precision, a panel per accum_steps."""
    on = configs[configs["clip_enabled"] & np.isfinite(configs["max_norm"])]
    if on.empty:
        return None
    accums = sorted(on["accum_steps"].unique())
    fig, axes = plt.subplots(1, len(accums), figsize=(3.6 * len(accums) + 1, 4), sharey=True,
                             squeeze=False)
    precisions = sorted(on["precision"].unique(), key=precision_rank)
    for ax, acc in zip(axes[0], accums, strict=True):
        for precision, g in on[on["accum_steps"] == acc].groupby("precision"):
            g = g.sort_values("max_norm")
            # each precision a little apart on the log axis: equal lines stay visible
            dodge = 1.06 ** (precisions.index(precision) - (len(precisions) - 1) / 2)
            ax.errorbar(g["max_norm"] * dodge, g["clip_fraction_mean"],
                        yerr=g["clip_fraction_std"], marker="o", capsize=3,
                        color=PRECISION_COLORS.get(precision), label=str(precision),
                        alpha=0.85)
        ax.set_xscale("log")
        swept = sorted(on["max_norm"].unique())
        ax.set_xticks(swept, [f"{m:g}" for m in swept])  # the swept values, not powers of 2
        ax.minorticks_off()
        ax.set(title=f"accum_steps={acc}", xlabel=f"{MAX_NORM} (log axis, ticks: swept values)",
               ylim=(-0.03, 1.03))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of optimizer steps clipped")
    axes[0][-1].legend(title=PRECISION)
    fig.suptitle("Clip fraction vs max_norm (mean over seeds, error bars: ±1 std)")
    name = save(fig, folder, "clip_fraction.png")
    return Figure(name, "Clip fraction vs max_norm",
                  "Fraction of optimizer steps whose pre-clip norm exceeded max_norm, in the runs "
                  "that trained with it (the ranked table's `clipped`); one line per precision, "
                  "drawn slightly apart so equal lines stay visible, one panel per accumulation "
                  "setting.")


def val_loss_curves(curves: Sequence[tuple[Series, dict[int, pd.Series]]],
                    folder: Path, loss_name: str = DEFAULT_LOSS_NAME) -> Figure | None:
    """Validation loss per epoch: mean ± 1 std over the finished seeds of each config.

    ``loss_name`` is the task's (``stability.loss_name`` of its runs), on the loss axis.
    """
    curves = [(s, h) for s, h in curves if h]
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(11, 4.8))
    values = []
    for s, histories in curves:
        table = pd.DataFrame(histories)  # rows: epoch, columns: seed
        mean, std = table.mean(axis=1), table.std(axis=1, ddof=1).fillna(0)
        ax.plot(mean.index, mean, color=s.color, marker=".",
                label=f"{s.role}: {s.label} (n={table.shape[1]})")
        ax.fill_between(mean.index, mean - std, mean + std, color=s.color, alpha=0.10,
                        lw=0)
        values.extend(table.to_numpy().ravel())
    _log_if_wide(ax, values)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title="Validation loss per epoch (mean over finished seeds, band: ±1 std)",
           xlabel="epoch", ylabel=f"validation loss ({loss_name})")
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3)
    name = save(fig, folder, "val_loss_curves.png")
    return Figure(name, "Validation loss curves",
                  "The chosen config against the baseline, the lowest mean (rank 1) and the "
                  "configs whose validation mean is nearest its own (their rank by validation "
                  "mean in the legend); seeds that diverged are not averaged in (they count as "
                  "+inf in the ranking).")


def scaler_scale(curves: Sequence[tuple[Series, pd.DataFrame]], folder: Path) -> Figure | None:
    """fp16 GradScaler scale over optimizer steps (log2 axis), skipped steps marked."""
    curves = [(s, df) for s, df in curves if len(df)]
    if not curves:
        return None
    fig, axes = plt.subplots(len(curves), 1, figsize=(9, 2.8 * len(curves) + 0.6),
                             sharex=True, squeeze=False)
    for ax, (s, df) in zip(axes[:, 0], curves, strict=True):
        ax.step(df[COLUMN.step], df[COLUMN.scaler_scale], where="post", color=s.color, lw=1.2,
                label="scale used at the step")
        skipped = df[df[COLUMN.skipped] == 1]
        ax.scatter(skipped[COLUMN.step], skipped[COLUMN.scaler_scale], marker="x", color="red",
                   s=30, zorder=3, label=f"skipped step ({len(skipped)})")
        ax.set_yscale("log", base=2)
        ax.set(title=f"{s.role}: {s.label}", ylabel="loss scale (log2 axis)")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("optimizer step")
    fig.suptitle("fp16 GradScaler scale per optimizer step (one representative seed)")
    name = save(fig, folder, "fp16_scaler.png")
    return Figure(name, "fp16 GradScaler scale",
                  "The dynamic loss scale halves on each overflow (red x: step skipped) and "
                  "doubles after growth_interval clean steps.")


def skipped_steps(configs: pd.DataFrame, folder: Path) -> Figure | None:
    """Mean skipped optimizer steps per run, one bar per config that skipped; None if none did."""
    configs = configs[configs["skip_count_mean"].fillna(0) > 0]
    if configs.empty:
        return None
    # Grouped like the grid (precision, accumulation, clip off then thresholds), read top down:
    # barh draws the first row at the bottom, hence the reversal.
    df = configs.assign(_p=configs["precision"].map(precision_rank),
                        _m=configs["max_norm"].fillna(0))
    df = df.sort_values(["_p", "accum_steps", "clip_enabled", "_m", "rank"]).iloc[::-1]
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(df) + 1.6))
    ax.barh(df["label"], df["skip_count_mean"].fillna(0), xerr=df["skip_count_std"].fillna(0),
            color=[PRECISION_COLORS.get(p, "gray") for p in df["precision"]], capsize=2)
    ax.set_xlim(left=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title="Skipped optimizer steps per run (mean over seeds, error bars: ±1 std)",
           xlabel="skipped optimizer steps per run", ylabel="config")
    ax.tick_params(axis="y", labelsize=9)
    drawn = [p for p in PRECISION_COLORS if p in set(df["precision"])]  # only the bars' colours
    handles = [plt.Rectangle((0, 0), 1, 1, color=PRECISION_COLORS[p]) for p in drawn]
    ax.legend(handles, drawn, title=PRECISION, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    name = save(fig, folder, "skipped_steps.png")
    return Figure(name, "Skipped steps per config",
                  "Steps skipped for a non-finite loss or gradient (parameters, optimizer "
                  "state and LR schedule untouched); only the configs that skipped a step. An "
                  "fp16 GradScaler skips a step on each overflow and halves its scale: those "
                  "skips are its normal working and do not make a config unstable (the "
                  "stability verdict counts only skips no halving answered).")


def heatmap(configs: pd.DataFrame, folder: Path, design: Design,
            loss_name: str = DEFAULT_LOSS_NAME) -> Figure | None:
    """Mean best validation loss over the design's row x column factors, a panel per level of
    the others (``Kind.heatmap``: clipping x accumulation, a panel per precision).

    Args:
        configs: the config table (row 0: the decision's choice).
        folder: where the PNG goes.
        design: the study's ``Design`` (its axes give rows, columns and panels).
        loss_name: labels the colour bar (the task's loss).
    """
    axes_of = {role: [f for f in design.axes if kind(f.name).heatmap == role]
               for role in ("rows", "columns", "panels")}
    if not design.configs or not axes_of["rows"] or not axes_of["columns"]:
        return None
    row_f, col_f, panel_fs = axes_of["rows"][0], axes_of["columns"][0], axes_of["panels"]
    norm = configs[configs["fingerprint"].isin(design.configs)]
    if norm.empty:
        return None
    rows, cols = row_f.levels, col_f.levels
    where = {fp: (row_f.levels.index(design.level(fp, row_f.name)),
                  col_f.levels.index(design.level(fp, col_f.name)),
                  tuple(design.level(fp, f.name) for f in panel_fs)) for fp in norm["fingerprint"]}
    panels = [p for p in itertools.product(*(f.levels for f in panel_fs))
              if any(w[2] == p for w in where.values())]
    # A panel is titled by the panel factors that vary (none: the first, e.g. its precision).
    titled = [i for i, f in enumerate(panel_fs) if len(f.levels) > 1] or ([0] if panel_fs else [])
    finite = norm["loss_mean"][np.isfinite(norm["loss_mean"])]
    vmin, vmax = (finite.min(), finite.max()) if len(finite) else (0, 1)
    # panels stacked, not side by side: at page width each cell keeps room for its numbers
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(2.2 + 1.5 * len(cols) + 1.4,
                                      (0.55 * len(rows) + 0.9) * len(panels) + 1.2),
                             layout="constrained")
    image = None
    chosen = configs.iloc[0]["fingerprint"]  # the decision's choice (row 0), not rank 1
    for ax, p in zip(axes[:, 0], panels, strict=True):
        grid = np.full((len(rows), len(cols)), np.nan)
        verdicts: dict[tuple[int, int], str] = {}
        mine = norm[[where[fp][2] == p for fp in norm["fingerprint"]]].assign(
            _chosen=lambda d: d["fingerprint"] == chosen)
        # best-ranked last wins a shared cell (another factor swept), the chosen config always
        for _, c in mine.sort_values(["_chosen", "rank"], ascending=[True, False]).iterrows():
            r, k, _ = where[c["fingerprint"]]
            grid[r, k] = c["loss_mean"]
            verdicts[(r, k)] = str(c.get("stability", "stable"))
            if c["fingerprint"] == chosen:
                ax.add_patch(plt.Rectangle((k - 0.5, r - 0.5), 1, 1, fill=False, ec="red", lw=3,
                                           zorder=5))  # above the clip-off row's white line
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis_r", vmin=vmin, vmax=vmax,
                          aspect="auto")
        for (r, k), v in np.ndenumerate(grid):
            text = "diverged" if v == math.inf else ("n/a" if np.isnan(v) else fmt(v))
            if verdicts.get((r, k), "stable") not in ("stable", "not judged"):
                text += f"\n{verdicts[(r, k)]}"  # the verdict sits on the number it qualifies
            dark = np.isfinite(v) and vmax > vmin and (v - vmin) / (vmax - vmin) > 0.6
            ax.text(k, r, text, ha="center", va="center", fontsize=10,
                    color="gray" if not np.isfinite(v) else ("white" if dark else "black"))
        ax.set_xticks(range(len(cols)), list(cols))
        ax.tick_params(labelbottom=True)  # every stacked panel names its columns
        ax.set_yticks(range(len(rows)), [row_f.name_of(r) for r in rows])
        if row_f.name == CLIP:
            ax.axhline(0.5, color="white", lw=3)  # clip-off row is its own block
        ax.set(title=", ".join(panel_fs[i].name_of(p[i]) for i in titled),
               ylabel=kind(row_f.name).axis)
    axes[-1][0].set_xlabel(kind(col_f.name).axis)
    fig.colorbar(image, ax=axes[:, 0].tolist(), label=f"mean best validation loss ({loss_name})")
    fig.suptitle(f"Mean best validation loss by {row_f.name} x {col_f.name}\nred box: the "
                 "chosen config (not always the lowest mean, the brightest cell);\na cell's "
                 "second line: its verdict when not stable", fontsize=10)
    save(fig, folder, "heatmap.png", tight=False)  # constrained layout: no tight_layout
    return Figure("heatmap.png", "Best validation loss heatmap",
                  "Mean over seeds of each config's best validation loss; 'diverged' marks a "
                  "config with a seed that did not finish (+inf), 'n/a' a cell not in the sweep; "
                  "'marginal' / 'unstable' is the config's stability verdict.")
