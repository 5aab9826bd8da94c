"""The strategies a sweep can name: ``hydra.sweeper.strategy=<name>`` looks its class up here.

``STRATEGIES`` maps a name to a strategy class (``strategy_base.Strategy``) or to the import
path of one, imported only when a sweep names it: ``adaptive`` and ``decide`` bring scipy,
which a single run's worker never loads (tests/test_imports.py; Hydra imports the sweeper
plugin in every process). A strategy of your own is one ``register("name", MyStrategy)`` in a
module the sweep imports; ``hydra.sweeper.strategy=module.Class`` (a class by its import path)
works too.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

from stability.core.config import ConfigError
from stability.sweep.strategy_base import MEMBERS, GridStrategy, Strategy

KEY = "hydra.sweeper.strategy"
DEFAULT = "grid"  # the strategy of a sweep that names none

STRATEGIES: dict[str, type | str] = {
    DEFAULT: GridStrategy,
    "adaptive": "stability.sweep.adaptive.AdaptiveStrategy",
    "decide": "stability.sweep.decide.DecideStrategy",
}


def register(name: str, strategy: type | str, *, replace: bool = False) -> None:
    """Make ``strategy`` (a class, or its import path) the one ``hydra.sweeper.strategy=name``
    runs; its settings are ``hydra.sweeper.<name>.*``.

    Raises:
        ValueError: ``name`` is not a plain identifier, or is taken (unless ``replace``).
    """
    if not name.isidentifier():
        raise ValueError(f"strategy name {name!r}: allowed names are identifiers "
                         "(they become the key hydra.sweeper.<name>)")
    if name in STRATEGIES and not replace:
        raise ValueError(f"strategy name {name!r} is taken by {STRATEGIES[name]!r}")
    STRATEGIES[name] = strategy


def names() -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(STRATEGIES)


def load_strategy(target: str | type | None) -> type[Strategy]:
    """The strategy class ``hydra.sweeper.strategy`` names (None: the default, the grid).

    Raises:
        ConfigError: the name is not registered and does not import as ``module.Class``, or
            the class lacks what the sweeper uses of a strategy (names the key).
    """
    found = _resolve(DEFAULT if target is None else target)
    if not isinstance(found, type):
        raise ConfigError(f"{KEY}={target} is invalid: allowed values are "
                          f"{', '.join(names())} or an importable class module.Class (called "
                          "as Class(points, make, settings))")
    missing = [m for m in MEMBERS if not hasattr(found, m)]
    settings_type = getattr(found, "settings_type", None)
    if not missing and not (inspect.isclass(settings_type)
                            and dataclasses.is_dataclass(settings_type)):
        missing = ["settings_type (a dataclass)"]
    if missing:
        raise ConfigError(f"{KEY}={target} is invalid: {found.__qualname__} lacks "
                          f"{', '.join(missing)} (allowed values: a strategy defining "
                          f"{', '.join(MEMBERS)}; docs/sweeps.md)")
    return found


def _resolve(target: str | type) -> object:
    if isinstance(target, type):
        return target
    entry = STRATEGIES.get(target, target)
    if isinstance(entry, type):
        return entry
    module, _, name = str(entry).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        return None
