"""Start and stop a real local ``mlflow server`` (tests, benchmarks, ``make ui``).

One uvicorn worker: MLflow 3.x with its default 4 workers adds ~40 ms to every
keep-alive request on these machines. Server-side job execution is off: it would start a
dozen consumer processes that this project never uses.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from stability.tracking.contract import UI_TRAINING_VIEW

log = logging.getLogger(__name__)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class MlflowServer:
    """A running ``mlflow server`` subprocess; ``uri`` is its tracking URI."""

    uri: str
    process: subprocess.Popen
    root: Path

    def stop(self) -> None:
        """Terminate the server's whole process group (mlflow, uvicorn) and wait for it."""
        # `mlflow server` runs uvicorn as a child: signalling only the parent orphans it.
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue


# `mlflow server` needs the full mlflow package (Flask, SQLAlchemy): a venv with only
# mlflow-skinny (docs/cluster.md, a worker install) names another venv's python here.
SERVER_PYTHON_VAR = "STABILITY_SERVER_PYTHON"


def server_command(port: int, extra: list[str] | None = None, workers: int = 1) -> list[str]:
    """``mlflow server`` on 127.0.0.1 with one worker (``workers``: a benchmark's other count).

    Run by this interpreter, or by ``$STABILITY_SERVER_PYTHON`` when set. The store is not on
    the command line (anyone on the machine reads a command line: ``ps``): ``server_env``
    passes it as ``MLFLOW_BACKEND_STORE_URI``, which ``mlflow server`` reads.
    """
    python = os.environ.get(SERVER_PYTHON_VAR) or sys.executable
    return [python, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(workers), *(extra or [])]


# MLflow's SQL store takes a second pooled connection inside most requests (a nested session:
# create_run looks the experiment up, log_batch logs params and metrics in their own), and the
# server runs up to 40 requests at once (anyio's thread limit). With SQLAlchemy's default pool
# (5 + 10 overflow) 16 or more concurrent writers each hold one connection and wait for a
# second one until the pool times out (30 s): 32 simulated writers logged nothing for the whole
# window (docs/CHANGELOG-performance.md, 2026-12-01, "the earlier capacity benchmark").
# 5 + 40 > 40 cannot deadlock; a value the user exported wins. docker/mlflow-server.sh sets the
# same for the team server.
POOL_ENV = {"MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW": "40"}


STORE_VAR = "MLFLOW_BACKEND_STORE_URI"  # ``mlflow server --backend-store-uri``'s variable


