"""Figure: the recommended max_norm from the clip-off runs' pre-clip norms.

One panel per accumulation setting: the histogram of the clip-off runs' norms, the
recommendation in red with its spread over seeds, the swept values in grey; every label sits
in the legend below the axes, so none overlaps a bar, a line or another label.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from stability.report.format import save
from stability.report.present.plots import Figure
from stability.report.present.sections.section import Part, drawn


def max_norm_advice(recs: Sequence, folder: Path) -> Figure | None:
    """Pre-clip norm distribution of the clip-off runs with the recommended max_norm, per accum.

    ``recs`` are ``advice.Recommendation``; one panel per accumulation setting.
    """
    recs = [r for r in recs if len(r.norms)]
    if not recs:
        return None
    name = save(draw_max_norm_advice(recs), folder, "max_norm_advice.png")
    return Figure(name, "Clip-off gradient norms and an untested threshold",
                  "Distribution of pre-clip gradient norms of every finished clip-off run (all "
                  "seeds and precisions of an accumulation setting, skipped steps left out). The "
                  "red line is the max_norm that would clip the target share of these steps "
                  "(median over seeds), the band its range over seeds: advice read from norms, "
                  "never trained with (section \"Clipping thresholds from the norms\"); the "
                  "clipping to train with is the answer's.")


def draw_max_norm_advice(recs: Sequence) -> plt.Figure:
    """The max_norm advice figure, unsaved (``max_norm_advice`` saves it; tests inspect it).

    Args:
        recs: ``advice.Recommendation`` with norms, one panel each.

    Returns:
        The matplotlib figure: one axis per recommendation.
    """
    # at most two panels a row: four side by side shrank the legends to ~5 px at 1280 px
    cols = min(2, len(recs))
    rows = -(-len(recs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.6 * cols + 0.6, 5.4 * rows), squeeze=False)
    for ax in axes.ravel()[len(recs):]:
        fig.delaxes(ax)  # an odd count leaves one cell empty
    for ax, r in zip(axes.ravel(), recs, strict=False):
        lo, hi = max(r.norms.min(), 1e-12), r.norms.max()
        bins = np.geomspace(lo, hi * 1.0001, 40) if hi > lo else 20
        ax.hist(r.norms, bins=bins, color="tab:blue", alpha=0.7)
        if hi > lo:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide within a decade
        ax.axvspan(r.low, r.high, color="tab:red", alpha=0.15, label="spread over seeds")
        ax.axvline(r.max_norm, color="tab:red", lw=2,
                   label=f"threshold {r.max_norm:.3g} "
                         f"(would clip {r.target_share:.0%}; not tested)")
        shares = ", ".join(f"{m:g} clips {share:.0%}" for m, share in sorted(r.swept_share.items()))
        for i, m in enumerate(sorted(r.swept_share)):
            ax.axvline(m, color="gray", ls=":", lw=1.2,
                       label=f"swept: {shares}" if i == 0 else None)
        ax.set(title=f"accum_steps={r.accum_steps} ({len(r.per_seed)} seeds, {r.steps} steps)",
               xlabel="pre-clip global gradient L2 norm (log axis)", ylabel="optimizer steps")
        # below the axes: no label sits on a bar, a line or another label
        ax.legend(fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
        ax.grid(alpha=0.3)
    fig.suptitle("Gradient norms of the clip-off runs: red, the threshold that would clip "
                 "only the spikes\n(not tested; grey: the swept values)", fontsize=10)
    return fig


SECTION = Part("max_norm advice", lambda st: st,
               figures=lambda st, folder: drawn(max_norm_advice(st.findings.advice, folder)))
