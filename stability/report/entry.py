"""The report's edge: a composed config in, the report built, one readable outcome out.

``experiments/report.py`` and ``stability report`` both call ``run_report``. Exit codes: 0 report
written; 2 a user mistake (bad key or value, unknown experiment or sweep, an experiment with no
sweep, tracking server unreachable); 3 the sweep exists but no training run finished (every seed
diverged or failed): nothing to recommend, nothing written.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from stability.core.config import ConfigError
from stability.report.options import to_report_config
from stability.report.pipeline import NothingToReport, build_report
from stability.tracking.uri import TrackingError


def run_report(raw: Mapping[str, Any]) -> None:
    """Build the report of ``raw`` (the composed ``conf/report.yaml``) and print where it went.

    Raises:
        SystemExit: 2 on a user mistake, 3 when no run of the sweep finished (one line each).
    """
    t0 = time.perf_counter()
    try:
        out = build_report(to_report_config(raw))
    except NothingToReport as err:  # not a mistake, an answer: one line, its own exit code
        print(f"answer: {err}", file=sys.stderr)
        raise SystemExit(3) from None
    except (ConfigError, TrackingError) as err:  # a user mistake: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    created = "new" if out.model_created else "existing"
    print(f"winner {out.winner_label} ({out.winner}) of sweep {out.sweep_id}\n"
          f"report: {out.folder / 'report.md'}  MLflow report run: {out.report_run_id}"
          + (f"  model version: {out.model_version} ({created})" if out.model_version else ""))
    print(f"report finished in {time.perf_counter() - t0:.1f} s")
