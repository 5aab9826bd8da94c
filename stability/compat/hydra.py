"""The Hydra internals the study sweeper builds on: its basic sweeper and its override rules.

Hydra 1.3 has no public base class for a sweeper that expands the grid the way ``-m`` does,
and no public call that applies overrides to a composed config or names a job's override
folder. ``sweep/sweeper.py`` subclasses ``BasicSweeper`` (its grid expansion and batching) and
``sweep/compose.py`` composes each job's config as Hydra would, with
``ConfigLoaderImpl._apply_overrides_to_config`` and ``get_overrides_dirname``
(tests/sweep/test_schedule.py checks the result equals Hydra's own composition).
"""

from __future__ import annotations

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

from stability.compat.gate import VersionGate

GATE = VersionGate(package="hydra-core", low="1.3.2", below="1.4",
                   module="stability/compat/hydra.py",
                   reads="BasicSweeper, ConfigLoaderImpl._apply_overrides_to_config and "
                   "get_overrides_dirname")
BASIC_LAUNCHER_LOGGER = "hydra._internal.core_plugins.basic_launcher"  # its progress lines

__all__ = ["BASIC_LAUNCHER_LOGGER", "GATE", "BasicSweeper", "ConfigLoaderImpl",
           "get_overrides_dirname"]
