"""The review report: select a sweep's winner on validation, test it once, say how sure.

``build_report(ReportConfig)`` is the library entry; ``experiments/report.py`` is the edge.
"""

from stability.report.options import ReportConfig, ReportError, to_report_config
from stability.report.pipeline import ReportOutcome, build_report

__all__ = ["ReportConfig", "ReportError", "ReportOutcome", "build_report", "to_report_config"]
