"""The validation-curves stage: the chosen config against its closest rivals, epoch by epoch.

The chosen config, the baseline, the lowest mean (rank 1) and the (up to) three configs whose
validation mean is nearest the chosen's (``plotted.rivals``): the configs a reviewer weighs it
against, not every config of the grid as overlapping bands. Only their finished runs'
``val_loss`` histories are read; ``sections.val_curves`` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from stability.report.decide import select
from stability.report.decide.table import ConfigTable
from stability.report.evidence import fetch
from stability.report.examine.plotted import Series, rivals

RIVAL_COLORS = ("tab:purple", "tab:olive", "tab:cyan")


def shown(configs: ConfigTable) -> list[tuple[str, Series]]:
    """``(fingerprint, legend entry)`` of the configs the figure draws, chosen first."""
    w = configs.winner
    out = [(w.fingerprint, Series("chosen", w.label, "tab:red"))]
    base = select.baseline(configs.frame())
    if base is not None and base != w.fingerprint:
        out.append((base, Series("baseline", configs.row(base).label, "tab:blue")))
    lowest = configs.lowest  # rank 1 is always drawn: the config a reviewer compares first
    if lowest.fingerprint not in {fp for fp, _ in out}:
        out.append((lowest.fingerprint, Series("lowest mean, rank 1", lowest.label,
                                               "tab:green")))
    for i, fp in enumerate(f for f in rivals(configs) if f not in {fp for fp, _ in out}):
        r = configs.row(fp)
        out.append((fp, Series(f"rival, rank {r.rank}", r.label, RIVAL_COLORS[i % 3])))
    return out


@dataclass(frozen=True)
class ValCurves:
    """Each shown config's ``val_loss`` per epoch, by seed.

    Attributes:
        loss_name: the task's loss, on the figure's axis.
        curves: ``(legend entry, {seed: val_loss by step})`` per shown config, chosen first.
        error: why the histories could not be read (the figure reports it); None when read.
    """

    loss_name: str
    curves: tuple[tuple[Series, dict[int, pd.Series]], ...] = ()
    error: Exception | None = None


def gather(c: Any, configs: ConfigTable, runs: pd.DataFrame, loss_name: str,
           workers: int) -> ValCurves:
    """Fetch the shown configs' ``val_loss`` histories (only theirs, finished runs only)."""
    which = shown(configs)
    finished = runs[runs["fingerprint"].isin([fp for fp, _ in which])
                    & (runs["outcome"] == "finished")]
    try:
        histories = fetch.metric_histories(c, finished["run_id"], "val_loss", workers)
    except Exception as err:  # one figure's data: the report stands without it
        return ValCurves(loss_name, error=err)
    seeds_of = finished.groupby("fingerprint")

    def curves(fp: str) -> dict[int, pd.Series]:
        if fp not in seeds_of.groups:
            return {}
        g = seeds_of.get_group(fp)
        return {int(s): histories[r] for s, r in zip(g["seed"], g["run_id"], strict=True)}

    return ValCurves(loss_name, curves=tuple((s, curves(fp)) for fp, s in which))
