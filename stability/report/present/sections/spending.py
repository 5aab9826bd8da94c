"""The "How the study spent its runs" section and its seeds figure: an adaptive study's replay.

The replay itself (rounds, looks, costs) is the report's ``spending`` stage
(``stability.report.decide.spending``); this module only shows the ``Spending`` it made.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from stability.report.decide.spending import Spending
from stability.report.format import fixed_signed, save, table
from stability.report.present.plots import Figure, plt  # plt: with the Agg backend chosen
from stability.report.present.sections.section import Part, drawn, lines


def figure(sp: Spending, folder: Path) -> Figure | None:
    """Seeds per config, stacked by the round that added them."""
    if sp.seeds.empty:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 0.22 * len(sp.seeds) + 2), 4.2))
    bottom = np.zeros(len(sp.seeds))
    for r in sp.seeds.columns:
        ax.bar(range(len(sp.seeds)), sp.seeds[r], bottom=bottom, label=f"round {r}")
        bottom += sp.seeds[r].to_numpy()
    ax.axhline(sp.plan.max_seeds, color="grey", linestyle="--", linewidth=1,
               label=f"fixed grid ({sp.plan.max_seeds} seeds)")
    ax.set_xticks(range(len(sp.seeds)), sp.seeds.index, rotation=90, fontsize=6)
    ax.set(ylabel="seeds", title="Seeds per config, by the round that added them")
    ax.legend(fontsize=7)
    save(fig, folder, "adaptive_seeds.png", dpi=110)
    return Figure("adaptive_seeds.png", "Seeds per config over rounds",
                  "Each bar is a config; its segments are the seeds each round added. A config "
                  "stops getting seeds when every contrast it is read by is decided or given up, "
                  "or its level was decided to hurt.")


def section(sp: Spending) -> list[str]:
    """The report's "How the study spent its runs" lines (markdown)."""
    p = sp.plan
    lines = [f"An adaptive study (`hydra.sweeper.strategy=adaptive`): every config got {p.n0} "
             f"seeds, then {p.step} more per round only where a contrast it is read by was "
             f"still undecided, up to {p.max_seeds}; looks at {', '.join(map(str, p.looks))} "
             f"seeds, α = {p.alpha} spent over them (Holm over the contrasts at each look), "
             f"equivalence margin ±{sp.margin:.4g} fixed at the first look (docs/sweeps.md, "
             "\"Adaptive studies\"). Replayed here from the sweep's runs.", "",
             table(["round", "seeds per needed config", "configs run", "runs", "CPU-s",
                    "decided at its look"],
                   [[str(r.round), str(r.seeds), str(r.configs), str(r.runs), f"{r.cpu_s:.0f}",
                     "; ".join(f"{d.contrast} **{d.verdict}**" for d in r.decided) or (
                         "nothing" if r.looked else "no look (a needed config lacks seeds)")]
                    for r in sp.rounds]),
             "",
             table(["contrast", "verdict", "decided at look", "seeds", "effect",
                    "95% CI (plain t)", "given up at look"],
                   [[d.contrast, d.verdict, str(d.look or "—"), str(d.seeds),
                     fixed_signed(d.mean), f"[{fixed_signed(d.low)}, {fixed_signed(d.high)}]",
                     str(d.futile_at or "—")] for d in sp.decisions])]
    share = sp.cpu_s / sp.fixed_cpu_s if sp.fixed_cpu_s > 0 else math.nan
    lines += ["", f"Spent {sp.runs} runs and {sp.cpu_s:.0f} training CPU-seconds (the runs' "
              f"`wall_time_s`, one core each); the fixed grid with {p.max_seeds} seeds per "
              f"config would have taken {sp.fixed_runs} runs and about {sp.fixed_cpu_s:.0f} "
              f"CPU-seconds (each config's mean run × {p.max_seeds}): {sp.runs / sp.fixed_runs:.0%}"
              f" of the runs, {share:.0%} of the CPU-seconds.",
              "The interval is the plain 95% t interval at the deciding look (the last for an "
              "undecided contrast); the decisions themselves use the look's share of α with "
              "Holm, so an interval may exclude 0 without a decision.",
              "**The verdicts that hold α for this sweep are the ones in this section**, and "
              "they are the ones the \"Factor effects\" table and the answer give; their "
              "p-values and intervals there come from re-testing the final runs as if the "
              "seeds had been fixed in advance: descriptive, not tests."]
    if sp.outside:
        lines.append(f"{sp.outside} run(s) of the sweep lie outside the plan's seeds and were "
                     "not read.")
    return lines + [""]


SECTION = Part("how the study spent its runs", lambda st: st.evidence.spending,
               markdown=lambda sp: lines("## How the study spent its runs", "", section(sp)))
# Its figure comes last among the figures, after the per-layer norms: a second registry entry.
FIGURE = Part("adaptive seeds", lambda st: st.evidence.spending,
              figures=lambda sp, folder: drawn(figure(sp, folder)))
