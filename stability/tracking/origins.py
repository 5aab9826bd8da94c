"""Where artifacts may be read and written: only the store the user configured.

An experiment's artifact location, a run's ``artifact_uri`` and a model version's source are
data: anyone who can write into the store sets them. MLflow's client sends
``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` (or ``~/.mlflow/credentials``) to whatever HTTP
host such a location names, so a planted ``http://<attacker>/...`` location would receive them.
Every artifact read, listing and upload of this project goes through ``check`` (or ``repo``)
first:

- an ``http(s)://`` tracking server: ``mlflow-artifacts:`` URIs (no host, or the server's own)
  and ``http(s)://`` URIs on the server's own scheme, host and port;
- a SQLite store: local paths under the folder that holds the database file (where
  ``uri.local_artifact_root`` puts them: ``mlruns/`` beside it);
- another database store (PostgreSQL): local paths (they send no credentials);
- ``s3://`` only in ``$STABILITY_S3_BUCKET`` when set, else only under the experiment's own
  recorded ``s3://`` root (a run's location; the experiment's root is taken as recorded).

Anything else (another host, another scheme: ``gs://``, ``ftp://``, ``runs:/``...) is refused
with one line naming it (``ForeignArtifacts``).

One parser: ``urllib.parse`` (this policy) and urllib3 (what ``requests`` connects to) end an
authority at different characters (urllib3 also at ``\\``) and strip different ones (tabs,
newlines), so ``http://127.0.0.1:<L>\\@127.0.0.1:<S>/`` was the server here and port L there.
A location with a backslash, a control character or white space anywhere, or whose authority
is anything but ``host[:port]`` of plain ASCII (no userinfo, no ``%``, no empty port), is
refused before it is parsed: on what remains, both read the same host and port
(``tests/tracking/test_origins.py`` feeds URL shapes to both).

The functions below (``listing``, ``download``, ``upload``, ``write_text``, ``download_at``)
are the project's only calls of MLflow's artifact listing, download and upload:
``tests/tracking/test_origins.py`` greps that no other module makes one.
"""

from __future__ import annotations

import os
import re
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

from stability.tracking.credentials import redact_uri

S3_BUCKET_VAR = "STABILITY_S3_BUCKET"  # the one bucket artifacts may live in (direct S3 mode)
_DEFAULT_PORTS = {"http": 80, "https": 443}


class ForeignArtifacts(ValueError):
    """An artifact location outside the configured store (the message is one line)."""


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# ``host[:port]``: DNS labels (a trailing dot is another spelling: refused), IPv4 (labels too),
# or a bracketed IPv6 literal; a port of digits. Nothing two parsers could split differently.
_AUTHORITY = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?")
_UNSAFE = re.compile(r"[\x00-\x20\x7f-\x9f\\\u00a0\u1680\u2000-\u200f\u2028-\u202f\u205f"
                     r"\u3000\ufeff]")


def _unsafe(location: str) -> str:
    """Why ``location`` could be read two ways ("" when it cannot)."""
    bad = _UNSAFE.search(location)
    if bad:
        return f"it holds {bad.group()!r}, which HTTP clients parse differently"
    scheme, sep, rest = location.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]  # where RFC 3986 (and urlsplit) ends it
    if sep and scheme.lower() in ("http", "https", "mlflow-artifacts") and authority \
            and not _AUTHORITY.fullmatch(authority):
        return f"its authority {authority[:80]!r} is not a plain host[:port]"
    return ""


def _origin(scheme: str, netloc: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(f"{scheme}://{netloc}")
    try:
        port = parts.port
    except ValueError:
        port = -1  # not a port: matches nothing
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme)


def _local_path(location: str) -> Path | None:
    parts = urllib.parse.urlsplit(location)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return Path(urllib.parse.unquote(parts.path))
    if not parts.scheme and location.startswith("/"):
        return Path(location)
    return None


def _under(path: Path, root: Path) -> bool:
    return os.path.normpath(path).startswith(os.path.normpath(root).rstrip("/") + "/")


def _s3_allowed(location: str, root: str | None) -> bool:
    bucket = os.environ.get(S3_BUCKET_VAR, "").strip()
    if bucket:
        return urllib.parse.urlsplit(location).netloc == bucket
    if root is None:
        return True  # an experiment's own root: the server chose it
    return root.startswith("s3://") and (location.rstrip("/") + "/").startswith(
        root.rstrip("/") + "/")


def refusal(tracking_uri: str, location: str, root: str | None = None) -> str:
    """Why ``location`` is not on the store ``tracking_uri`` names ("" when it is).

    Args:
        tracking_uri: the configured tracking URI (without credentials).
        location: an experiment's artifact location, a run's ``artifact_uri`` or a model's.
        root: the recorded artifact location of the experiment ``location`` belongs to (for a
            run or a model), None for an experiment's own location.
    """
    unsafe = "" if location.startswith("/") else _unsafe(location)  # a path sends nothing
    if unsafe:
        return unsafe
    try:
        parts = urllib.parse.urlsplit(location)
    except ValueError:  # "Invalid IPv6 URL"
        return "not a URL"
    track = urllib.parse.urlsplit(tracking_uri)
    server = track.scheme in ("http", "https")
    if parts.scheme == "mlflow-artifacts":
        if not parts.netloc or (server and _origin(track.scheme, parts.netloc)
                                == _origin(track.scheme, track.netloc)):
            return ""
        return "mlflow-artifacts on another host than the tracking server"
    if parts.scheme in ("http", "https"):
        if server and _origin(parts.scheme, parts.netloc) == _origin(track.scheme, track.netloc):
            return ""
        return "not on the tracking server" if server else "a server, not the store's folder"
    if parts.scheme == "s3":
        return "" if _s3_allowed(location, root) else (
            f"outside the configured bucket ${S3_BUCKET_VAR}" if os.environ.get(S3_BUCKET_VAR)
            else "outside its experiment's own s3:// root")
    local = _local_path(location)
    if local is not None and not server:
        if not track.scheme.startswith("sqlite"):
            return ""
        db = Path(urllib.parse.unquote(track.path.removeprefix("/")))  # sqlite:///<path>
        stores = (db.absolute().parent, db.resolve().parent)  # as given, links resolved
        return "" if any(_under(local, s) for s in stores) else (
            f"a local folder outside the store's {stores[1]}")
    return "a location this store does not use"


