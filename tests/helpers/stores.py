"""An empty MLflow SQLite store, migrated once per test process and copied for each test.

MLflow creates a SQLite store by running every schema migration (~1.5 s of CPU, and one commit
each). A test whose subject is not store creation starts from a copy of one store this process
migrated: a real MLflow store at the current schema, so MLflow opens it without migrating. The
tests of a fresh store (two processes creating one at once, the UI racing a sweep, the
embedded default) still create theirs from nothing.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

_template: Path | None = None


def _migrated() -> Path:
    """This process's migrated empty store (created on the first call)."""
    global _template
    if _template is None:
        from mlflow.tracking import MlflowClient

        path = Path(tempfile.mkdtemp(prefix="stability-store-")) / "mlflow.db"
        MlflowClient(f"sqlite:///{path}").search_experiments()  # runs the migrations
        _template = path
    return _template


def sqlite_store(path: Path) -> str:
    """Copy the migrated empty store to ``path`` (a new file); returns its ``sqlite:///`` URI.

    Args:
        path: where the store goes, e.g. ``tmp_path / "mlflow.db"``; its folder is created.
    """
    assert not path.exists(), f"{path} exists: a copied store would replace it"
    path.parent.mkdir(parents=True, exist_ok=True)
    # SQLite's backup API: a consistent copy even while MLflow holds a connection to the source
    with sqlite3.connect(_migrated()) as src, sqlite3.connect(path) as dst:
        src.backup(dst)
    src.close()
    dst.close()
    return f"sqlite:///{path}"
