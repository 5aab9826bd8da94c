"""Importing MLflow in a training worker without the data-science stack it does not use.

Any ``import mlflow.<anything>`` runs ``mlflow/__init__.py``, which imports ``mlflow.data``,
``mlflow.models`` and ``mlflow.genai``; those import pandas (and through it pyarrow) and
scipy whenever they are installed, which the full ``mlflow`` package makes sure of: +123 MiB
of resident memory in every worker (docs/performance.md, "Memory of a tracked run"). A worker
that logs to a tracking server needs none of them: params, metrics, tags and artifacts go
over REST. MLflow itself supports running without them (``mlflow-skinny`` has neither; each
of those imports is guarded with "`pandas` is not required for `mlflow-skinny`"), so the
worker imports MLflow with them hidden and gets exactly the MLflow of a skinny install.

Scope: one process's first MLflow import, only for an ``http(s)://`` store, and only
modules not imported yet (a process that already loaded pandas, like the report, gets MLflow
in full). The embedded SQLite store is left as it is. In a process whose MLflow was imported
lean, model logging stays unavailable (``mlflow.models.infer_signature``, ``mlflow.pyfunc``):
that is the report's job, which runs in its own process.

MLflow's own log lines (``INFO mlflow.store.db.utils: Creating initial MLflow database
tables...``) go where ours go (``route_mlflow_logs``): into the Hydra job's log file, on the
terminal only from WARNING up (``-v`` shows INFO), unless ``MLFLOW_LOGGING_LEVEL`` is set.
"""

from __future__ import annotations

import logging
import os
import sys

# What MLflow imports only because it is installed; none of it is on a worker's REST path.
HIDDEN = ("pandas", "pyarrow", "scipy")


def import_mlflow(server: bool) -> None:
    """Import MLflow for this process; for a tracking server, without ``HIDDEN``.

    Call before the process's first MLflow import; a later call (or one after anything else
    imported MLflow) does nothing.

    Args:
        server: the run logs to an ``http(s)://`` tracking server (else MLflow is imported
            as usual: the database stores are not part of the skinny MLflow).
    """
    if "mlflow" in sys.modules:
        route_mlflow_logs()
        return
    if not server:
        import mlflow.tracking  # noqa: F401
        route_mlflow_logs()
        return
    # A None entry makes `import pandas` raise ModuleNotFoundError, which MLflow catches as
    # in a skinny install. Only for the duration of this import: afterwards pandas imports
    # normally (a user's task may need it), only MLflow's optional parts stay off.
    hidden = [name for name in HIDDEN if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        import mlflow.tracking  # noqa: F401
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
    route_mlflow_logs()


def route_mlflow_logs() -> None:
    """MLflow's loggers through the process's own handlers instead of their stderr handler.

    MLflow gives its ``mlflow`` logger a handler to stderr at INFO and stops propagation, so
    its INFO lines reach the user's terminal past Hydra's logging. Dropped here, the records
    propagate to the root logger: in a Hydra job its file handler takes INFO and its console
    handler only WARNING (``hydra.job_logging`` in ``conf/``); without a log file only WARNING
    and up pass. Called on every ``import_mlflow``. A user who sets
    ``MLFLOW_LOGGING_LEVEL`` keeps MLflow's own handling.
    """
    if os.environ.get("MLFLOW_LOGGING_LEVEL"):
        return
    logger = logging.getLogger("mlflow")
    logger.handlers = []
    logger.propagate = True
    # No log file to take INFO (a sweeper's own process): the terminal gets WARNING up only.
    to_file = any(isinstance(h, logging.FileHandler) for h in logging.getLogger().handlers)
    logger.setLevel(logging.INFO if to_file else logging.WARNING)
