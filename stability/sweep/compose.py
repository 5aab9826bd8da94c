"""Composing a sweep's job configs fast: once per set of config-group choices, then copies.

Hydra composes every job of a multirun from scratch (``load_sweep_config``: search path,
defaults list, merges), ~0.1-0.25 s a job on these cores; the default study has 240 jobs on
2 cores, so that alone is 4% of its ideal wall time. A job's overrides are mostly values
(``seed=3``, ``clip.max_norm=5``), and applying values to an already composed config is what
Hydra itself does after composition. So the defaults list is composed once per distinct tuple
of config-group choices (``precision=fp16``, ``+study=adding``) and each job gets a copy with
its value overrides applied, plus the two fields Hydra derives from the overrides
(``hydra.overrides.task``, ``hydra.job.override_dirname``). ``tests/sweep/test_schedule.py`` checks
the result equals Hydra's own composition, hydra node included.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict

from stability.compat.hydra import ConfigLoaderImpl, get_overrides_dirname


class CachedComposer:
    """Job configs of one sweep, composed once per set of config-group choices.

    Args:
        hydra_context: the sweep's Hydra context (its config loader and repository).
        master: the multirun's own config (``hydra.overrides.hydra`` and the job name).
    """

    def __init__(self, hydra_context: HydraContext, master: DictConfig) -> None:
        self.loader = hydra_context.config_loader
        self.master = master
        self.parser = OverridesParser.create()
        self._bases: dict[tuple[str, ...], DictConfig] = {}
        self._apps: dict[tuple[str, ...], DictConfig] = {}
        # A big grid repeats each override string in thousands of points, and Hydra's parser
        # takes ~1 ms a string (a third of planning a 2,400-run grid): parse and check once.
        self._parsed: dict[str, Override] = {}
        self._groups: dict[str, bool] = {}

    def is_group(self, o: Override) -> bool:
        """Hydra's rule (``hydra._internal.defaults_list``): a non-dict override of an
        existing config group selects a config file; anything else sets a value."""
        if o.input_line not in self._groups:
            repo = self.loader.repository  # type: ignore[attr-defined]
            self._groups[o.input_line] = (not isinstance(o.value(), dict)
                                          and repo.group_exists(o.key_or_group))
        return self._groups[o.input_line]

    def _parse(self, override: str) -> Override:
        if override not in self._parsed:
            self._parsed[override] = self.parser.parse_overrides([override])[0]
        return self._parsed[override]

    def split(self, overrides: Sequence[str]) -> tuple[list[Override], tuple[str, ...],
                                                        list[Override]]:
        """``(all parsed, group-choice lines, value overrides)`` of one job."""
        parsed = [self._parse(o) for o in overrides]
        groups = tuple(o.input_line for o in parsed if self.is_group(o))
        values = [o for o in parsed if o.input_line not in groups]
        return parsed, groups, values

    def _base(self, groups: tuple[str, ...]) -> DictConfig:
        if groups not in self._bases:
            self._bases[groups] = self.loader.load_sweep_config(self.master, list(groups))
        return self._bases[groups]

    def job_config(self, overrides: Sequence[str]) -> DictConfig:
        """What ``load_sweep_config(master, overrides)`` returns, hydra node included."""
        parsed, groups, values = self.split(overrides)
        if any(o.is_hydra_override() or o.is_delete() for o in values):
            # rare on a job's command line; Hydra's own path handles every case
            return self.loader.load_sweep_config(self.master, list(overrides))
        base = self._base(groups)
        cfg = copy.deepcopy(base)
        OmegaConf.copy_cache(from_config=self.master, to_config=cfg)
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        job = cfg.hydra.job.config.override_dirname
        with open_dict(cfg.hydra):
            cfg.hydra.overrides.task = [o.input_line for o in parsed]
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=parsed, kv_sep=job.kv_sep, item_sep=job.item_sep,
                exclude_keys=job.exclude_keys)
        return cfg

    def app_config(self, overrides: Sequence[str]) -> DictConfig:
        """The job's own config (no hydra node) as the sweeper sees it before launch.

        ``output_dir`` is ``"."``: the job's folder exists only once the job runs.
        """
        _, groups, values = self.split(overrides)
        if groups not in self._apps:
            app = copy.deepcopy(self._base(groups))
            with open_dict(app):
                del app["hydra"]
                app.output_dir = "."
            self._apps[groups] = app
        cfg = copy.deepcopy(self._apps[groups])
        ConfigLoaderImpl._apply_overrides_to_config(
            [o for o in values if not o.is_hydra_override()], cfg)
        return cfg
