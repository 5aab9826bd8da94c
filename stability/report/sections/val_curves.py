"""Figure: the validation loss per epoch of every finished seed of each plotted config."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from stability.report import fetch, plots
from stability.report.sections.plotted import plotted
from stability.report.sections.section import Drawn, Part, drawn
from stability.report.study import Study


def figures(st: Study, folder: Path) -> Sequence[Drawn]:
    """Fetch the plotted configs' ``val_loss`` histories (only theirs) and draw them."""
    p = plotted(st)
    runs = st.runs
    finished = runs[runs["fingerprint"].isin([fp for _, fp in p.roles])
                    & (runs["outcome"] == "finished")]
    histories = fetch.metric_histories(st.client, finished["run_id"], "val_loss",
                                       st.options.history_workers)
    seeds_of = finished.groupby("fingerprint")

    def curves(fp: str) -> dict[int, pd.Series]:
        if fp not in seeds_of.groups:
            return {}
        g = seeds_of.get_group(fp)
        return {int(s): histories[r] for s, r in zip(g["seed"], g["run_id"], strict=True)}

    return drawn(plots.val_loss_curves([(p.series[fp], curves(fp)) for _, fp in p.roles],
                                       folder, st.loss_name))


SECTION = Part("validation curves", lambda st: st, figures=figures)
