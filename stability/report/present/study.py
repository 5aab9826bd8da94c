"""The frozen ``Study``: one sweep as every report section reads it, made of the stages' records.

``build_report`` runs the stages in order (``stability.report.stages``): fetch (``Fetched``),
weigh the validation evidence (``Evidence``), decide (``Decided``), examine the runs' steps
(``Findings``), then the sealed test of the winner (``WinnerTestResult``) and its registration
(``Registered``). The ``Study`` holds those records and nothing else: a section reads each
record's own field (``st.evidence.margin``, ``st.findings.configs``). A section only presents:
it never changes the study and reads nothing from MLflow (the stages fetched whatever it shows),
so the study holds no client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
