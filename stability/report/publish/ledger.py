"""Which model versions this user's reports registered: a ledger in the report folder.

What MLflow records of a model version (its tags, its run, its source, the report run that
logged its model, that run's tags) is written by anyone who may create runs in the experiment
or versions of the model: a pyfunc logged into a run tagged ``kind=report`` with the sweep's
id and winner was reused as the report's own and ``@champion`` moved to it (issue 55, item 6).
The proof is local: each version a report registers is noted in ``LEDGER`` in its report
folder (the user's disk, which no teammate writes), and a version is the report's own only
when that ledger names it with the same store, source, winner and training run.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stability.report.publish.signature import LOGGED_MODEL
from stability.tracking.credentials import redact_uri

log = logging.getLogger(__name__)

LEDGER = "registered_versions.json"  # in the report folder: the versions its reports registered
MAX_LEDGER_BYTES = 1_000_000


def read(folder: Path | None) -> list[dict[str, str]]:
    """The versions earlier reports in ``folder`` registered ([] when none or unreadable)."""
    path = None if folder is None else folder / LEDGER
    if path is None or not path.is_file() or path.is_symlink() \
            or path.stat().st_size > MAX_LEDGER_BYTES:
        return []
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def entry(uri: str, name: str, version: str, source: str, fp: str, training_run_id: str,
          report_run_id: str) -> dict[str, str]:
    """One ledger line: the version, where it is (store without credentials) and what it is."""
    return {"store": redact_uri(uri), "name": name, "version": version, "source": source,
            "winner": fp, "training_run_id": training_run_id, "report_run_id": report_run_id}


def remember(folder: Path | None, new: dict[str, str]) -> None:
    """Add ``new`` to the folder's ledger (written beside it, then renamed over it)."""
    if folder is None:
        return
    entries = [*read(folder), new]
    tmp = folder / f".{LEDGER}.tmp"
    try:
        tmp.write_text(json.dumps(entries, indent=1), encoding="utf-8")
        os.replace(tmp, folder / LEDGER)
    except OSError as err:  # the version stands; the next report registers another
        log.warning("could not note model version %s in %s: %s", new["version"],
                    folder / LEDGER, err)


def own(v: Any, uri: str, ledger: Sequence[Mapping[str, str]], fp: str,
        training_run_id: str) -> bool:
    """Whether ``v`` is a version an earlier report in this report folder registered for this
    winner: named in its ledger with this store, source, winner and training run, and MLflow
    still records that source and run for it. Nothing a teammate can write decides it."""
    source = str(v.source or "")
    if LOGGED_MODEL.fullmatch(source) is None or str(v.run_id or "") != training_run_id:
        return False
    mine = entry(uri, str(v.name), str(v.version), source, fp, training_run_id, "")
    keys = ("store", "name", "version", "source", "winner", "training_run_id")
    return any(all(e.get(k) == mine[k] for k in keys) for e in ledger)
