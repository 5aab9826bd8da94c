"""The ``stability`` command (``pip install .``): the jobs of ``experiments/``, from any folder.

    stability sweep [-m] [-v] [key=value ...]  one configuration, or the grid with -m (-v: epochs)
    stability report [key=value ...]         review report of the latest sweep
    stability ui [--port 5000]               the MLflow UI on this folder's store
    stability sync [DIR ...] [--uri URI]     upload run folders kept while the server was away

The configs ship inside the package (Hydra search path ``pkg://stability.conf``); add your own
with ``--config-dir DIR`` (e.g. ``DIR/task/my_task.yaml``). The current folder is put on the
import path, as ``python -m`` does, so ``_target_: my_task.MyTask`` finds ``./my_task.py``. The
embedded store is ``./mlflow.db`` of the folder the command runs in.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import hydra
from omegaconf import DictConfig, OmegaConf

CONFIGS = "pkg://stability.conf"
COMMANDS = ("sweep", "report", "ui", "sync")


@hydra.main(version_base="1.3", config_path=CONFIGS, config_name="config")
def sweep(cfg: DictConfig) -> float:
    """``stability sweep``: one run, or with ``-m`` the study grid (as experiments/sweep.py)."""
    from stability.sweep.job import hydra_job

    return hydra_job(cfg)


@hydra.main(version_base="1.3", config_path=CONFIGS, config_name="report")
def report(cfg: DictConfig) -> None:
    """``stability report``: the review report, logged to MLflow (as experiments/report.py)."""
    from stability.report.entry import run_report

    run_report(OmegaConf.to_container(cfg, resolve=True))


def ui(args: Sequence[str]) -> None:
    """``stability ui``: the MLflow UI on this folder's store (or ``$MLFLOW_TRACKING_URI``)."""
    import argparse

    from stability.tracking.server import serve_ui
    from stability.tracking.uri import resolve_tracking_uri

    parser = argparse.ArgumentParser(prog="stability ui")
    parser.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1")
    opts = parser.parse_args(args)
    serve_ui(resolve_tracking_uri(None), opts.port)


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the console script: dispatch on the first argument."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[1])
        raise SystemExit(0 if args else 2)
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        _fail(f"unknown command {command!r}: allowed values are {' | '.join(COMMANDS)}")
    # User tasks live next to where the command runs (``_target_: my_task.MyTask``); the
    # environment variable carries that to launcher worker processes (joblib, submitit).
    sys.path.insert(0, os.getcwd())
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(),
                                                            os.environ.get("PYTHONPATH")]))
    if command in ("sweep", "report"):
        if command == "sweep":
            from stability.sweep.job import verbose_argv

            rest = verbose_argv(rest)
        sys.argv = [f"stability-{command}", *rest]  # Hydra parses sys.argv
        (sweep if command == "sweep" else report)()
    elif command == "ui":
        ui(rest)
    else:
        from stability.tracking.sync import main as sync

        raise SystemExit(sync(rest))


if __name__ == "__main__":
    main()
