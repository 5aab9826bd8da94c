"""The ``stability`` command (``pip install .``): the jobs of ``experiments/``, from any folder.

    stability sweep [-m] [-v] [key=value ...]  one configuration, or the grid with -m (-v: epochs)
    stability report [-v] [key=value ...]    review report of the latest sweep (-v: INFO lines)
    stability check [key=value ...]          one-minute probes of the training mechanics
    stability ui [--port 5000]               the MLflow UI on this folder's store
    stability sync [DIR ...] [--uri URI]     upload run folders kept while the server was away

The configs ship inside the package (Hydra search path ``pkg://stability.conf``); add your own
with ``--config-dir DIR`` (e.g. ``DIR/task/my_task.yaml``). The current folder is put on the
import path, as ``python -m`` does, so ``_target_: my_task.MyTask`` finds ``./my_task.py``. The
embedded store is ``./mlflow.db`` of the folder the command runs in.

This module is the project's one edge: the library raises and logs, and only this module prints
to the terminal and chooses exit statuses (``experiments/*.py`` are shims of it):

- 0: done; 1: the environment failed (an unreachable store, a full disk, a pending sync);
- 2: a user mistake, one line naming the key and its allowed values, no traceback;
- 3: ``report``: the sweep exists but none of its runs finished (an answer, not a mistake);
- 128 + signal: a sweep stopped by Ctrl-C (130) or SIGTERM (143), after closing its runs.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, NoReturn

import hydra
from omegaconf import DictConfig

from stability.core.config import ConfigError
from stability.core.quick_exit import skip_exit_gc
from stability.core.signals import Terminated
from stability.sweep.errors import SweepError
from stability.sweep.sweeper import StabilitySweeper
from stability.tracking.uri import TrackingError

CONFIGS = "pkg://stability.conf"
COMMANDS = ("sweep", "report", "check", "ui", "sync")
VERBOSE_FLAGS = ("-v", "--verbose")  # on the command line: hydra.sweeper.verbose=true


def fail(line: str, status: int) -> NoReturn:
    """End the process: ``line`` on stderr, exit ``status`` (no traceback)."""
    print(line, file=sys.stderr, flush=True)
    raise SystemExit(status)


@contextmanager
def exits() -> Iterator[None]:
    """Turn the library's user-facing exceptions into one ``error:`` line and an exit status."""
    try:
        yield
    except SweepError as err:
        fail(f"error: {err}", err.exit_code)
    except (ConfigError, TrackingError) as err:
        fail(f"error: {err}", 2)


@contextmanager
def signal_exits() -> Iterator[None]:
    """A command stopped by Ctrl-C or SIGTERM exits with 128 + the signal, without a traceback.

    Only where the process is the command (the sweeper, a single run): a sweep's job must
    hand the stop to the sweeper as its own exception, which ends the parent run KILLED.
    """
    try:
        yield
    except KeyboardInterrupt:
        raise SystemExit(128 + signal.SIGINT) from None
    except Terminated:
        raise SystemExit(128 + signal.SIGTERM) from None


def say_sweep(message: str) -> None:
    """A line of the sweeper (``[sweep] ...``), on stdout (above the live area, if any)."""
    print(f"[sweep] {message}", flush=True)


