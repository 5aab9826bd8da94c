"""Write the review report of a sweep (the latest one by default) and log it to MLflow.

    python experiments/report.py
    python experiments/report.py sweep_id=<id> experiment=<name> tracking.uri=http://host:5000

Exit codes: 0 report written; 2 a user mistake (bad key or value, unknown experiment or sweep,
an experiment with no sweep, tracking server unreachable); 3 the sweep exists but no training
run finished (every seed diverged or failed): nothing to recommend, nothing written.
"""

from __future__ import annotations

import sys
import time

import hydra
from omegaconf import DictConfig, OmegaConf

from stability.core.config import ConfigError
from stability.report import build_report, to_report_config
from stability.report.pipeline import NothingToReport
from stability.tracking.uri import TrackingError


@hydra.main(version_base="1.3", config_path="../conf", config_name="report")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: convert the config once, build the report, print where it went."""
    t0 = time.perf_counter()
    try:
        out = build_report(to_report_config(OmegaConf.to_container(cfg, resolve=True)))
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


if __name__ == "__main__":
    main()
