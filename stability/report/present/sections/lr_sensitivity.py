"""The LR-sensitivity figure: final validation loss against the learning rate, per setting.

The figure of Wortsman et al. (2023) and Zhang et al. (2020): one curve per setting of the
other factors (clip and precision), the seed-mean capped final loss at each swept learning
rate, seeds as a min–max band, ``loss_init`` as a dashed line, and a cross where the setting
does not train stably.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from stability.core.task import DEFAULT_LOSS_NAME
from stability.report.examine.lr import LrCurve
from stability.report.format import save
from stability.report.present.plots import Figure, plt
from stability.report.present.sections.section import Part, drawn

FILE = "lr_sensitivity.png"


def lr_sensitivity(found: Sequence[LrCurve], folder: Path,
                   loss_name: str = DEFAULT_LOSS_NAME) -> Figure | None:
    """Draw ``plots/lr_sensitivity.png``; None when the study swept no learning rate."""
    if not found:
        return None
    name = save(draw(found, loss_name), folder, FILE)
    return Figure(name, "LR sensitivity",
                  "One curve per setting of the other factors; dotted: the loss before "
                  "training (loss_init), where runs that diverged or did not finish are drawn; "
                  "x: the setting does not train stably at that learning rate (its verdict is "
                  "unstable, or its loss is not below loss_init).")


def draw(found: Sequence[LrCurve], loss_name: str = DEFAULT_LOSS_NAME) -> plt.Figure:
    """The LR-sensitivity figure, unsaved (``lr_sensitivity`` saves it; tests inspect it).

    Args:
        found: the curves, one per setting of the other factors (not empty).
        loss_name: the task's loss, named on the y axis.

    Returns:
        The matplotlib figure: one axis, one line per curve.
    """
    fig, ax = plt.subplots(figsize=(8, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, c in enumerate(found):
        color = colors[i % len(colors)]
        ax.plot(c.lrs, c.loss, marker="o", color=color,
                label=f"{c.label}: sensitivity {c.sensitivity:.3f} (n={c.seeds})")
        ax.fill_between(c.lrs, c.low, c.high, color=color, alpha=0.15)
        bad = [(lr, v) for lr, v, ok in zip(c.lrs, c.loss, c.stable, strict=True) if not ok]
        if bad:
            ax.scatter(*zip(*bad, strict=True), marker="x", s=80, color=color, zorder=3)
        if math.isfinite(c.loss_init):
            ax.axhline(c.loss_init, color=color, linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set(title="Final validation loss vs learning rate (mean over seeds, band: min–max)",
           xlabel="learning rate (train.lr)",
           ylabel=f"final validation loss ({loss_name}), capped at loss_init")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return fig



SECTION = Part("LR sensitivity", lambda st: st,
               figures=lambda st, folder: drawn(lr_sensitivity(st.findings.lr_curves, folder,
                                                               st.fetched.loss_name)))
