"""The plotted stage: which configs the run-level figures plot, in which role and colour.

The chosen config (the decision's), the baseline and the best config of each precision (a
config in two roles is plotted once, both roles named), plus for fp16 the best config and the
one that skipped most; ``rivals`` are the configs whose validation mean is nearest the chosen's.
Each is drawn from one representative seed (``select.representative_seed``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from stability.core.precision import Precision
from stability.report.decide import select
from stability.report.decide.table import ConfigTable

ROLE_COLORS = ("tab:red", "tab:blue", "tab:purple", "tab:olive", "tab:cyan")


@dataclass(frozen=True)
class Series:
    """One plotted config: its role in the report, label and colour."""

    role: str  # "chosen", "baseline", "lowest-mean fp16"...
    label: str
    color: str
    max_norm: float = math.nan  # NaN when clipping is off


def roles(configs: pd.DataFrame) -> list[tuple[str, str]]:
    """``(role, fingerprint)`` of the plotted configs: chosen, baseline, best of each precision."""
    wanted = [("chosen", configs.iloc[0]["fingerprint"]), ("baseline", select.baseline(configs))]
    wanted += [(f"lowest-mean {p}", best) for p, best in select.best_of_each_precision(configs)]
    named: dict[str, str] = {}
    for role, fp in wanted:
        if fp is not None:
            named[fp] = f"{named[fp]} = {role}" if fp in named else role
    return [(role, fp) for fp, role in named.items()]


def rivals(configs: ConfigTable, n: int = 3) -> list[str]:
    """The ``n`` finished configs whose mean best validation loss is nearest the chosen's."""
    w = configs.winner
    near = [r for r in configs.others if math.isfinite(r.loss_mean)]
    near.sort(key=lambda r: (abs(r.loss_mean - w.loss_mean), r.rank))
    return [r.fingerprint for r in near[:n]]


def _series(configs: ConfigTable, role: str, fp: str, color: str) -> Series:
    row = configs.row(fp)
    return Series(role, row.label, color, float(row.max_norm))


@dataclass(frozen=True)
class Plotted:
    """The plotted configs of a study.

    Attributes:
        roles: ``(role, fingerprint)`` in the figures' order.
        series: each plotted config's legend entry, by fingerprint (roles, then fp16 extras).
        rep: each plotted config's representative run row (None: no finished seed).
        scaler: the fp16 configs the GradScaler figure shows.
    """

    roles: list[tuple[str, str]]
    series: dict[str, Series]
    rep: dict[str, pd.Series | None]
    scaler: list[str]

    @property
    def rep_ids(self) -> dict[str, str]:
        """The representative run id of each plotted config that has one."""
        return {fp: r["run_id"] for fp, r in self.rep.items() if r is not None}


def plotted(configs: ConfigTable, runs: pd.DataFrame) -> Plotted:
    """The study's plotted configs and their representative runs (``Study.plotted``)."""
    found = roles(configs.frame())
    series = {fp: _series(configs, role, fp, ROLE_COLORS[i % len(ROLE_COLORS)])
              for i, (role, fp) in enumerate(found)}
    rep = {fp: select.representative_seed(runs, fp) for fp in series}
    fp16 = [r for r in configs if r.precision == Precision.FP16]
    scaler: list[str] = []
    if fp16:  # the best fp16 config, and the one that skipped most if it skipped at all
        # the last of the most skips, a config without the count (NaN) sorting after all
        most = sorted(fp16, key=lambda r: (math.isnan(r.skip_count_mean),
                                           0.0 if math.isnan(r.skip_count_mean)
                                           else r.skip_count_mean))[-1]
        scaler = list(dict.fromkeys([fp16[0].fingerprint]
                                    + ([most.fingerprint] if most.skip_count_mean > 0 else [])))
    for fp in scaler:
        rep.setdefault(fp, select.representative_seed(runs, fp))
        series.setdefault(fp, _series(configs, "most skips fp16", fp, "tab:orange"))
    return Plotted(found, series, rep, scaler)
