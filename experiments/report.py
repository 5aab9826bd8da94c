"""Write the review report of a sweep (the latest one by default) and log it to MLflow.

    python experiments/report.py
    python experiments/report.py sweep_id=<id> experiment=<name> tracking.uri=http://host:5000

Exit codes: 0 report written; 2 a user mistake (bad key or value, unknown experiment or sweep,
an experiment with no sweep, tracking server unreachable); 3 the sweep exists but no training
run finished (every seed diverged or failed): nothing to recommend, nothing written.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from stability.report.entry import run_report


@hydra.main(version_base="1.3", config_path="../conf", config_name="report")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: convert the config once (``stability.report.entry``)."""
    run_report(OmegaConf.to_container(cfg, resolve=True))


if __name__ == "__main__":
    main()