class EdgeSweeper(StabilitySweeper):
    """The sweeper Hydra runs (``hydra_plugins/stability_sweeper``): the library's sweeper,
    its lines printed and its outcome turned into an exit status."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.say = say_sweep

    def sweep(self, arguments: list[str]) -> Any:
        """``StabilitySweeper.sweep``; a stopped sweep exits with 128 + the signal."""
        with signal_exits(), exits():
            return super().sweep(arguments)


CONSOLE_INFO = "hydra.job_logging.handlers.console.level=INFO"  # -v: our INFO lines shown too


def verbose_argv(argv: Sequence[str], sweep: bool = True) -> list[str]:
    """``argv`` with ``-v`` / ``--verbose`` turned into the overrides Hydra understands.

    The sweep's ``-v`` prints each run's epochs (``hydra.sweeper.verbose``); the report's shows
    its INFO log lines on the terminal too (``CONSOLE_INFO``; by default they go to its log
    file only, ``conf/report.yaml``).
    """
    flag = "hydra.sweeper.verbose=true" if sweep else CONSOLE_INFO
    return [(flag if a in VERBOSE_FLAGS else a) for a in argv]


def sweep_job(cfg: DictConfig) -> float:
    """The Hydra task of ``stability sweep`` and ``experiments/sweep.py``: one run.

    Returns:
        The best validation loss (inf if the run did not finish), for sweepers.
    """
    from stability.sweep.job import hydra_job, in_multirun

    # In a sweep (a launcher's worker, or the sweeper's process) a stop stays an exception.
    with nullcontext() if in_multirun() else signal_exits(), exits():
        return hydra_job(cfg, say=print)


def report_job(cfg: DictConfig) -> None:
    """The Hydra task of ``stability report`` and ``experiments/report.py``.

    Exit statuses: 0 report written; 2 a user mistake (bad key or value, unknown experiment or
    sweep, an experiment with no sweep, tracking server unreachable) or any other failure (one
    line naming it); 3 the sweep exists but no
    training run finished (every seed diverged or failed): nothing to recommend, nothing written.
    """
    from omegaconf import OmegaConf

    from stability.report.options import to_report_config
    from stability.report.pipeline import NothingToReport, build_report

    t0 = time.perf_counter()
    # MLflow draws a progress bar for each artifact it downloads (a run's steps.csv, ...): dozens
    # of them around the report's few lines. A user's own setting of the variable wins.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        out = build_report(to_report_config(OmegaConf.to_container(cfg, resolve=True)))
    except NothingToReport as err:  # not a mistake, an answer: one line, its own exit code
        fail(f"answer: {err}", 3)
    except (ConfigError, TrackingError) as err:  # a user mistake: one line, no traceback
        fail(f"error: {err}", 2)
    except Exception as err:  # anything else the runs hold: one line too (the log has the rest)
        import logging

        logging.getLogger(__name__).debug("the report failed", exc_info=True)
        fail(f"error: the report failed: {type(err).__name__}: {err} (docs/TRACKING.md lists "
             "what a training run must record: contract.Rebuild)", 2)
    created = "new" if out.model_created else "existing"
    if out.answer:
        print(out.answer + "\n")
    print(f"chosen {out.winner_label} ({out.winner}) of sweep {out.sweep_id}\n"
          f"report: {out.folder / 'report.md'}  MLflow report run: {out.report_run_id}"
          + (f"  model version: {out.model_version} ({created})" if out.model_version else ""))
    print(f"report finished in {time.perf_counter() - t0:.1f} s")


def check_job(cfg: DictConfig) -> None:
    """The Hydra task of ``stability check`` and ``experiments/check.py`` (docs/check.md).

    Prints the table and the JSON path; exits 0 when every probe passed, warned, was n/a or
    accepted, 1 on a fail, 2 on bad input (one line naming the key), 3 when the code under
    check raised (one line naming where; the JSON has the probes that ran).
    """
    from pathlib import Path

    from omegaconf import OmegaConf

    from stability.check.raised import LoopRaised
    from stability.check.result import RAISED, exit_status, table, write_json
    from stability.check.run import CheckConfig, run_check
    from stability.core.config import to_run_config

    raw = OmegaConf.to_container(cfg, resolve=True)
    with exits():
        check = CheckConfig.from_section(dict(raw.pop("check", None) or {}))
        run_cfg = to_run_config(raw)
        try:
            results, seconds = run_check(run_cfg, check)
            raised = None
        except LoopRaised as err:
            results, seconds, raised = err.results, math.nan, err
    meta = {"task": raw["task"]["_target_"], "loop": check.loop, "seconds": round(seconds, 2)}
    if raised is not None:
        meta |= {"exit_status": RAISED, "error": str(raised)}
    if results:
        print(table(results))
    path = write_json(results, Path(check.output), **meta)
    if raised is not None:
        fail(f"error: {raised} (the {len(results)} probes that ran: {path})", RAISED)
    status = exit_status(results)
    print(f"check: {'FAIL' if status else 'ok'} ({sum(r.status.value == 'fail' for r in results)}"
          f" failed of {len(results)}) in {seconds:.1f} s; results: {path}")
    if run_cfg.tracking.enabled:
        _track_check(run_cfg, check, results, path, seconds)
    raise SystemExit(status)


def _track_check(cfg: Any, check: Any, results: Any, path: Any, seconds: float) -> None:
    # The check's verdict stands without MLflow: a store that cannot take the run is one line
    # on stderr, and the exit status stays the probes'.
    import logging

    from stability.check.track import record_check
    from stability.tracking.credentials import redact_uri

    try:
        run_id = record_check(cfg, check.loop, check.accum_steps, results, path, seconds)
    except Exception as err:
        logging.getLogger(__name__).debug("the check run was not recorded", exc_info=True)
        print(f"check: not recorded in MLflow ({type(err).__name__}: "
              f"{redact_uri(str(err))[:300]}); the JSON has every result", file=sys.stderr)
        return
    print(f"MLflow check run: {run_id}")


CHECK_QUIET = ("hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=none",
               "hydra/hydra_logging=none")  # the check writes only its JSON: no job folder


# Hydra's flags that take a value (hydra/_internal/utils.py get_args_parser)
HYDRA_VALUE_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                     "--cfg", "-c", "--package", "-p", "--experimental-rerun")


def check_argv(args: Sequence[str]) -> list[str]:
    """``args`` as Hydra's parser takes them: its flags first, then every ``key=value`` of the
    user's as one run, then the check's own overrides (``CHECK_QUIET``).

    Hydra reads its overrides as one run of positional arguments; an override after a flag
    (``task=x --config-dir . seed=1``) would be "unrecognized arguments". Order among the
    overrides is kept (a later one wins, as in Hydra).
    """
    flags: list[str] = []
    overrides: list[str] = []
    args = list(args)
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-"):
            take = 2 if a in HYDRA_VALUE_FLAGS and i + 1 < len(args) else 1
            flags += args[i : i + take]
            i += take
            continue
        overrides.append(a)
        i += 1
    return [*flags, *overrides, *CHECK_QUIET]


def run_script(main: Callable[[], Any]) -> None:
    """Run an ``experiments/`` script's Hydra ``main`` (``-v`` understood, as by ``stability``)."""
    skip_exit_gc()
    name = os.path.basename(sys.argv[0])
    sys.argv = verbose_argv(sys.argv, sweep="report" not in name)
    command = next((c for c in ("sweep", "report", "check") if c in name), "")
    check_groups(sys.argv[1:], command)
    main()


