"""Train one configuration, or (with -m) the default study: a shim of ``stability sweep``.

    python experiments/sweep.py precision=fp16 clip.enabled=true train.accum_steps=4
    python experiments/sweep.py -m
    python experiments/sweep.py -m -v                                 # per-epoch lines too
    torchrun --nproc_per_node=2 experiments/sweep.py train.epochs=2   # DDP, docs/distributed.md

Hydra names the job after this file (``<job folder>/sweep.log``) and finds ``../conf`` from
it, so the decorated function stays here; everything else is ``stability.cli``.
"""

import hydra
from omegaconf import DictConfig

from stability import cli


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    return cli.sweep_job(cfg)


if __name__ == "__main__":
    cli.run_script(main)