def server_env(store_uri: str) -> dict[str, str]:
    """The server's environment: its store (``STORE_VAR``, never the command line), no client
    URI, MLflow's job runner off, a pool that cannot deadlock (``POOL_ENV``).

    The job runner (huey consumers for GenAI jobs) starts ~10 busy processes we never use.
    """
    return POOL_ENV | dict(os.environ) | {"MLFLOW_TRACKING_URI": "", STORE_VAR: store_uri,
                                           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def prepare_store(store_uri: str) -> None:
    """Create a SQLite store's schema under the store lock before a server opens it.

    ``mlflow server`` migrates a new database itself, outside our lock: a sweep or report
    opening the same new file at that moment raced it ("duplicate column name", "index ...
    already exists"). Created here first, under the lock every other opener takes
    (``uri.client``), the server finds the schema complete. Other stores: nothing to do.
    """
    from stability.tracking.uri import client, sqlite_path

    if sqlite_path(store_uri) is not None:
        client(store_uri)


UI_LINKS = 10  # experiments listed under the banner, the most recently updated first


def ui_banner(store_uri: str, port: int) -> str:
    """Where the UI of ``store_uri`` will answer (credentials removed), and each study's runs.

    MLflow's start page is its GenAI welcome page, and an experiment's plain link opens a GenAI
    overview in a browser that never chose otherwise; the links printed here open each
    experiment's runs table (``contract.UI_TRAINING_VIEW``), the page a study is read on. An
    empty store says what to run first.
    """
    from stability.tracking.uri import redact_uri

    head = f"MLflow UI for {redact_uri(store_uri)}: http://127.0.0.1:{port}"
    try:
        found = studies(store_uri)
    except Exception:  # noqa: BLE001 - the banner never stops the UI; the server says more
        return head
    if not found:
        return (f"{head}\nno study in this store yet: run one first (make run, or stability "
                "sweep -m), then open its runs from the link the sweep prints")
    lines = [f"  {name}: http://127.0.0.1:{port}/#/experiments/{eid}{UI_TRAINING_VIEW}"
             for eid, name in found[:UI_LINKS]]
    more = [f"  ... and {len(found) - UI_LINKS} more"] if len(found) > UI_LINKS else []
    return "\n".join([head, "open a study's runs (not MLflow's GenAI start page):", *lines,
                      *more])


def studies(store_uri: str) -> list[tuple[str, str]]:
    """``(experiment id, name)`` of the store's experiments that hold runs, latest first."""
    from stability.tracking.uri import client

    c = client(store_uri)
    out = []
    for e in sorted(c.search_experiments(), key=lambda e: -(e.last_update_time or 0)):
        if c.search_runs([e.experiment_id], max_results=1):
            out.append((e.experiment_id, e.name))
    return out


def serve_ui(store_uri: str, port: int = 5000) -> None:
    """Replace this process with the MLflow UI on ``store_uri`` (``make ui``; Ctrl-C stops it).

    A SQLite store's artifacts are where its experiments say (``mlruns/`` beside the file), so
    no artifact flags are needed. The caller says ``ui_banner`` first.
    """
    prepare_store(store_uri)
    cmd = server_command(port)
    os.execvpe(cmd[0], cmd, server_env(store_uri))


def main(argv: list[str] | None = None) -> None:
    """``python -m stability.tracking.server [--store URI] [--port N]``: the MLflow UI."""
    import argparse

    from stability.tracking.uri import default_store_uri

    p = argparse.ArgumentParser(description=serve_ui.__doc__.split("\n")[0])
    p.add_argument("--store", default=None, help="tracking store (default: ./mlflow.db)")
    p.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 (default 5000)")
    args = p.parse_args(argv)
    store = args.store or default_store_uri()
    prepare_store(store)
    # ``make ui``'s only line: the log, to stdout, as the ``stability ui`` command prints it
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    log.info(ui_banner(store, args.port))
    serve_ui(store, args.port)


def start_server(
    root: str | Path, port: int | None = None, timeout_s: float = 90.0,
    store_uri: str | None = None, workers: int = 1,
) -> MlflowServer:
    """Start ``mlflow server`` on 127.0.0.1: SQLite store, proxied artifacts, under ``root``.

    Args:
        root: directory for ``mlflow.db``, ``artifacts/`` and ``server.log``.
        port: TCP port (a free one by default).
        timeout_s: how long to wait for ``/health``.
        store_uri: another backend store (e.g. PostgreSQL's SQLAlchemy URL) instead of
            ``root/mlflow.db``; artifacts stay under ``root``.
        workers: uvicorn workers (one everywhere but in the scale benchmark's comparison).

    Returns:
        The running server.

    Raises:
        RuntimeError: the server did not become healthy in time (its log is quoted).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log_path = root / "server.log"
    store_uri = store_uri or f"sqlite:///{root / 'mlflow.db'}"
    prepare_store(store_uri)
    cmd = server_command(port, ["--artifacts-destination", str(root / "artifacts"),
                                "--serve-artifacts"], workers)
    proc = subprocess.Popen(cmd, stdout=log_path.open("w"), stderr=subprocess.STDOUT,
                            env=server_env(store_uri), start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=1) as r:
                if r.status == 200:
                    return MlflowServer(uri, proc, root)
        except OSError:
            time.sleep(0.25)
    MlflowServer(uri, proc, root).stop()
    raise RuntimeError(f"mlflow server did not start:\n{log_path.read_text()[-3000:]}")


if __name__ == "__main__":
    main()