CONFIG_OF = {"sweep": "config", "report": "report"}  # the command's Hydra config (conf/*.yaml)


def check_groups(argv: Sequence[str], command: str = "") -> None:
    """Exit 2 with one line when ``argv`` picks a config-group option that does not exist, sets
    a key the command's config lacks ("did you mean"), or (``report``) names a SQLite store
    that does not exist: before Hydra runs, so nothing is written (no ``outputs/``, no store).
    """
    from stability.groups import bad_group_choice, misspelled_key

    line = bad_group_choice(argv)
    if line is None and command in CONFIG_OF:
        line = misspelled_key(CONFIG_OF[command], argv)
    if line is None and command == "report":
        line = missing_store(argv)
    if line is not None:
        fail(line, 2)


def missing_store(argv: Sequence[str]) -> str | None:
    """The ``error:`` line when the report's store is a SQLite file that does not exist.

    Opening it would create an empty store (and Hydra an ``outputs/`` folder) only to say that
    it holds no experiment; this names the store and what to run first instead.
    """
    from stability.tracking.uri import redact_uri, resolve_tracking_uri, sqlite_path

    given = [a.split("=", 1)[1] for a in argv if a.startswith("tracking.uri=")]
    value = given[-1] if given and given[-1] not in ("", "null") else None
    try:
        uri = resolve_tracking_uri(value)
    except ConfigError:
        return None  # the report says what is wrong with it, in its own words
    db = sqlite_path(uri)
    if db is None or db.exists():
        return None
    how = (f"tracking.uri={value}" if value else "$MLFLOW_TRACKING_URI"
           if os.environ.get("MLFLOW_TRACKING_URI") else "the embedded store of this folder")
    return (f"error: no MLflow store at {redact_uri(uri)} ({how}), so no study to report: run "
            "one first (make run, or stability sweep -m in this folder), or name the store "
            "that holds it (tracking.uri=http://host:5000 or sqlite:///path/mlflow.db)")


@hydra.main(version_base="1.3", config_path=CONFIGS, config_name="config")
def sweep(cfg: DictConfig) -> float:
    """``stability sweep``: one run, or with ``-m`` the study grid (as experiments/sweep.py)."""
    return sweep_job(cfg)


