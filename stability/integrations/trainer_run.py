"""The ``RunRecord`` of a run a foreign trainer trains: what the report needs to read it.

Our loop's runs are described by a ``RunConfig`` (``tracking.record.run_record``); a Lightning or
HF run is described by its identity (``RunIdentity``: what it trains, by which trainer, at which
settings and seed, in which study). ``trainer_record`` turns that into the params and the
``contract.Rebuild`` tags (kind, sweep, fingerprint, seed, loss name), so the run is tracked by
``TrackedRun`` like any other and the report groups its seeds by fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stability.core.config import TrackingConfig
from stability.tracking.contract import TASK_TARGET_PARAM, TRAINER_PARAM, Kind, Tag
from stability.tracking.record import RunRecord
from stability.tracking.uri import git_commit


def settings_fingerprint(target: str, trainer: str, settings: Mapping[str, object]) -> str:
    """12 hex digits identifying (task, trainer, settings) without the seed: runs that differ
    only in their seed share it, as our loop's runs do."""
    body = json.dumps({"target": target, "trainer": trainer,
                       "settings": {k: str(v) for k, v in sorted(settings.items())}},
                      sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class RunIdentity:
    """Which run a trainer run is: what it trains, by which trainer, at which settings and
    seed, in which study (its params and its ``contract.Rebuild`` grouping tags).

    Attributes:
        target: the import path of what is trained (``task._target_``).
        trainer: ``lightning``, ``hf`` or ``plain`` (``stability.track``).
        settings: the study's settings of this point (``precision.name``, ``clip.max_norm``...),
            logged as params and hashed into the fingerprint.
        seed: the training seed.
        sweep_id: the study it belongs to (``stability.sweep_id``).
    """

    target: str
    trainer: str
    settings: Mapping[str, object]
    seed: int
    sweep_id: str


def trainer_record(folder: str | Path, run: RunIdentity, *, loss_name: str = "loss",
                   tracking: TrackingConfig | None = None, name: str | None = None,
                   fingerprint: str | None = None) -> RunRecord:
    """The tracked-run description of one trainer run.

    Args:
        folder: its run folder (``steps.csv``, the journal).
        run: which run it is: what it trains, by which trainer, at which settings and seed,
            in which study.
        loss_name: what the loss is (axis labels).
        tracking: where it goes (default: the embedded store, experiment ``stability``).
        name: the MLflow run name (default: ``<trainer> <settings> s=<seed>``).
        fingerprint: the run's config identity when it has a ``config.yaml`` (its
            ``core.identity.fingerprint``, which the report checks the file against); default:
            ``settings_fingerprint``.
    """
    fp = fingerprint or settings_fingerprint(run.target, run.trainer, run.settings)
    params = {TASK_TARGET_PARAM: run.target, TRAINER_PARAM: run.trainer, "seed": str(run.seed),
              **{k: str(v) for k, v in run.settings.items()}}
    tags = {Tag.KIND: str(Kind.TRAIN), Tag.SWEEP_ID: run.sweep_id, Tag.FINGERPRINT: fp,
            Tag.SEED: str(run.seed), Tag.LOSS_NAME: loss_name, Tag.GIT_COMMIT: git_commit()}
    label = " ".join(f"{k}={v}" for k, v in run.settings.items())
    return RunRecord(params=params, tags=tags, folder=Path(folder),
                     name=name or f"{run.trainer} {label} s={run.seed}",
                     tracking=tracking or TrackingConfig())
