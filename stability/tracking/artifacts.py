"""Uploading a run folder's artifacts: the one function every path uses (run end, orphan
closing, sync). A file the run already holds with the same size is not uploaded again; one
that differs (a CSV uploaded before the run resumed) is replaced at the same path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stability.tracking.contract import Artifact


def uploaded(c: Any, run_id: str) -> dict[str, int]:
    """``{artifact path: size}`` of the run's files (one folder level deep, as ``Artifact``)."""
    out: dict[str, int] = {}
    for a in c.list_artifacts(run_id):
        for f in c.list_artifacts(run_id, a.path) if a.is_dir else [a]:
            if not f.is_dir:
                out[f.path] = int(f.file_size or 0)
    return out


def upload_artifacts(c: Any, run_id: str, folder: str | Path) -> list[str]:
    """Upload the ``Artifact.ALL`` files of ``folder`` the run lacks; returns the paths sent.

    Args:
        c: an ``MlflowClient``.
        run_id: the MLflow run.
        folder: the run folder.
    """
    folder = Path(folder)
    present = [name for name in Artifact.ALL if (folder / name).exists()]
    have = uploaded(c, run_id) if present else {}
    done = []
    for name in present:
        if have.get(name) == (folder / name).stat().st_size:
            continue
        parent = str(Path(name).parent) if "/" in name else None
        c.log_artifact(run_id, str(folder / name), artifact_path=parent)
        done.append(name)
    return done