@hydra.main(version_base="1.3", config_path=CONFIGS, config_name="report")
def report(cfg: DictConfig) -> None:
    """``stability report``: the review report, logged to MLflow (as experiments/report.py)."""
    report_job(cfg)


@hydra.main(version_base="1.3", config_path=CONFIGS, config_name="check")
def check(cfg: DictConfig) -> None:
    """``stability check``: probes of the training mechanics (as experiments/check.py)."""
    check_job(cfg)


def ui(args: Sequence[str]) -> None:
    """``stability ui``: the MLflow UI on this folder's store (or ``$MLFLOW_TRACKING_URI``)."""
    import argparse

    from stability.tracking.server import prepare_store, serve_ui, ui_banner
    from stability.tracking.uri import resolve_tracking_uri

    parser = argparse.ArgumentParser(prog="stability ui")
    parser.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1")
    opts = parser.parse_args(args)
    store = resolve_tracking_uri(None)
    prepare_store(store)  # created under the store lock before the banner reads it
    print(ui_banner(store, opts.port), flush=True)
    serve_ui(store, opts.port)


def sync(argv: Sequence[str] | None = None) -> int:
    """``stability sync`` / ``python experiments/sync.py [PATH ...] [--uri URI]``.

    Syncs the paths given (default: the current folder), then ends the synced experiments'
    stale RUNNING runs; prints one line per run and a count.

    Returns:
        The exit status: 2 a journal names another store or cannot be read (nothing sent);
        1 a folder stays pending; else 0.
    """
    import argparse
    import logging

    from stability.tracking.orphans import end_stale_after_sync
    from stability.tracking.sync import (
        REQUEST_TIMEOUT_S,
        SyncError,
        check_destination,
        pending_folders,
        read_journal,
        sync_paths,
    )
    from stability.tracking.uri import configure_http, resolve_tracking_uri

    parser = argparse.ArgumentParser(prog="stability sync",
                                     description="Upload run folders kept locally while the "
                                                 "tracking server was away.")
    parser.add_argument("paths", nargs="*", default=["."], help="run folders or folders above")
    parser.add_argument("--uri", default=None, help="tracking URI (default: "
                        "$MLFLOW_TRACKING_URI, else ./mlflow.db); every journal must name it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    configure_http(REQUEST_TIMEOUT_S)
    wanted = pending_folders(args.paths)
    try:  # every journal first: one naming another store (or unreadable) stops the sync
        uri = resolve_tracking_uri(args.uri)
        for folder in wanted:
            check_destination(folder, read_journal(folder), uri)
    except (SyncError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = sync_paths(args.paths, uri)
    end_stale_after_sync(results, args.paths)
    for r in results:
        print(r.line())
    left = len(wanted) - len(results)
    print(f"synced {len(results)} of {len(wanted)} pending runs" + (f"; {left} stay pending"
                                                                     if left else ""))
    return 1 if left else 0


def sync_main() -> NoReturn:
    """``experiments/sync.py``: ``sync`` with the process's arguments, as the exit status."""
    skip_exit_gc()
    raise SystemExit(sync(sys.argv[1:]))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the console script: dispatch on the first argument."""
    skip_exit_gc()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[1])
        raise SystemExit(0 if args else 2)
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        fail(f"error: unknown command {command!r}: allowed values are {' | '.join(COMMANDS)}", 2)
    # User tasks live next to where the command runs (``_target_: my_task.MyTask``); the
    # environment variable carries that to launcher worker processes (joblib, submitit).
    sys.path.insert(0, os.getcwd())
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(),
                                                            os.environ.get("PYTHONPATH")]))
    if command in ("sweep", "report", "check"):
        check_groups(rest, command)
    if command in ("sweep", "report"):
        rest = verbose_argv(rest, sweep=command == "sweep")
        sys.argv = [f"stability-{command}", *rest]  # Hydra parses sys.argv
        (sweep if command == "sweep" else report)()
    elif command == "check":
        from stability.groups import compose_error

        line = compose_error("check", rest)  # Hydra's own is a dozen lines and exit 1
        if line is not None:
            fail(line, 2)
        sys.argv = ["stability-check", *check_argv(rest)]
        check()
    elif command == "ui":
        ui(rest)
    else:
        raise SystemExit(sync(rest))


if __name__ == "__main__":
    main()
