"""The team stack of docker-compose.yml, run natively: PostgreSQL, an S3 server, ``mlflow server``.

No Docker engine runs on the dev and CI machines, so each service runs as a local process on
127.0.0.1 with a free port and a temp folder:

- PostgreSQL from the Debian packages (``initdb`` / ``pg_ctl``; as the ``postgres`` user when
  this process is root, which PostgreSQL refuses to run as), then ``docker/postgres-init.sh``;
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
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stability.tracking.server import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
SERVER_SCRIPT = ROOT / "docker" / "mlflow-server.sh"
PG_INIT_SCRIPT = ROOT / "docker" / "postgres-init.sh"
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


def _as_postgres_user() -> list[str]:
    # PostgreSQL refuses to run as root; as any other user it runs as that user.
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)), None)
    assert found, f"{name} missing: apt-get install postgresql (make setup-dev)"
    return str(found)


@dataclass
class Postgres:
    """A PostgreSQL cluster in a temp folder, listening on 127.0.0.1:``port``."""

    root: Path
    port: int
    user: str
    password: str

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.root / "data"

    def url(self, db: str) -> str:
        """SQLAlchemy URL of database ``db``."""
        return f"postgresql+psycopg2://{self.user}:{self.password}@127.0.0.1:{self.port}/{db}"

    def version(self) -> str:
        """``SELECT version()``, e.g. ``PostgreSQL 15.18 (Debian 15.18-0+deb12u1) ...``."""
        return str(self.query("postgres", "SELECT version()")[0][0])

    def query(self, db: str, sql: str) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` in database ``db`` (SQLAlchemy over TCP, with the password)."""
        import sqlalchemy

        engine = sqlalchemy.create_engine(self.url(db))
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.execute(sqlalchemy.text(sql))]
        finally:
            engine.dispose()

    def dump(self, db: str) -> str:
        """``pg_dump`` of database ``db``: every row, as SQL text."""
        done = subprocess.run([*_as_postgres_user(), _pg_bin("pg_dump"), "-h",
                               str(self.root / "sock"), "-p", str(self.port), "-U", self.user,
                               db], capture_output=True, text=True, timeout=120, check=True)
        return done.stdout

    def stop(self) -> None:
        """Fast shutdown, then remove the folder."""
        subprocess.run([*_as_postgres_user(), _pg_bin("pg_ctl"), "-D", str(self.data), "-m",
                        "fast", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres(user: str, password: str, db: str, auth_db: str) -> Postgres:
    """initdb + pg_ctl start on a free port, then create ``db`` and (the init script) ``auth_db``.

    Local-socket connections are trusted (setup only); TCP needs the password, as in compose.
    """
    root = Path(tempfile.mkdtemp(prefix="stability-pg-"))  # not under pytest's 0700 tmp tree
    (root / "sock").mkdir()
    pwfile = root / "pw"
    pwfile.write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        for p in (root / "sock", pwfile):
            shutil.chown(p, "postgres", "postgres")
    pg = Postgres(root, free_port(), user, password)
    as_pg = _as_postgres_user()
    run = {"capture_output": True, "text": True, "timeout": 120, "check": True}
    subprocess.run([*as_pg, _pg_bin("initdb"), "-D", str(pg.data), "-U", user,
                    f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
                    "-E", "UTF8", "--no-locale", "--no-sync"], **run)
    # fsync off: a throwaway cluster, the tests never crash the machine
    opts = (f"-p {pg.port} -k {root / 'sock'} -c listen_addresses=127.0.0.1 -c fsync=off")
    subprocess.run([*as_pg, _pg_bin("pg_ctl"), "-D", str(pg.data), "-l", str(root / "log"),
                    "-o", opts, "-w", "-t", "60", "start"], **run)
    local = os.environ | {"PGHOST": str(root / "sock"), "PGPORT": str(pg.port)}
    subprocess.run([*as_pg, _pg_bin("createdb"), "-U", user, db], env=local, **run)
    subprocess.run([*as_pg, "sh", str(PG_INIT_SCRIPT)], env=local | {
        "POSTGRES_USER": user, "POSTGRES_DB": db, "MLFLOW_AUTH_DB": auth_db}, **run)
    return pg


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


@contextlib.contextmanager
def signed_in_proxy(target: str, user: str, password: str) -> Iterator[str]:
    """A loopback HTTP proxy to ``target`` that signs every request in as ``user``.

    Headless Chromium cannot answer the basic-auth prompt, and credentials in the page URL
    are not sent with the UI's own API calls; a person's browser, once signed in, sends the
    ``Authorization`` header with every request to the origin, which is what this adds.

    Yields:
        The proxy's base URL.
    """
    import base64
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import requests

    token = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    hop = {"connection", "keep-alive", "transfer-encoding", "content-encoding",
           "content-length", "host"}

    class Forward(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
            r = requests.request(self.command, target + self.path, headers=headers | {
                "Authorization": token}, data=self.rfile.read(length) if length else None,
                timeout=60)
            self.send_response(r.status_code)
            for k, v in r.headers.items():
                if k.lower() not in hop:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)

        do_GET = do_POST = do_PATCH = do_DELETE = _forward

        def log_message(self, *args: Any) -> None:  # quiet: the test reports what matters
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
