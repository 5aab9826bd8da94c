"""The strategies a sweep can name: ``hydra.sweeper.strategy=grid | adaptive | module.Class``.

Apart from ``strategy`` (the seam and the grid) so that the strategies built on the seam, such
as ``adaptive``, can import it without a cycle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from stability.core.config import ConfigError
from stability.sweep.strategy import GridStrategy, Strategy


def load_strategy(target: str | type | None) -> Callable[..., Strategy]:
    """The strategy class named by ``hydra.sweeper.strategy`` (None: ``GridStrategy``).

    Raises:
        ConfigError: the name does not import, or is not a class (names the key).
    """
    if target is None or target in ("grid", GridStrategy):
        return GridStrategy
    if target == "adaptive":
        # Imported when named: it brings scipy, which a single run's worker never loads
        # (tests/test_imports.py; Hydra imports the sweeper plugin in every process).
        from stability.sweep.adaptive import AdaptiveStrategy

        return AdaptiveStrategy
    if isinstance(target, type):
        return target
    module, _, name = str(target).rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        found = None
    if not isinstance(found, type):
        raise ConfigError(f"hydra.sweeper.strategy={target} is invalid: allowed values are "
                          "grid, adaptive or an importable class module.Class (called as "
                          "Class(points, make))")
    return found
