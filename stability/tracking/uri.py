"""Where runs go: URI policy, the default store, reachability, clients, experiment creation.

Reachability of an HTTP server is checked once per process (a sweep's jobs each check once;
``TrackedRun`` and the sweeper share the answer). HTTP retry and timeout are explicit settings
(``tracking.request_timeout_s``; MLflow's own retries are switched off by ``configure_http``
because the run's sender retries with its own bounded back-off, see ``buffer.Sender``).
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stability.core.config import ConfigError, RunConfig
from stability.core.identity import config_label, flatten
from stability.tracking import origins
from stability.tracking.contract import EXPERIMENT_KIND_TRAINING, Tag
from stability.tracking.credentials import (  # noqa: F401 - part of the URI policy
    has_userinfo,
    redact_uri,
    scrub_hydra_files,
    take_credentials,
)
from stability.tracking.lean import import_mlflow

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # stability/ (in a checkout: its repo)
REACH_TIMEOUT_S = 5.0
# MLflow reads these two variables on every request. Retries inside MLflow would block the
# sender for minutes per call (7 retries with back-off by default) and hide the outage from
# our own bounded back-off, so a run sets them to 0 retries and ``request_timeout_s``.
HTTP_RETRIES_VAR = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
HTTP_TIMEOUT_VAR = "MLFLOW_HTTP_REQUEST_TIMEOUT"


_LOCKS_HELD: set[str] = set()  # store locks this process holds (see store_lock)
_REACHED: set[str] = set()  # HTTP servers that answered /health in this process


class TrackingError(RuntimeError):
    """The tracking server cannot be used (unreachable, refused)."""


def configure_http(timeout_s: float, retries: int = 0) -> None:
    """Set MLflow's per-request timeout and retries for this process (explicit, not at import).

    A value the user exported already wins: it is their documented MLflow setting.
    """
    os.environ.setdefault(HTTP_RETRIES_VAR, str(retries))
    os.environ.setdefault(HTTP_TIMEOUT_VAR, str(int(max(1, timeout_s))))


def default_store_uri() -> str:
    """The embedded default: ``./mlflow.db`` of the current directory (MLflow's own convention).

    Resolved to an absolute path once, so every job of a sweep (each in its own Hydra output
    folder) writes to the same file. Not the deprecated file store.
    """
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def validate_uri(uri: str) -> None:
    """Reject URIs MLflow 3 would refuse or silently misuse (e.g. the deprecated file store)."""
    if uri.startswith("file:") or "://" not in uri:
        raise ConfigError(
            f"tracking.uri={redact_uri(uri)!r} is invalid: allowed values are http(s)://host:port, "
            "sqlite:///path/to/mlflow.db, postgresql://..., or null for the embedded store"
        )


def resolve_tracking_uri(uri: str | None = None) -> str:
    """``tracking.uri`` if given, else ``$MLFLOW_TRACKING_URI``, else the embedded SQLite store.

    Raises:
        ConfigError: the URI is malformed, or names a database store that this install of
            MLflow cannot open (``mlflow-skinny`` has no SQLAlchemy: servers only).
    """
    resolved = take_credentials(uri or os.environ.get("MLFLOW_TRACKING_URI")
                                or default_store_uri())
    validate_uri(resolved)
    if not is_http(resolved) and not has_database_store():
        shown = redact_uri(resolved)
        given = (f"tracking.uri={shown!r}" if uri else
                 f"MLFLOW_TRACKING_URI={shown!r}" if os.environ.get("MLFLOW_TRACKING_URI")
                 else f"tracking.uri=null (the embedded store {shown})")
        raise ConfigError(
            f"{given} needs MLflow's database store (sqlalchemy and alembic, part of the full "
            "`mlflow` package), which this install (mlflow-skinny) lacks: allowed values here "
            "are http(s)://host:port, a tracking server (docs/cluster.md), or install mlflow")
    return resolved


@functools.cache
def has_database_store() -> bool:
    """Whether MLflow can open ``sqlite://`` / ``postgresql://`` stores here (not in skinny)."""
    return all(importlib.util.find_spec(m) is not None for m in ("sqlalchemy", "alembic"))


def is_http(uri: str) -> bool:
    """An MLflow tracking server (as opposed to a database URI used directly)."""
    return uri.startswith(("http://", "https://"))


def _probe(uri: str, timeout_s: float) -> str:
    """"" if ``uri``'s ``/health`` answers 200, else why not."""
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as r:
            return "" if r.status == 200 else f"HTTP {r.status} from /health"
    except urllib.error.URLError as err:
        return str(err.reason)
    except OSError as err:
        return str(err)


def check_reachable(uri: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise ``TrackingError`` within ``timeout_s`` if an HTTP tracking server does not answer.

    A server that answered once is not probed again in this process (the sweeper and its
    in-process jobs ask the same question); one that did not is probed again when asked.
    """
    if not is_http(uri) or uri in _REACHED:
        return
    reason = _probe(uri, timeout_s)
    if not reason:
        _REACHED.add(uri)
    else:
        raise TrackingError(
            f"tracking server {uri} is not reachable ({reason}); start it (see "
            "docs/team-server.md) or set tracking.uri / MLFLOW_TRACKING_URI to a running server"
        )


def reachable_now(uri: str, timeout_s: float = REACH_TIMEOUT_S) -> bool:
    """A fresh probe (not remembered): for a sync or a sender deciding whether to try again."""
    return not is_http(uri) or not _probe(uri, timeout_s)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Hold ``<db>.lock`` beside a SQLite store (no-op for other stores).

    Two processes creating a brand-new store at once race MLflow's schema migrations
    (``table latest_metrics already exists``); under this lock the second finds the schema.
    """
    db = sqlite_path(uri)
    if db is None or uri in _LOCKS_HELD:  # flock is not re-entrant across file descriptors
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _LOCKS_HELD.add(uri)
        try:
            yield
        finally:
            _LOCKS_HELD.discard(uri)
            fcntl.flock(f, fcntl.LOCK_UN)


def client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri`` whose store (and schema) exists (MLflow imported lazily).

    For SQLite the store is opened under ``store_lock``, so its creation never races. The
    process's first client imports MLflow, for a server without pandas (``lean``).
    """
    import_mlflow(server=is_http(uri))
    from mlflow.tracking import MlflowClient

    if sqlite_path(uri) is None:
        return MlflowClient(tracking_uri=uri)
    # MlflowClient() itself may open (and migrate) the store: it is created under the lock.
    with store_lock(uri):
        try:
            c = MlflowClient(tracking_uri=uri)
            c._tracking_client.store  # noqa: B018 - opening the store creates the schema
        except Exception as err:
            # An opener outside our lock (another tool's MLflow client) migrated at the same
            # moment: the schema is there now, or nearly. Once more, then give up.
            if not already_exists(err):
                raise
            c = MlflowClient(tracking_uri=uri)
            c._tracking_client.store  # noqa: B018
    return c


_EXISTS = ("already exists", "duplicate column", "duplicate key", "unique constraint",
           "no such index", "expected to match one row")  # the other side of the same race


def already_exists(err: BaseException) -> bool:
    """A schema migration lost a race to another process ("index ... already exists")."""
    chain, seen = [err], set()
    while chain:
        e = chain.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if any(word in str(e).lower() for word in _EXISTS):
            return True
        chain += [x for x in (e.__cause__, e.__context__) if x is not None]
    return False


def ensure_experiment(uri: str, name: str, check: bool = True) -> str:
    """Create the store (and its schema) and the experiment if needed; returns its id.

    A new experiment is tagged as model training (``Tag.EXPERIMENT_KIND``), so MLflow 3's UI
    opens it on its runs.

    Safe from several processes at once: on SQLite the whole check-and-create holds
    ``store_lock``; a server that reports the experiment as just created is asked again.
    ``check=False`` skips the ``/health`` probe (a caller that retries on its own). An
    existing experiment whose artifact location is not on this store is refused
    (``origins``: MLflow would send the credentials there).

    Raises:
        ForeignArtifacts: the experiment keeps its artifacts elsewhere (one line naming it).
    """
    import_mlflow(server=is_http(uri))
    from mlflow.exceptions import MlflowException

    if check:
        check_reachable(uri)
    with store_lock(uri):
        c = client(uri)
        exp = c.get_experiment_by_name(name)
        if exp is None:
            try:
                return c.create_experiment(name, local_artifact_root(uri, name),
                                           tags={Tag.EXPERIMENT_KIND: EXPERIMENT_KIND_TRAINING})
            except MlflowException:  # another process (another machine) created it meanwhile
                exp = c.get_experiment_by_name(name)
                if exp is None:
                    raise
        origins.check(uri, exp.artifact_location, f"experiment '{name}'")
        return exp.experiment_id


def mark_training_experiment(c: Any, experiment_id: str) -> None:
    """Tag an existing experiment as model training (``Tag.EXPERIMENT_KIND``) unless it has a
    kind already: MLflow's UI then opens it on its runs, the answer in the runs' descriptions.
    """
    exp = c.get_experiment(experiment_id)
    if Tag.EXPERIMENT_KIND not in (exp.tags or {}):
        c.set_experiment_tag(experiment_id, Tag.EXPERIMENT_KIND, EXPERIMENT_KIND_TRAINING)


def local_artifact_root(uri: str, experiment: str) -> str | None:
    """Where a new experiment of a SQLite store keeps artifacts: ``mlruns/`` beside the file.

    MLflow's default is ``./mlruns`` of whatever directory the first run started in, which
    scatters artifacts (and mixes experiment ids of different stores). Servers decide for
    themselves: None.
    """
    db = sqlite_path(uri)
    if db is None:
        return None
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment)
    return str(db.resolve().parent / "mlruns" / slug)


@functools.cache
def git_commit() -> str:
    """The commit of the code that runs: this package's checkout, else the current folder's.

    An installed (non-editable) package has no checkout; a user's own task then lives in
    the current folder's repository, if any. "" when neither is a git checkout.
    """
    for where in (PACKAGE_DIR, Path.cwd()):
        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                                 text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return ""


def run_name(cfg: RunConfig) -> str:
    """A name a person can read, e.g. ``fp16 clip=1 acc=4 s=3``."""
    return f"{config_label(flatten(cfg))} s={cfg.seed}"
