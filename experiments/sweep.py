"""Train one configuration, or (with -m) the default study.

    python experiments/sweep.py precision=fp16 clip.enabled=true train.accum_steps=4
    python experiments/sweep.py -m
    torchrun --nproc_per_node=2 experiments/sweep.py train.epochs=2   # DDP, docs/distributed.md
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from stability.sweep.job import run_job


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the best validation loss for sweepers."""
    hc = HydraConfig.get()
    raw = OmegaConf.to_container(cfg, resolve=True)
    in_sweep = hc.mode == RunMode.MULTIRUN
    return run_job(raw, overrides=list(hc.overrides.task), in_sweep=in_sweep)


if __name__ == "__main__":
    main()
