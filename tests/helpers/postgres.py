"""A throwaway PostgreSQL cluster on a loopback port (the team stack's backend store).

PostgreSQL from the Debian packages refuses to run as root: as root, ``initdb`` and ``pg_ctl``
run as the ``postgres`` user, in a temp folder outside pytest's 0700 tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stability.tracking.server import free_port

PG_INIT_SCRIPT = Path(__file__).resolve().parents[2] / "docker" / "postgres-init.sh"


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

    def local_env(self) -> dict[str, str]:
        """This process's environment with libpq pointed at the cluster's socket."""
        return os.environ | {"PGHOST": str(self.root / "sock"), "PGPORT": str(self.port)}

    def init_auth_db(self, db: str, auth_db: str) -> subprocess.CompletedProcess[str]:
        """Run ``docker/postgres-init.sh`` as the postgres image runs it (exit 0 checked)."""
        # On stdin: the postgres user may not traverse a checkout under a 0700 folder (a CI clone).
        return subprocess.run([*_as_postgres_user(), "sh", "-s"], input=PG_INIT_SCRIPT.read_text(),
                              env=self.local_env() | {"POSTGRES_USER": self.user,
                                                      "POSTGRES_DB": db, "MLFLOW_AUTH_DB": auth_db},
                              capture_output=True, text=True, timeout=120, check=True)

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


def start_postgres(user: str, password: str, db: str, auth_db: str,
                   fsync: bool = False) -> Postgres:
    """initdb + pg_ctl start on a free port, then create ``db`` and (the init script) ``auth_db``.

    Local-socket connections are trusted (setup only); TCP needs the password, as in compose.
    ``fsync=True`` keeps PostgreSQL's durable default (the compose image's); the tests turn it
    off.
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
    opts = (f"-p {pg.port} -k {root / 'sock'} -c listen_addresses=127.0.0.1"
            + ("" if fsync else " -c fsync=off"))
    subprocess.run([*as_pg, _pg_bin("pg_ctl"), "-D", str(pg.data), "-l", str(root / "log"),
                    "-o", opts, "-w", "-t", "60", "start"], **run)
    subprocess.run([*as_pg, _pg_bin("createdb"), "-U", user, db], env=pg.local_env(), **run)
    pg.init_auth_db(db, auth_db)
    return pg
