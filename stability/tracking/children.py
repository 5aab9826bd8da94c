"""What a sweep planned and launched: the record its parent run keeps of its own children.

Anyone who can write into the experiment can log a run tagged with a sweep's id: a copy of a
real run under a new run id with a lower loss, or a FAILED run of a seed the sweep never
planned. The tags cannot tell such a run from the sweep's own, so the sweep records on its
parent run (``Artifact.SWEEP_RUNS``, rewritten whole as it grows) the ``(fingerprint, seed)``
points it planned, before launching them, and the run ids its jobs created, read from each
job's own journal in the sweep's folder after each round and at its end. The report decides
from those runs (``report/evidence/membership.py``).

The parent also logs the param ``RECORD_PARAM`` when it is created: a param is written once
(MLflow refuses to change one and has no call that deletes one), so a record deleted or
garbled later is an error the report stops on, never a sweep read by its tags. Every read and
write goes to the parent's checked ``artifact_uri`` (``origins``).
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stability.tracking import journal, origins
from stability.tracking.contract import Artifact

log = logging.getLogger(__name__)

RUN_ID = re.compile(r"[0-9a-f]{32}")  # an MLflow run id (uuid4 hex)
FINGERPRINT = re.compile(r"[0-9a-f]{1,64}")
MAX_ENTRIES = 100_000  # points or runs one sweep records (the default study: ~240)
MAX_BYTES = 128 * MAX_ENTRIES
# The sweep parent's param saying it keeps the record (value: the artifact's name).
RECORD_PARAM = "sweep.record"


class RecordMissing(ValueError):
    """A parent that promised the record (``RECORD_PARAM``) has none, or an unreadable one."""


def promised(params: Mapping[str, str]) -> bool:
    """The parent's params say it keeps ``Artifact.SWEEP_RUNS`` (a sweep of this version)."""
    return params.get(RECORD_PARAM) == Artifact.SWEEP_RUNS


@dataclass(frozen=True)
class Children:
    """A sweep's own record of its points and runs."""

    planned: frozenset[tuple[str, int]]  # (fingerprint, seed) points it planned
    launched: frozenset[str]  # run ids its jobs created


def encode(planned: Iterable[tuple[str, int]], launched: Iterable[str]) -> str:
    """The artifact's text: sorted, so a rewrite with nothing new is the same file."""
    return json.dumps({"planned": sorted([fp, int(seed)] for fp, seed in set(planned)),
                       "launched": sorted(set(launched))})


def write(c: Any, parent_run_id: str, planned: Iterable[tuple[str, int]],
          launched: Iterable[str]) -> None:
    """Write the whole record onto the sweep's parent run, at its checked location."""
    origins.write_text(c, parent_run_id, encode(planned, launched), Artifact.SWEEP_RUNS)


def run_ids_of(folders: Iterable[Path]) -> set[str]:
    """The MLflow run ids the journals in ``folders`` (the sweep's own job folders) name."""
    ids: set[str] = set()
    for folder in folders:
        try:
            replay = journal.read(folder)
        except (OSError, journal.JournalError) as err:
            log.warning("cannot read the run id of %s: %s", folder, err)
            continue
        if replay is not None and replay.run_id and RUN_ID.fullmatch(replay.run_id):
            ids.add(replay.run_id)
    return ids


def _parsed(text: str) -> Children:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    planned, launched = data.get("planned", []), data.get("launched", [])
    if not (isinstance(planned, list) and isinstance(launched, list)
            and len(planned) <= MAX_ENTRIES and len(launched) <= MAX_ENTRIES):
        raise ValueError(f"not two lists of at most {MAX_ENTRIES} entries")
    points = {(p[0], p[1]) for p in planned if isinstance(p, list) and len(p) == 2
              and isinstance(p[0], str) and FINGERPRINT.fullmatch(p[0])
              and type(p[1]) is int}
    ids = {r for r in launched if isinstance(r, str) and RUN_ID.fullmatch(r)}
    if len(points) < len(set(map(json.dumps, planned))) or len(ids) < len(set(map(str, launched))):
        raise ValueError("an entry is not a [fingerprint, seed] point or a run id")
    return Children(frozenset(points), frozenset(ids))


def read(c: Any, parent_run_id: str | None) -> Children | None:
    """The parent's record; None when it has none (a sweep from before the record existed).

    Raises:
        ValueError: the artifact is there but is not a record (over ``MAX_BYTES``, not JSON of
            the documented shape): the caller trusts none of the sweep's runs by it.
    """
    if not parent_run_id:
        return None
    uri = origins.run_uri(c, parent_run_id)  # ForeignArtifacts: nothing read or sent there
    info = {f.path: f for f in origins.listing(c, parent_run_id, artifact_uri=uri)}
    entry = info.get(Artifact.SWEEP_RUNS)
    if entry is None:
        return None
    if entry.is_dir or (entry.file_size or 0) > MAX_BYTES:
        raise ValueError(f"{Artifact.SWEEP_RUNS} is not a file of at most {MAX_BYTES:,} bytes")
    with tempfile.TemporaryDirectory(prefix="stability-children-") as tmp:
        path = origins.download(c, parent_run_id, Artifact.SWEEP_RUNS, tmp, uri)
        with path.open("rb") as f:
            text = f.read(MAX_BYTES + 1).decode("utf-8")
    if len(text.encode("utf-8")) > MAX_BYTES:
        raise ValueError(f"{Artifact.SWEEP_RUNS} is over {MAX_BYTES:,} bytes")
    return _parsed(text)
