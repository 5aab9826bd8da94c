"""Write the review report of a sweep (the latest one by default): a shim of ``stability report``.

    python experiments/report.py
    python experiments/report.py sweep_id=<id> experiment=<name> tracking.uri=http://host:5000

Exit codes (``stability.cli.report_job``): 0 report written; 2 a user mistake (bad key or
value, unknown experiment or sweep, an experiment with no sweep, tracking server unreachable);
3 the sweep exists but no training run finished: nothing to recommend, nothing written.
"""

import sys

import hydra
from omegaconf import DictConfig

from stability import cli


@hydra.main(version_base="1.3", config_path="../conf", config_name="report")
def main(cfg: DictConfig) -> None:
    cli.report_job(cfg)


if __name__ == "__main__":
    cli.check_groups(sys.argv[1:], "report")
    main()
