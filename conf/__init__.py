"""Hydra configs; installed as the package ``stability.conf`` (``pkg://stability.conf``)."""