def check(tracking_uri: str, location: str, what: str, root: str | None = None) -> str:
    """``location`` when ``refusal`` allows it.

    Args:
        tracking_uri: the configured tracking URI.
        location: the artifact location or URI to use.
        what: what it belongs to, for the message (``experiment 'x'``, ``run <id>``).
        root: the experiment's recorded artifact location (see ``refusal``).

    Raises:
        ForeignArtifacts: one line naming ``what``, the location and the store.
    """
    why = refusal(tracking_uri, str(location or ""), root)
    if why:
        raise ForeignArtifacts(
            f"{what} keeps its artifacts at {redact_uri(str(location))[:200]!r} ({why}), not in "
            f"tracking store {redact_uri(tracking_uri)}: refused, nothing read or sent there")
    return str(location)


_ROOTS: dict[tuple[str, str], str] = {}  # checked experiment roots, per store (this process)


def _experiment_root(c: Any, experiment_id: str) -> str:
    key = (str(c.tracking_uri), experiment_id)
    if key not in _ROOTS:
        exp = c.get_experiment(experiment_id)
        location = str(exp.artifact_location or "")
        _ROOTS[key] = check(key[0], location, f"experiment '{exp.name}'")
    return _ROOTS[key]


def run_uri(c: Any, run: Any) -> str:
    """The checked ``artifact_uri`` of ``run`` (an MLflow ``Run`` or a run id).

    Raises:
        ForeignArtifacts: the run's (or its experiment's s3) location is elsewhere.
    """
    if isinstance(run, str):
        run = c.get_run(run)
    uri = str(run.info.artifact_uri or "")
    root = None
    if uri.startswith("s3://") and not os.environ.get(S3_BUCKET_VAR):
        root = _experiment_root(c, str(run.info.experiment_id))
    return check(c.tracking_uri, uri, f"run {run.info.run_id}", root)


def repo(c: Any, run: Any, artifact_uri: str = "") -> Any:
    """The artifact repository of ``run`` at its checked ``artifact_uri`` (given, or looked
    up): what every listing, download and upload of a run uses (never MLflow's own look-up,
    which follows whatever the run records at that moment).

    Raises:
        ForeignArtifacts: the run's location is elsewhere.
    """
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    if artifact_uri and not artifact_uri.startswith("s3://"):
        run_id = run if isinstance(run, str) else run.info.run_id
        uri = check(c.tracking_uri, artifact_uri, f"run {run_id}")
    else:
        uri = run_uri(c, run)
    return get_artifact_repository(uri, tracking_uri=c.tracking_uri)


# -- the only artifact I/O: each goes to a location checked just before --------------------


def listing(c: Any, run: Any, path: str | None = None, artifact_uri: str = "") -> list[Any]:
    """MLflow's ``FileInfo`` list of ``path`` (the root: None) of ``run``'s artifacts.

    Raises:
        ForeignArtifacts: the run's location is elsewhere.
    """
    return list(repo(c, run, artifact_uri).list_artifacts(path))


def download(c: Any, run: Any, path: str, dest: str | Path, artifact_uri: str = "") -> Path:
    """Download ``path`` of ``run``'s artifacts into ``dest``; the local path.

    Raises:
        ForeignArtifacts: the run's location is elsewhere.
    """
    return Path(repo(c, run, artifact_uri).download_artifacts(path, str(dest)))


def upload(c: Any, run: Any, local: str | Path, artifact_path: str | None = None,
           artifact_uri: str = "") -> None:
    """Upload the file ``local`` into ``artifact_path`` (None: the root) of ``run``.

    Raises:
        ForeignArtifacts: the run's location is elsewhere.
    """
    repo(c, run, artifact_uri).log_artifact(str(local), artifact_path)


def write_text(c: Any, run: Any, text: str, path: str) -> None:
    """Write ``text`` as the artifact ``path`` (a file name at the root) of ``run``.

    Raises:
        ForeignArtifacts: the run's location is elsewhere.
    """
    with tempfile.TemporaryDirectory(prefix="stability-text-") as tmp:
        local = Path(tmp) / Path(path).name
        local.write_text(text, encoding="utf-8")
        parent = str(Path(path).parent)
        upload(c, run, local, None if parent == "." else parent)


def download_at(c: Any, location: str, path: str, dest: str | Path, what: str,
                root: str | None = None) -> Path:
    """Download ``path`` below ``location`` (a model's), checked first (``check``).

    Raises:
        ForeignArtifacts: ``location`` is elsewhere.
    """
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    checked = check(c.tracking_uri, location, what, root)
    repository = get_artifact_repository(checked, tracking_uri=c.tracking_uri)
    return Path(repository.download_artifacts(path, str(dest)))
