"""Train one configuration, or (with -m) the default study.

    python experiments/sweep.py precision=fp16 clip.enabled=true train.accum_steps=4
    python experiments/sweep.py -m
    python experiments/sweep.py -m -v                                 # per-epoch lines too
    torchrun --nproc_per_node=2 experiments/sweep.py train.epochs=2   # DDP, docs/distributed.md
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from stability.sweep.job import hydra_job, verbose_argv


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the best validation loss for sweepers."""
    return hydra_job(cfg)


if __name__ == "__main__":
    sys.argv = verbose_argv(sys.argv)  # -v: the runs' per-epoch lines on the terminal too
    main()
