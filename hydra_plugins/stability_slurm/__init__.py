"""Hydra launcher plugin behind ``hydra/launcher=slurm`` (conf/hydra/launcher/slurm.yaml)."""
