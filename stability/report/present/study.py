"""The frozen ``Study``: one sweep as every report section reads it, made of the stages' records.

``build_report`` runs the stages in order (``stability.report.stages``): fetch (``Fetched``),
weigh the validation evidence (``Evidence``), decide (``Decided``), examine the runs' steps
(``Findings``), then the sealed test of the winner (``WinnerTestResult``) and its registration
(``Registered``). The ``Study`` holds those records; its properties are the names the sections
read. A section only presents: it never changes the study and reads nothing from MLflow (the
stages fetched whatever it shows), so the study holds no client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from stability.report.decide.table import ConfigRow, ConfigTable

if TYPE_CHECKING:
    from stability.report.decide.compare import Comparison
    from stability.report.decide.factors import FactorAnalysis
    from stability.report.decide.spending import Sequential, Spending
    from stability.report.decide.steady import Steadied
    from stability.report.decide.winner import Decision
    from stability.report.evidence.fetch import Sweep
    from stability.report.examine.advice import Recommendation
    from stability.report.examine.layer_norms import LayerNorms
    from stability.report.examine.lr import LrCurve
    from stability.report.examine.plotted import Plotted
    from stability.report.examine.val_curves import ValCurves
    from stability.report.options import ReportConfig
    from stability.report.sealed.evaluate import WinnerTestResult
    from stability.report.stages import Decided, Evidence, Fetched, Findings


@dataclass(frozen=True)
class Registered:
    """The winner in the Model Registry.

    Attributes:
        version: the registered version; "" when not registered.
        created: a new version was made (not an existing one reused).
        uri: ``models:/<name>@champion``; "" when not registered.
        notes: why it was not registered, or a signature warning, one line each (Problems).
    """

    version: str = ""
    created: bool = False
    uri: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class Study:
    """Everything the report's sections are written from: the stages' records.

    Attributes:
        options: the report's settings (``conf/report.yaml``).
        tracking_uri: where the sweep was read, credentials redacted.
        fetched: the sweep's runs and configs.
        evidence: the margin, the factor analysis and an adaptive sweep's replay.
        decided: the winner and each config against it.
        findings: the config table, steps, stability, LR curves, advice, plotted runs.
        test: the sealed test of the winner's seeds (opened once, after selection).
        registered: the registered winner, if any.
    """

    options: ReportConfig
    tracking_uri: str
    fetched: Fetched
    evidence: Evidence
    decided: Decided
    findings: Findings
    test: WinnerTestResult
    registered: Registered = Registered()

    @property
    def sweep(self) -> Sweep:
        """The sweep's ids and experiment."""
        return self.fetched.sweep

    @property
    def runs(self) -> pd.DataFrame:
        """One row per training run (``fetch.fetch_runs``); read as data, never as code."""
        return self.fetched.runs

    @property
    def loss_name(self) -> str:
        """The task's loss, on every loss axis and table head."""
        return self.fetched.loss_name

    @property
    def margin(self) -> float:
        """The equivalence margin in loss units."""
        return self.evidence.margin

    @property
    def analysis(self) -> FactorAnalysis | None:
        """The factor effects from every run."""
        return self.evidence.analysis

    @property
    def spending(self) -> Spending | None:
        """An adaptive sweep's rounds; None for a fixed grid."""
        return self.evidence.spending

    @property
    def sequential(self) -> Sequential | None:
        """An adaptive sweep's verdicts; None for a fixed grid."""
        return self.evidence.sequential

    @property
    def decision(self) -> Decision | None:
        """The factor-by-factor choice of the winner."""
        return self.decided.decision

    @property
    def steadied(self) -> Steadied | None:
        """What stability did to a choice that was not stable (None: it was stable)."""
        return self.decided.steadied

    @property
    def comparisons(self) -> tuple[Comparison, ...]:
        """The winner against its named alternatives, paired by seed."""
        return self.decided.comparisons

    @property
    def configs(self) -> ConfigTable:
        """One typed row per config (``table.ConfigRow``), the winner first."""
        return self.findings.configs

    @property
    def steps(self) -> Mapping[str, pd.DataFrame]:
        """Each judged run's ``steps.csv`` by run id."""
        return self.findings.steps

    @property
    def advice(self) -> tuple[Recommendation, ...]:
        """The recommended clipping thresholds."""
        return self.findings.advice

    @property
    def lr_curves(self) -> tuple[LrCurve, ...]:
        """One per setting when the learning rate was swept."""
        return self.findings.lr_curves

    @property
    def lr_sentences(self) -> tuple[str, ...]:
        """How each other factor moves the stable LR range."""
        return self.findings.lr_sentences

    @property
    def plotted(self) -> Plotted:
        """The configs the run-level figures show, and their representative runs."""
        return self.findings.plotted

    @property
    def layer_norms(self) -> LayerNorms | None:
        """The representative runs' per-layer norms; None when no figures are drawn."""
        return self.findings.layer_norms

    @property
    def val_curves(self) -> ValCurves | None:
        """The chosen config's and its rivals' validation curves; None when no figures."""
        return self.findings.val_curves

    @property
    def model_version(self) -> str:
        """The registered winner's version; "" when not registered."""
        return self.registered.version

    @property
    def model_uri(self) -> str:
        """``models:/<name>@champion``; "" when not registered."""
        return self.registered.uri

    @property
    def winner(self) -> ConfigRow:
        """The winner's row of ``configs``."""
        return self.configs.winner
