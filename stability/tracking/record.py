"""What a tracked run is: ``RunRecord`` (params, tags, folder, name, where it goes).

Any training loop can fill one; ``run_record`` is the adapter for our ``RunConfig``, and
``contract.Rebuild`` lists what the report needs of it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stability.core import checkpoint
from stability.core.config import RunConfig, TrackingConfig
from stability.core.identity import fingerprint, flatten
from stability.core.task import loss_name, trainer_name
from stability.tracking.contract import TRAINER_PARAM, WORLD_SIZE_PARAM, Kind, Outcome, Tag
from stability.tracking.journal import now_ms
from stability.tracking.uri import git_commit, run_name

# Settings only our loop uses: a trainer run's own optimizer, schedule, loaders and precision
# plugin are logged once it has built them (integrations: ``ParamSink``), never our defaults.
# A trainer's backend passes them down as its ``unused`` (``integrations.study.Trainer``).
LOOP_ONLY = ("optim.", "schedule.", "train.batch_size", "train.weight_decay",
             "train.num_workers", "telemetry.update_ratio")


def run_params(cfg: RunConfig, world_size: int = 1,
               unused: Sequence[str] = ()) -> dict[str, str]:
    """The run's params: the flattened config, ``trainer`` (and ``world_size`` above 1).

    ``tracking.*`` is left out: where the run went is not part of what was trained (its
    fingerprint ignores it too), and a URI may carry credentials. So are the keys starting with
    one of ``unused``: the settings the run's backend did not use (its ``unused_params``).
    ``trainer`` is the backend's name (``ours`` for our loop).
    """
    skip = tuple(unused)
    params = {k: str(v) for k, v in flatten(cfg).items()
              if k != "output_dir" and not k.startswith("tracking.")
              and not (skip and k.startswith(skip))}
    params[TRAINER_PARAM] = trainer_name(cfg.task)
    if world_size > 1:
        params[WORLD_SIZE_PARAM] = str(world_size)
    return params


def config_tags(cfg: RunConfig, overrides: Sequence[str] = (),
                world_size: int = 1) -> dict[str, str]:
    """What a ``RunConfig`` says about its run as tags (``live_tags`` are added on opening).

    Args:
        cfg: the run's config.
        overrides: its Hydra overrides, without ``tracking.*`` (URIs may carry credentials).
        world_size: data-parallel ranks.
    """
    t = cfg.tracking
    tags = {
        Tag.KIND: Kind.TRAIN, Tag.SWEEP_ID: t.sweep_id or "",
        Tag.FINGERPRINT: fingerprint(cfg, world_size),
        Tag.SEED: str(cfg.seed), Tag.OVERRIDES: " ".join(overrides),
        Tag.GIT_COMMIT: git_commit(), Tag.LOSS_NAME: loss_name(cfg.task),
    }
    if t.parent_run_id:
        tags[Tag.PARENT_RUN_ID] = t.parent_run_id
    return {k: str(v) for k, v in tags.items()}


def live_tags(folder: Path) -> dict[str, str]:
    """The tags of a run being trained now, by this process, in ``folder``: outcome ``running``."""
    return {Tag.OUTCOME: str(Outcome.RUNNING), Tag.PROCESS: process_tag(),
            Tag.OUTPUT_DIR: str(folder.resolve()), Tag.HEARTBEAT: str(now_ms())}


def run_tags(cfg: RunConfig, overrides: Sequence[str], world_size: int,
             folder: Path) -> dict[str, str]:
    """The tags a training run is created with (docs/TRACKING.md), its outcome ``running``."""
    return config_tags(cfg, overrides, world_size) | live_tags(folder)


@dataclass(frozen=True)
class RunRecord:
    """What a tracked run is, whichever loop trains it.

    Attributes:
        params: MLflow params (logged once, at creation).
        tags: its tags (``contract.Tag`` names; ``contract.Rebuild.TAGS`` for the report).
            ``live_tags`` (outcome ``running``, process, folder, heartbeat) are added.
        folder: the run folder: journal, pending marker, artifacts to upload.
        name: the MLflow run name.
        tracking: where the run goes and how outages are ridden out (``uri``,
            ``experiment``, ``retry_s``, ``heartbeat_s``, ``request_timeout_s``).
        resume: where a resumed run continues (its MLflow run is the one the folder's journal
            names); None for a fresh run.
    """

    params: Mapping[str, str]
    tags: Mapping[str, str]
    folder: Path
    name: str
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    resume: checkpoint.Resume | None = None


def run_record(cfg: RunConfig, overrides: Sequence[str] = (), world_size: int = 1,
               unused: Sequence[str] = ()) -> RunRecord:
    """The adapter for our ``RunConfig``: params, tags, folder, name and resume point.

    Args:
        cfg: the run's config.
        overrides: its Hydra overrides; ``tracking.*`` ones are left out (credentials).
        world_size: data-parallel ranks.
        unused: the settings its backend does not use (``run_params``).
    """
    folder = Path(cfg.output_dir)
    overrides = [o for o in overrides if not o.startswith("tracking.")]
    return RunRecord(params=run_params(cfg, world_size, unused),
                     tags=config_tags(cfg, overrides, world_size), folder=folder,
                     name=run_name(cfg), tracking=cfg.tracking,
                     resume=checkpoint.peek(folder, cfg))


def process_tag() -> str:
    """``<host>:<pid>``: lets a sweep on this host tell a dead run from a live one."""
    return f"{socket.gethostname()}:{os.getpid()}"
