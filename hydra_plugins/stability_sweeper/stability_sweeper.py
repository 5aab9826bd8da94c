"""Registers ``hydra/sweeper=stability``; Hydra only instantiates plugins from ``hydra_plugins``.

The sweeper is ``stability.sweep.sweeper`` (the library, which raises and logs) seen through
``stability.cli.EdgeSweeper`` (which prints and picks the exit status).

Hydra imports every module here at start-up to discover plugins, so this file stays light:
MLflow is imported only once a sweep runs. No ``from __future__ import annotations`` here:
Hydra executes this module without registering it in ``sys.modules``, and dataclasses then
cannot resolve string annotations.
"""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from stability import cli


@dataclass
class StabilitySweeperConf:
    """Structured config of the sweeper's own keys; conf/hydra/sweeper/study.yaml fills it in.

    A strategy's settings are a block named after it (``hydra.sweeper.<name>``), not a field
    here: ``open_node`` lets a YAML add one, and the sweeper checks every block against the
    strategy registry (``stability.sweep.strategy_registry``).
    """

    _target_: str = "hydra_plugins.stability_sweeper.stability_sweeper.StabilitySweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None
    resume: bool = True
    dry_run: bool = False
    progress: str = "auto"
    progress_every_s: float = 60.0
    verbose: bool = False
    strategy: str | None = None


def open_node(conf: type) -> DictConfig:
    """``conf``'s typed keys in a node that takes further keys (a strategy's settings block)."""
    node = OmegaConf.structured(conf)
    OmegaConf.set_struct(node, False)
    return node


ConfigStore.instance().store(group="hydra/sweeper", name="stability",
                             node=open_node(StabilitySweeperConf), provider="stability")


class StabilitySweeper(cli.EdgeSweeper):
    """The plugin class Hydra instantiates: ``stability.sweep.sweeper.StabilitySweeper`` with the
    CLI's edge (its lines printed, its errors one line and an exit status)."""
