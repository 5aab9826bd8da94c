"""Hydra sweeper plugin ``hydra/sweeper=stability`` (the logic lives in ``stability.sweeper``)."""
