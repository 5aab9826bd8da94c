"""``hydra/launcher=local``'s class: Hydra instantiates plugins only from ``hydra_plugins``.

A thin subclass of ``stability.sweep.pool.PoolLauncher``, where the behaviour lives. No
``from __future__ import annotations`` here: Hydra executes plugin modules at start-up
without registering them in ``sys.modules``.
"""

from stability.sweep import pool


class PoolLauncher(pool.PoolLauncher):
    """The plugin class Hydra instantiates; see ``stability.sweep.pool.PoolLauncher``."""
