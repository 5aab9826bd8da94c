"""Hydra sweeper plugin ``hydra/sweeper=stability`` (logic: ``stability.sweep.sweeper``)."""
