"""The "All configs, ranked" section: each config's aggregates and its paired comparison.

The rows are in the order of the validation mean (the ``rank`` column, 1 = lowest mean); the
decision's choice is marked in its row (``→ chosen``) wherever its mean ranks it, so no row
reads as "rank 11 on top of ranks 1–10".
"""

from __future__ import annotations

import math

from stability.report.decide.table import ConfigRow, ConfigTable
from stability.report.format import ACC_DIGITS, ci, fmt, pm, pval, signed, size, table
from stability.report.present.sections.section import Part, lines
from stability.report.present.study import Study

CHOSEN = "**→ chosen**"


def _wall(c: ConfigRow) -> str:
    median, top = c.wall_time_s_median, c.wall_time_s_max
    return "—" if math.isnan(median) else f"{median:.1f} ({top:.1f})"


def _percent(share: float) -> str:
    """A share of steps as a percentage, the one format of every clip rate on the page."""
    return "—" if math.isnan(share) else f"{share:.0%}"


def _seeds(c: ConfigRow) -> str:
    """``3/3``, with the unfinished seeds when there are any (``2/3, 1 unfinished``)."""
    return f"{c.seeds_finished}/{c.seeds}" + (f", {c.unfinished} unfinished"
                                              if c.unfinished else "")


def _table(configs: ConfigTable, loss_name: str, power: float) -> str:
    chosen = configs.winner.fingerprint
    rows = []
    for c in sorted(configs, key=lambda r: r.rank):
        mine = c.fingerprint == chosen
        rows.append([
            str(c.rank), f"{CHOSEN} `{c.label}`" if mine else f"`{c.label}`", c.stability,
            _seeds(c), pm(c.loss_mean, c.loss_std), ci(c.loss_ci_low, c.loss_ci_high),
            pm(c.acc_mean, c.acc_std, ACC_DIGITS), _percent(c.clip_fraction_mean),
            fmt(c.skip_count_mean, 1), fmt(c.underflow_mean, 4), _wall(c),
            "chosen" if mine else signed(c.diff_vs_winner), pval(c.p_adj_vs_winner),
            size(c.mdd_vs_winner), c.flag or "",
        ])
    return table(["rank (validation mean)", "config", "stability", "seeds finished",
                  f"best val loss ({loss_name})", "95% CI", "val acc", "clipped (% of steps)",
                  "skips",
                  "fp16 underflow", "wall s (median, max)", "diff vs chosen",
                  "p vs chosen (selection-adjusted)",
                  f"detectable vs chosen ({power:.0%} power, selection-adjusted)", "flag"], rows)


def markdown(st: Study) -> str:
    """The ranked table and what its columns mean."""
    w = st.findings.configs.winner
    return lines(
        "## All configs, ranked", "",
        f"Ordered by mean best validation loss (`rank`: 1 = lowest, the descriptive order); the "
        f"decision's choice `{w.label}` ranks {w.rank} and is marked {CHOSEN}: it is chosen "
        "factor by factor (see the answer), not by its rank.", "",
        _table(st.findings.configs, st.fetched.loss_name, st.options.power), "",
        "Unfinished seeds (counted in `seeds finished`) are +inf in `best val loss`; `val acc` "
        "is at each seed's best epoch, over finished seeds; `p vs chosen` is the paired t-test, "
        "Bonferroni over the "
        "pairs of configs; `detectable` is the smallest difference the paired seeds detect at "
        "that adjusted level, the same procedure and number as \"How sure\" for the same pair; "
        "`wall s` is the median run time over seeds (a worker's first run also pays its cold "
        "start: imports, first kernels) with the slowest seed in brackets.", "")


SECTION = Part("all configs", lambda st: st, markdown=markdown)
