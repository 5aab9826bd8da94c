"""The main-effects figure: one panel per factor, each level's effect with its CI and verdict.

A reviewer reads the whole study at a glance: the reference level sits at 0, every other level
at its pooled effect on best validation loss (every run, seeds as blocks) with the CI, the
equivalence margin as a grey band, and the verdict beside each point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from stability.core.task import DEFAULT_LOSS_NAME
from stability.design.factors import level_name, title
from stability.report.decide.factors import FactorAnalysis
from stability.report.format import save, size
from stability.report.present.plots import Figure, plt
from stability.report.present.sections.section import Drawn, Part, drawn
from stability.report.present.study import Study
from stability.stats.effects import EQUIVALENT, HELPS, HURTS

COLORS = {HELPS: "tab:green", HURTS: "tab:red", EQUIVALENT: "tab:blue"}
FILE = "main_effects.png"


def main_effects(an: FactorAnalysis, folder: Path, loss_name: str = DEFAULT_LOSS_NAME,
                 chosen: Mapping[str, str] | None = None) -> Figure | None:
    """Draw ``plots/main_effects.png``; None when the study swept no factor.

    ``chosen`` maps a factor to the decision's level: ringed in red, its tick label bold.
    """
    chosen = chosen or {}
    panels = [f for f in an.factors if any(e.factor == f.name for e in an.main)]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False,
                             sharey=False)
    for ax, f in zip(axes[0], panels, strict=True):
        effects = {e.level: e for e in an.main if e.factor == f.name}
        ax.axhspan(-an.margin, an.margin, color="0.88", zorder=0,
                   label=f"±margin {size(an.margin, 'nonfinite')}")
        ax.axhline(0, color="0.4", lw=0.8)
        for x, level in enumerate(f.levels):
            e = effects.get(level)
            if e is None:  # the reference (or a level without a complete table)
                ax.plot(x, 0, "o", color="0.3")
                continue
            color = COLORS.get(e.verdict, "0.5")
            ax.errorbar(x, e.mean, yerr=[[e.mean - e.low], [e.high - e.mean]], fmt="o",
                        color=color, capsize=4)
            ax.annotate(e.verdict, (x, e.high), textcoords="offset points", xytext=(0, 4),
                        ha="center", fontsize=10, color=color)
        if chosen.get(f.name) in f.levels:  # the decision's level: a red ring, a bold tick
            x = f.levels.index(chosen[f.name])
            y = effects[chosen[f.name]].mean if chosen[f.name] in effects else 0.0
            ax.plot(x, y, "o", ms=15, mfc="none", mec="red", mew=2,
                    label="chosen" if f is panels[0] else None)  # the legend's panel
        ax.set_xticks(range(len(f.levels)),
                      [level_name(f.name, lv) for lv in f.levels], rotation=20, fontsize=10)
        for tick, lv in zip(ax.get_xticklabels(), f.levels, strict=True):
            if chosen.get(f.name) == lv:
                tick.set_fontweight("bold")
                tick.set_color("red")
        ax.set_title(f"{title(f.name)} (ref {level_name(f.name, f.reference)})", fontsize=11)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.12)  # room for the verdict above the highest interval
    axes[0][0].set_ylabel(f"Δ best val loss vs reference ({loss_name})")
    axes[0][0].legend(fontsize=10, loc="best")
    save(fig, folder, FILE)
    return Figure(FILE, "Main effects (every run, seeds as blocks)",
                  f"Each level's effect on best validation loss against its factor's reference, "
                  f"pooled over every other setting and seed, with its {an.confidence:.0%} CI; "
                  f"grey: the equivalence margin ±{size(an.margin, 'nonfinite')}; the word is "
                  "the verdict (Holm over the table); red ring and bold tick: the chosen level. "
                  "Below zero lowers the loss.")


def _analyse(st: Study) -> Study | None:
    return st if st.evidence.analysis is not None else None


def _figures(st: Study, folder: Path) -> Sequence[Drawn]:
    an = st.evidence.analysis
    assert an is not None  # _analyse leaves a study without one out
    return drawn(main_effects(an, folder, st.fetched.loss_name, chosen_levels(st)))


def chosen_levels(st: Study) -> dict[str, str]:
    """Each decided factor's chosen level (one per factor, joint groups split)."""
    dec = st.decided.decision
    return {f: lv for c in (dec.choices if dec is not None else ())
            for f, lv in zip(c.factors, c.levels[c.chosen], strict=True)}


SECTION = Part("main effects", _analyse, figures=_figures)
