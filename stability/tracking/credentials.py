"""Credentials never leave memory: URIs without ``user:password@`` wherever they are shown.

The tracking URI is logged, tagged, journaled, printed and handed to every job of a sweep, so
everything that shows one goes through ``redact_uri``. An HTTP URI's credentials move into
``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``, which MLflow's client sends itself; a database URI
keeps them in memory (SQLAlchemy needs them). Hydra writes the command line into ``.hydra/``
before any of our code runs: ``scrub_hydra_files`` removes them there.
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


def take_credentials(uri: str) -> str:
    """An HTTP URI without its ``user:password@``, which MLflow's client then sends from
    ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` (a value already exported wins).

    The URI is recorded, printed and handed to every job; the credentials must not be. A
    database URI keeps them (SQLAlchemy needs them): it is redacted wherever it is shown.
    """
    if not uri.startswith(("http://", "https://")) or not has_userinfo(uri):
        return uri
    parts = urllib.parse.urlsplit(uri)
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
