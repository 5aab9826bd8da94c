"""Figure: the validation loss per epoch of the chosen config against its closest rivals.

The chosen config, the baseline and the (up to) three configs whose validation mean is nearest
the chosen's (``plotted.rivals``): the configs a reviewer weighs it against, not every config
of the grid as overlapping bands.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from stability.report import fetch, plots, select
from stability.report.plots import Series
from stability.report.plotted import rivals
from stability.report.sections.section import Drawn, Part, drawn
from stability.report.study import Study

RIVAL_COLORS = ("tab:purple", "tab:olive", "tab:cyan")


def shown(st: Study) -> list[tuple[str, Series]]:
    """``(fingerprint, legend entry)`` of the configs the figure draws, chosen first."""
    configs = st.configs
    w = configs.winner
    out = [(w.fingerprint, Series("chosen", w.label, "tab:red"))]
    base = select.baseline(configs.frame())
    if base is not None and base != w.fingerprint:
        out.append((base, Series("baseline", configs.row(base).label, "tab:blue")))
    for i, fp in enumerate(f for f in rivals(configs) if f not in {fp for fp, _ in out}):
        r = configs.row(fp)
        out.append((fp, Series(f"rival, rank {r.rank}", r.label, RIVAL_COLORS[i % 3])))
    return out


def figures(st: Study, folder: Path) -> Sequence[Drawn]:
    """Fetch the shown configs' ``val_loss`` histories (only theirs) and draw them."""
    which = shown(st)
    runs = st.runs
    finished = runs[runs["fingerprint"].isin([fp for fp, _ in which])
                    & (runs["outcome"] == "finished")]
    histories = fetch.metric_histories(st.client, finished["run_id"], "val_loss",
                                       st.options.history_workers)
    seeds_of = finished.groupby("fingerprint")

    def curves(fp: str) -> dict[int, pd.Series]:
        if fp not in seeds_of.groups:
            return {}
        g = seeds_of.get_group(fp)
        return {int(s): histories[r] for s, r in zip(g["seed"], g["run_id"], strict=True)}

    return drawn(plots.val_loss_curves([(s, curves(fp)) for fp, s in which], folder,
                                       st.loss_name))


SECTION = Part("validation curves", lambda st: st, figures=figures)
