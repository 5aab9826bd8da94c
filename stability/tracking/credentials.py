"""Credentials never leave memory: URIs without ``user:password@`` wherever they are shown.

The tracking URI is logged, tagged, journaled, printed and handed to every job of a sweep, so
everything that shows one goes through ``redact_uri``. An HTTP URI's credentials move into
``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``, which MLflow's client sends itself; a PostgreSQL
URI's password moves into ``PGPASSWORD``, which libpq (psycopg2, psycopg) reads when the URI
has none, so the URI handed to jobs, launchers and the UI server carries none. Another
database URI keeps its password in memory (redacted wherever shown; a ``-m`` sweep refuses
it). Hydra writes the command line into ``.hydra/`` before any of our code runs:
``scrub_hydra_files`` removes them there.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path

# urlsplit's semantics: the authority runs to the first "/", "?" or "#", and its userinfo to
# the LAST "@" in it (greedy), so an unencoded "@" in a password (p@ss@host) is removed whole.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")


def redact_uri(text: str) -> str:
    """``text`` with the ``user:password@`` of every URI in it removed (``http://host``).

    Every URI this project logs, tags, writes or prints goes through here first.
    """
    return _USERINFO.sub(lambda m: m.group("scheme"), text)


def has_userinfo(uri: str) -> bool:
    """The URI carries ``user[:password]@``."""
    return redact_uri(uri) != uri


# SQLAlchemy dialects whose driver is libpq, which reads the password from PGPASSWORD
LIBPQ_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg")
PG_PASSWORD_VAR = "PGPASSWORD"


def has_password(uri: str) -> bool:
    """The URI carries ``user:password@`` (a password, not only a user name)."""
    try:
        return urllib.parse.urlsplit(uri).password is not None
    except ValueError:
        return has_userinfo(uri)


def take_credentials(uri: str) -> str:
    """The URI without the credentials that move into the environment.

    An HTTP URI loses its ``user:password@``, which MLflow's client then sends from
    ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``; a PostgreSQL URI (libpq drivers) loses its
    password, which libpq then reads from ``PGPASSWORD``. A value already exported wins. The
    URI is recorded, printed and handed to every job; the credentials must not be. Another
    database URI keeps them (its driver needs them): it is redacted wherever it is shown.
    """
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme in LIBPQ_SCHEMES and has_password(uri):
        os.environ.setdefault(PG_PASSWORD_VAR, urllib.parse.unquote(parts.password or ""))
        host = parts.netloc.rpartition("@")[2]
        user = f"{parts.netloc.rpartition('@')[0].partition(':')[0]}@"
        return urllib.parse.urlunsplit(parts._replace(netloc=user + host))
    if not uri.startswith(("http://", "https://")) or not has_userinfo(uri):
        return uri
    if parts.username is not None:
        os.environ.setdefault("MLFLOW_TRACKING_USERNAME", urllib.parse.unquote(parts.username))
    if parts.password is not None:
        os.environ.setdefault("MLFLOW_TRACKING_PASSWORD", urllib.parse.unquote(parts.password))
    return redact_uri(uri)


def scrub_hydra_files(folder: Path) -> None:
    """Remove URI credentials from the YAML files Hydra wrote into ``folder/.hydra`` (and a
    sweep's ``multirun.yaml``) from the command line before any of our code ran."""
    for path in [*folder.glob(".hydra/*.yaml"), folder / "multirun.yaml"]:
        if path.is_file():
            text = path.read_text()
            if redact_uri(text) != text:
                path.write_text(redact_uri(text))
