"""Registers ``hydra/sweeper=stability``; Hydra only instantiates plugins from ``hydra_plugins``.

Hydra imports every module here at start-up to discover plugins, so this file stays light:
MLflow is imported only once a sweep runs. No ``from __future__ import annotations`` here:
Hydra executes this module without registering it in ``sys.modules``, and dataclasses then
cannot resolve string annotations.
"""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from stability.sweep import sweeper


@dataclass
class StabilitySweeperConf:
    """Structured config of the sweeper; conf/hydra/sweeper/study.yaml fills it in."""

    _target_: str = "hydra_plugins.stability_sweeper.stability_sweeper.StabilitySweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None
    resume: bool = True
    dry_run: bool = False
    progress: str = "auto"
    progress_every_s: float = 60.0
    verbose: bool = False


ConfigStore.instance().store(group="hydra/sweeper", name="stability", node=StabilitySweeperConf,
                             provider="stability")


class StabilitySweeper(sweeper.StabilitySweeper):
    """The plugin class Hydra instantiates; see ``stability.sweep.sweeper.StabilitySweeper``."""
