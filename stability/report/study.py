"""The frozen ``Study``: one sweep as every report section reads it, assembled once.

``build_report`` fills it in order: fetch (the runs, the config table, the step tables), select
on validation (the factor analysis, the decision, the comparisons), then the sealed test of the
winner. A section reads it and never changes it; whatever a section needs from MLflow beyond it
(a figure's downloads) goes through ``client`` into ``cache``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from stability.report.table import ConfigRow, ConfigTable

if TYPE_CHECKING:
    from stability.report.advice import Recommendation
    from stability.report.compare import Comparison
    from stability.report.decision import Sequential
    from stability.report.evaluate import WinnerTestResult
    from stability.report.factors import FactorAnalysis
    from stability.report.fetch import Sweep
    from stability.report.lr import LrCurve
    from stability.report.options import ReportConfig
    from stability.report.sections.spending import Spending
    from stability.report.winner import Decision


@dataclass(frozen=True, eq=False)
class Study:
    """Everything the report's sections are written from.

    Attributes:
        sweep: the sweep's ids and experiment.
        tracking_uri: where it was read, credentials redacted.
        options: the report's settings (``conf/report.yaml``).
        client: the MLflow client, for a figure's own downloads.
        cache: a scratch folder for those downloads (deleted with the report's temp folder).
        runs: one row per training run (``fetch.fetch_runs``); read as data, never as code.
        configs: one typed row per config (``table.ConfigRow``), the winner first, with its
            paired comparison against the winner and its stability verdict.
        steps: each judged run's ``steps.csv`` by run id.
        loss_name: the task's loss, on every loss axis and table head.
        margin: the equivalence margin in loss units.
        analysis: the factor effects from every run.
        decision: the factor-by-factor choice of the winner.
        comparisons: the winner against its named alternatives, paired by seed.
        advice: the recommended clipping thresholds.
        lr_curves: one per setting when the learning rate was swept.
        lr_sentences: how each other factor moves the stable LR range.
        spending: an adaptive sweep's rounds; None for a fixed grid.
        sequential: an adaptive sweep's verdicts; None for a fixed grid.
        test: the sealed test of the winner's seeds (opened once, after selection).
        model_version: the registered winner's version; "" when not registered.
        model_uri: ``models:/<name>@champion``; "" when not registered.
    """

    sweep: Sweep
    tracking_uri: str
    options: ReportConfig
    client: Any
    cache: Path
    runs: pd.DataFrame
    configs: ConfigTable
    steps: Mapping[str, pd.DataFrame]
    loss_name: str
    margin: float
    analysis: FactorAnalysis | None
    decision: Decision | None
    comparisons: tuple[Comparison, ...]
    advice: tuple[Recommendation, ...]
    lr_curves: tuple[LrCurve, ...]
    lr_sentences: tuple[str, ...]
    spending: Spending | None
    sequential: Sequential | None
    test: WinnerTestResult
    model_version: str = ""
    model_uri: str = ""

    @property
    def winner(self) -> ConfigRow:
        """The winner's row of ``configs``."""
        return self.configs.winner
