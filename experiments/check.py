"""One-minute probes of the training mechanics: a shim of ``stability check`` (docs/check.md).

    python experiments/check.py
    python experiments/check.py task=adding check.loop=my_module.my_step check.accum_steps=8

Exit codes (``stability.cli.check_job``): 0 every probe passed or warned; 1 a probe failed;
2 bad input (one line).
"""

import sys

import hydra
from omegaconf import DictConfig

from stability import cli


@hydra.main(version_base="1.3", config_path="../conf", config_name="check")
def main(cfg: DictConfig) -> None:
    cli.check_job(cfg)


if __name__ == "__main__":
    # No Hydra job folder or log files: the check writes only its JSON.
    cli.check_groups(sys.argv[1:])
    sys.argv[1:] = cli.check_argv(sys.argv[1:])
    main()
