"""A new run never overwrites another run's records in its folder: they are moved aside.

A run folder may still hold a previous run's records when a new run starts in it (the same
``hydra.run.dir`` twice, a reused folder): its journal and pending marker (data MLflow may
still lack), its resume checkpoint and its ``steps.csv``. Unless the new run is that run
resuming (same config and seed: ``checkpoint.peek``), or a previous run of the same config and
seed that MLflow holds completely, those files move to ``<folder>/aside-<time>/`` first, with
one line saying where; ``stability sync`` finds a pending marker there as anywhere else.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from stability.core import checkpoint, rundir
from stability.core.config import RunConfig
from stability.core.identity import fingerprint
from stability.tracking import journal
from stability.tracking.contract import Tag

log = logging.getLogger(__name__)
# What a run leaves in its folder (the journal first: it says whose the rest is).
RECORDS = (rundir.JOURNAL_NAME, rundir.PENDING_NAME, rundir.RESUME_NAME, rundir.CSV_NAME,
           rundir.CONFIG_NAME, rundir.CHECKPOINT_NAME, rundir.LAYER_NORMS_NAME,
           rundir.LAYER_UPDATES_NAME)


def _foreign(folder: Path, cfg: RunConfig, world_size: int) -> str:
    """Why ``folder`` holds records a new run of ``cfg`` must not overwrite ("" if none)."""
    if checkpoint.peek(folder, cfg) is not None:
        return ""  # this very run, resuming: it continues its own records
    if (folder / rundir.RESUME_NAME).exists():
        return "a resume checkpoint of another config or seed"
    if journal.is_pending(folder):
        return "a run MLflow does not hold completely (marked pending sync)"
    try:
        old = journal.read(folder)
    except journal.JournalError:
        return "a journal that cannot be read"
    if old is None:
        return ""
    same = (old.tags.get(Tag.FINGERPRINT) == fingerprint(cfg, world_size)
            and old.tags.get(Tag.SEED) == str(cfg.seed))
    return "" if same else "the journal of another config or seed"


def claim(folder: str | Path, cfg: RunConfig, world_size: int = 1) -> Path | None:
    """Make ``folder`` safe for a new run of ``cfg``: move a previous run's records aside.

    Returns:
        Where they went, or None when nothing had to move.
    """
    folder = Path(folder)
    why = _foreign(folder, cfg, world_size)
    if not why:
        return None
    aside = folder / f"aside-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6:06d}"
    for rel in RECORDS:
        src = folder / rel
        if src.exists():
            (aside / rel).parent.mkdir(parents=True, exist_ok=True)
            src.replace(aside / rel)
    log.warning("moved the previous run's records in %s aside to %s (%s); `stability sync %s` "
                "uploads what MLflow lacks", folder, aside, why, aside)
    return aside
