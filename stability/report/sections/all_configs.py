"""The "All configs, ranked" section: each config's aggregates and its paired comparison."""

from __future__ import annotations

import math

from stability.report.format import ci, fmt, pm, pval, signed, size, table
from stability.report.sections.section import Part, lines
from stability.report.study import Study
from stability.report.table import ConfigRow, ConfigTable


def _wall(c: ConfigRow) -> str:
    median, top = c.wall_time_s_median, c.wall_time_s_max
    return "—" if math.isnan(median) else f"{median:.1f} ({top:.1f})"


def _table(configs: ConfigTable, loss_name: str) -> str:
    rows = []
    for c in configs:
        rows.append([
            str(c.rank), f"`{c.label}`", c.stability, f"{c.seeds_finished}/{c.seeds}",
            str(c.unfinished), pm(c.loss_mean, c.loss_std), ci(c.loss_ci_low, c.loss_ci_high),
            pm(c.acc_mean, c.acc_std, 3), fmt(c.clip_fraction_mean, 3),
            fmt(c.skip_count_mean, 1), fmt(c.underflow_mean, 4), _wall(c),
            signed(c.diff_vs_winner), pval(c.p_adj_vs_winner), size(c.mdd_vs_winner),
            c.flag or "",
        ])
    return table(["rank", "config", "stability", "finished", "unfinished",
                  f"best val loss ({loss_name})", "CI",
                  "val acc", "clip frac", "skips", "fp16 underflow", "wall s (median, max)",
                  "diff vs winner", "p vs winner (selection-adjusted)", "detectable vs winner",
                  "flag"], rows)


def markdown(st: Study) -> str:
    """The ranked table and what its columns mean."""
    return lines(
        "## All configs, ranked", "", _table(st.configs, st.loss_name), "",
        "`unfinished` seeds count as +inf in `best val loss`; `val acc` is at each seed's best "
        "epoch, over finished seeds; `p vs winner` is the unadjusted paired t-test; `wall s` is "
        "the median run time over seeds (a worker's first run also pays its cold start: imports, "
        "first kernels) with the slowest seed in brackets.", "")


SECTION = Part("all configs", lambda st: st, markdown=markdown)
