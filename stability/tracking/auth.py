"""Sign-in pre-flight for a tracking server with authentication (`--app-name basic-auth`).

Training nodes authenticate with ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``
(or ``~/.mlflow/credentials``), which MLflow's client reads itself, so credentials never
pass through the config, the overrides or a URI. The sweeper asks the server once, before any
run starts, whether it accepts them: a wrong or missing password then ends the sweep with one
line instead of failing every run of the grid.
"""

from __future__ import annotations

import base64
import os
import urllib.error
import urllib.parse
import urllib.request

from stability.tracking.credentials import LIBPQ_SCHEMES, has_password
from stability.tracking.lean import import_mlflow
from stability.tracking.uri import REACH_TIMEOUT_S

# MLflow's basic-auth app answers this for any signed-in user; a server without auth has no
# such route (404), which means there is nothing to sign in to.
CURRENT_USER = "/api/2.0/mlflow/users/current"
CREDENTIALS_HINT = ("set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
                    "(docs/team-server.md)")


class AuthError(RuntimeError):
    """The tracking server refused the credentials (or there were none)."""


def tracking_credentials() -> tuple[str | None, str | None]:
    """(user, password) the MLflow client will send: its environment variables or
    ``~/.mlflow/credentials``, read the way MLflow reads them (asked for HTTP servers only)."""
    import_mlflow(server=True)
    from mlflow.utils.credentials import read_mlflow_creds

    creds = read_mlflow_creds()
    return creds.username, creds.password


def check_no_userinfo(uri: str) -> None:
    """Refuse ``http://user:password@host`` URIs, and a database URI with a password: the URI
    is recorded and printed, a password in it would land in logs, tags, Hydra's
    ``multirun.yaml`` and every job's overrides (a launcher's pickles, a SLURM script).

    Raises:
        AuthError: the URI carries credentials.
    """
    parts = urllib.parse.urlsplit(uri)
    host = parts.netloc.rpartition("@")[2]
    if parts.scheme in ("http", "https") and "@" in parts.netloc:
        raise AuthError(f"tracking.uri must not carry credentials ({parts.scheme}://<...>@{host}):"
                        f" remove them from the URI and {CREDENTIALS_HINT}")
    if has_password(uri):
        hint = ("export PGPASSWORD (or use ~/.pgpass), which the PostgreSQL driver reads"
                if parts.scheme in LIBPQ_SCHEMES else
                "pass the whole URI in $MLFLOW_TRACKING_URI instead")
        raise AuthError(f"tracking.uri must not carry a password ({parts.scheme}://<...>@{host}):"
                        f" remove it from the URI and {hint} (docs/TRACKING.md)")


def check_credentials(uri: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise ``AuthError`` if the HTTP tracking server at ``uri`` refuses this client.

    Non-HTTP stores and servers without authentication pass. An unreachable server passes
    too: reachability is reported by ``check_reachable`` with its own message.

    Raises:
        AuthError: "authentication failed for <user> at <uri>" (HTTP 401).
    """
    if not uri.startswith(("http://", "https://")):
        return
    check_no_userinfo(uri)
    user, password = tracking_credentials()
    request = urllib.request.Request(uri.rstrip("/") + CURRENT_USER)
    if user is not None and password is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    elif bearer := os.environ.get("MLFLOW_TRACKING_TOKEN"):
        request.add_header("Authorization", f"Bearer {bearer}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError as err:
        # Only 401 means "who are you?": any signed-in user may read this route, so a 403 is
        # something else (e.g. the Host-header guard) and 404 is a server without auth; the
        # store checks that follow report those with their own messages.
        if err.code != 401:
            return
    except OSError:
        return
    who = user if user is not None and password is not None else "anonymous"
    hint = "" if who != "anonymous" else f" ({CREDENTIALS_HINT})"
    raise AuthError(f"authentication failed for {who} at {uri}{hint}")
