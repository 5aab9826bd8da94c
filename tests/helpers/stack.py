"""The team stack of docker-compose.yml, run natively: PostgreSQL, an S3 server, ``mlflow server``.

No Docker engine runs on the dev and CI machines, so each service runs as a local process on
127.0.0.1 with a free port and a temp folder:

- PostgreSQL from the Debian packages (tests/helpers/postgres.py: ``initdb`` / ``pg_ctl`` as
  the ``postgres`` user when this process is root), then ``docker/postgres-init.sh``;
- moto's S3 server (MinIO's stand-in) with the artifact bucket created, as ``minio-init`` does;
- ``docker/mlflow-server.sh``, the compose service's own command line, with the environment of
  the ``mlflow`` service read from docker-compose.yml and interpolated from an ``.env`` built
  from the names in ``.env.example`` (random secrets); only ``postgres:5432`` and
  ``minio:9000`` are replaced by the loopback servers. So the suite runs the stack users start.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stability.tracking.server import free_port
from tests.helpers.postgres import Postgres, start_postgres

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
SERVER_SCRIPT = ROOT / "docker" / "mlflow-server.sh"
ADMIN = "admin"  # the user docker/mlflow-server.sh bootstraps
# ${VAR}, ${VAR:?message}, ${VAR:-default} as Compose interpolates them
VAR_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?([?+-])([^}]*))?\}")


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM (then SIGKILL) a process started with ``start_new_session`` and its children."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
            return


def read_env_example() -> dict[str, str]:
    """KEY -> value of .env.example (inline ``  # comment`` stripped, as Compose does)."""
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = re.split(r"\s+#", value, maxsplit=1)[0].strip()
    return out


def make_dotenv() -> dict[str, str]:
    """An ``.env`` for the test stack: every name of .env.example, each secret random."""
    env = read_env_example()
    for key in env:
        if re.search(r"PASSWORD|SECRET", key):
            env[key] = "t" + secrets.token_hex(12)  # URL-safe, >= 12 characters
    return env


def interpolate(value: str, dotenv: dict[str, str]) -> str:
    """Compose's ``${VAR...}`` interpolation of one value from ``dotenv``."""
    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if name in dotenv and dotenv[name] != "":
            return dotenv[name]
        if op == "-":
            return arg
        raise KeyError(f"{name} unset ({arg or 'no default'})")

    return VAR_REF.sub(one, value)


def compose_server_env(dotenv: dict[str, str], postgres: str, s3: str) -> dict[str, str]:
    """The ``mlflow`` service's environment from docker-compose.yml, for loopback servers.

    Args:
        dotenv: values for the ``${VAR}`` references.
        postgres: ``host:port`` replacing the compose service ``postgres:5432``.
        s3: ``http://host:port`` replacing ``http://minio:9000``.
    """
    service = yaml.safe_load(COMPOSE.read_text())["services"]["mlflow"]
    assert service["command"][-1] == "/mlflow-server.sh", "compose no longer runs the script"
    out = {}
    for key, raw in service["environment"].items():
        value = interpolate(str(raw), dotenv)
        value = value.replace("@postgres:5432/", f"@{postgres}/")
        out[key] = value.replace("http://minio:9000", s3)
    return out


@dataclass
class S3Server:
    """moto's S3 server on 127.0.0.1:``port``."""

    endpoint: str
    process: subprocess.Popen
    key: str
    secret: str

    def client(self) -> Any:
        """A boto3 S3 client with the server's key (the MLflow server's, not the nodes')."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.key,
                            aws_secret_access_key=self.secret, region_name="us-east-1")

    def keys(self, bucket: str) -> list[str]:
        """Every object key in ``bucket``."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def stop(self) -> None:
        """Stop the server."""
        _stop_group(self.process)


def start_s3(root: Path, bucket: str, key: str, secret: str, timeout_s: float = 60) -> S3Server:
    """Start moto's S3 server and create ``bucket`` (what ``minio-init`` does for MinIO)."""
    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=(root / "s3.log").open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    s3 = S3Server(f"http://127.0.0.1:{port}", proc, key, secret)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            s3.client().create_bucket(Bucket=bucket)
            return s3
        except Exception:  # not listening yet (botocore's connection errors vary)
            if proc.poll() is not None or time.monotonic() > deadline:
                s3.stop()
                log = (root / "s3.log").read_text()
                raise RuntimeError(f"S3 server did not start:\n{log}") from None
            time.sleep(0.25)


@dataclass
class TeamStack:
    """The running stack; ``uri`` is what training nodes get as ``MLFLOW_TRACKING_URI``."""

    uri: str
    dotenv: dict[str, str]
    postgres: Postgres
    s3: S3Server
    server: subprocess.Popen
    root: Path
    users: dict[str, str] = field(default_factory=dict)

    @property
    def admin_password(self) -> str:
        """The admin password of the test ``.env``."""
        return self.dotenv["MLFLOW_AUTH_ADMIN_PASSWORD"]

    @property
    def bucket(self) -> str:
        """The artifact bucket."""
        return self.dotenv["MLFLOW_BUCKET"]

    def sql(self, query: str) -> list[tuple[Any, ...]]:
        """Rows of ``query`` in the MLflow backend-store database."""
        return self.postgres.query(self.dotenv["POSTGRES_DB"], query)

    def node_env(self, user: str | None, password: str | None = None) -> dict[str, str]:
        """A training node's environment: the URI (and credentials), no S3 or AWS setting.

        Args:
            user: MLflow user to sign in as (None: anonymous).
            password: its password (default: the one it was created with).
        """
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AWS_", "MLFLOW_", "BOTO"))}
        # no shared AWS config either: the node must not find S3 credentials anywhere
        env |= {"AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                "MLFLOW_TRACKING_URI": self.uri}
        if user is not None:
            pw = password if password is not None else (
                self.admin_password if user == ADMIN else self.users[user])
            env |= {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": pw}
        return env

    def api(self, method: str, path: str, body: dict[str, Any] | None = None,
            auth: tuple[str, str] | None = None) -> tuple[int, Any]:
        """One REST call (``auth`` = (user, password), default admin); (status, JSON body)."""
        import requests

        auth = auth or (ADMIN, self.admin_password)
        r = requests.request(method, f"{self.uri}{path}", json=body, auth=auth, timeout=30)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    def create_user(self, name: str) -> str:
        """Create MLflow user ``name`` (as admin) with a random password; returns it."""
        password = "u" + secrets.token_hex(10)
        status, body = self.api("POST", "/api/2.0/mlflow/users/create",
                                {"username": name, "password": password})
        assert status == 200, body
        self.users[name] = password
        return password

    def log(self) -> str:
        """The server's log so far (for failure messages)."""
        return (self.root / "server.log").read_text()[-4000:]

    def stop(self) -> None:
        """Stop MLflow, the S3 server and PostgreSQL."""
        _stop_group(self.server)
        self.s3.stop()
        self.postgres.stop()


def start_team_stack(root: Path, timeout_s: float = 180) -> TeamStack:
    """PostgreSQL, S3 and ``docker/mlflow-server.sh`` (basic-auth) on loopback ports.

    Args:
        root: folder for the S3 and MLflow logs (PostgreSQL gets its own temp folder).
        timeout_s: how long to wait for the server's ``/health``.
    """
    dotenv = make_dotenv()
    pg = start_postgres(dotenv["POSTGRES_USER"], dotenv["POSTGRES_PASSWORD"],
                        dotenv["POSTGRES_DB"], dotenv["MLFLOW_AUTH_DB"])
    try:
        s3 = start_s3(root, dotenv["MLFLOW_BUCKET"], dotenv["MLFLOW_S3_ACCESS_KEY"],
                      dotenv["MLFLOW_S3_SECRET_KEY"])
    except BaseException:
        pg.stop()
        raise
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
    env = base | compose_server_env(dotenv, f"127.0.0.1:{pg.port}", s3.endpoint) | {
        # the container's PATH has `mlflow`; here it is this interpreter's
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MLFLOW_HOST": "127.0.0.1", "MLFLOW_PORT": str(port), "TMPDIR": str(root)}
    proc = subprocess.Popen(["sh", str(SERVER_SCRIPT)], env=env, start_new_session=True,
                            stdout=(root / "server.log").open("w"), stderr=subprocess.STDOUT)
    stack = TeamStack(f"http://127.0.0.1:{port}", dotenv, pg, s3, proc, root)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{stack.uri}/health", timeout=2) as r:
                if r.status == 200:
                    return stack
        except OSError:
            time.sleep(0.5)
    log = stack.log()
    stack.stop()
    raise RuntimeError(f"mlflow server did not start:\n{log}")
