"""Uploading a run folder's artifacts: the one function every path uses (run end, orphan
closing, sync). A file the run already holds with the same size is not uploaded again; one
that differs (a CSV uploaded before the run resumed) is replaced at the same path.

Nothing is read through a symlink (``folders.open_regular``): a symlinked artifact is skipped
with a warning, and what is sent is a copy of the file opened without following one (MLflow
is handed that copy's path, never the folder's, so a file swapped for a link after the check
is not read either). Every listing and upload goes to the run's checked ``artifact_uri``
(``origins.repo``): a run whose location is not on the configured store gets nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from stability.tracking import origins
from stability.tracking.contract import Artifact
from stability.tracking.folders import NotRegular, open_regular

log = logging.getLogger(__name__)


def uploaded(c: Any, run_id: str, artifact_uri: str = "") -> dict[str, int]:
    """``{artifact path: size}`` of the run's files (one folder level deep, as ``Artifact``).

    Raises:
        origins.ForeignArtifacts: the run's artifact location is not on the store.
    """
    uri = artifact_uri or origins.run_uri(c, run_id)
    out: dict[str, int] = {}
    for a in origins.listing(c, run_id, artifact_uri=uri):
        for f in origins.listing(c, run_id, a.path, uri) if a.is_dir else [a]:
            if not f.is_dir:
                out[f.path] = int(f.file_size or 0)
    return out


def _open_present(folder: Path) -> dict[str, int]:
    """``{name: descriptor}`` of the ``Artifact.ALL`` files present as regular files."""
    files: dict[str, int] = {}
    for name in Artifact.ALL:
        try:
            files[name] = open_regular(folder, name)
        except FileNotFoundError:
            continue
        except NotRegular as err:
            log.warning("not uploading %s: uploads never follow a symlink", err)
    return files


def missing_artifacts(c: Any, run_id: str, folder: str | Path) -> list[str]:
    """The ``Artifact.ALL`` files of ``folder`` that ``upload_artifacts`` would send now.

    Args:
        c: an ``MlflowClient``.
        run_id: the MLflow run.
        folder: the run folder.
    """
    files = _open_present(Path(folder))
    try:
        have = uploaded(c, run_id) if files else {}
        return [n for n, fd in files.items() if have.get(n) != os.fstat(fd).st_size]
    finally:
        for fd in files.values():
            os.close(fd)


def upload_artifacts(c: Any, run_id: str, folder: str | Path) -> list[str]:
    """Upload the ``Artifact.ALL`` files of ``folder`` the run lacks; returns the paths sent.

    Args:
        c: an ``MlflowClient``.
        run_id: the MLflow run.
        folder: the run folder.
    """
    files = _open_present(Path(folder))
    done = []
    try:
        uri = origins.run_uri(c, run_id) if files else ""
        have = uploaded(c, run_id, uri) if files else {}
        with tempfile.TemporaryDirectory(prefix="stability-upload-") as tmp:
            for name, fd in files.items():
                if have.get(name) == os.fstat(fd).st_size:
                    continue
                copy = Path(tmp) / name
                copy.parent.mkdir(parents=True, exist_ok=True)
                with os.fdopen(os.dup(fd), "rb") as src, copy.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                parent = str(Path(name).parent) if "/" in name else None
                origins.upload(c, run_id, copy, parent, uri)
                done.append(name)
    finally:
        for fd in files.values():
            os.close(fd)
    return done
