"""The job behind ``experiments/sweep.py``: plain mapping in, best validation loss out.

The composed Hydra config arrives as a plain dict and is converted once to a frozen
``RunConfig``. A user mistake raises (``ConfigError``, ``TrackingError``, ``errors.SweepError``),
which ``stability.cli`` turns into a one-line error and its exit status instead of a
traceback. A run that fails for any other reason is closed in MLflow as FAILED (KILLED on
Ctrl-C/SIGTERM) with its reason, and, inside a sweep, returns ``inf`` so the other jobs go on.

Inside a sweep a job prints nothing but warnings and errors on the terminal: its per-epoch lines
and its one-line result go to its log file (``<job folder>/<job name>.log``, Hydra's file
handler), and the sweeper's status area (``stability.sweep.display``) is what the terminal shows.
``hydra.sweeper.verbose=true`` (``-v`` on the command line) brings the lines back.

Every point is trained by its task's backend (``integrations.backends.of``: ``ours``, our loop,
for a task that declares no ``trainer``; Lightning, the HF Trainer or a registered one
otherwise), with the same config in and the same run folder and ``RunResult`` out; a trainer's
module is imported only then: Lightning and transformers stay optional extras.

Under ``torchrun`` (``docs/distributed.md``) every rank runs this job: rank 0 owns the MLflow
run, the other ranks train without tracking, and a failure on any rank ends the run FAILED.
"""

from __future__ import annotations

import errno
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stability.core import distributed
from stability.core.checkpoint import DiskFull
from stability.core.config import ConfigError, RunConfig, to_run_config
from stability.core.loop import RunResult
from stability.core.quick_exit import skip_exit_gc
from stability.core.signals import sigterm_deferred
from stability.core.sinks import StepSink
from stability.integrations import backends
from stability.integrations.protocol import Backend
from stability.sweep.errors import SweepError
from stability.tracking.claim import claim
from stability.tracking.run import TrackedRun, run_record
from stability.tracking.uri import TrackingError, redact_uri, scrub_hydra_files

log = logging.getLogger(__name__)


def quiet_console() -> None:
    """The terminal gets warnings and errors only; log files keep every level."""
    for handler in logging.getLogger().handlers:
        if type(handler) is logging.StreamHandler:  # not a FileHandler (a subclass)
            handler.setLevel(max(handler.level, logging.WARNING))


def in_multirun() -> bool:
    """Whether the current Hydra job is one job of a ``-m`` sweep (not a single run)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


def hydra_job(cfg: Any, say: Callable[[str], None] = log.info) -> float:
    """The body of a Hydra entry point (``experiments/sweep.py``, ``stability sweep``).

    Args:
        cfg: the composed ``DictConfig`` of this job.
        say: where a single run's one-line result goes (the CLI prints it); inside a sweep
            it goes to the job's log.

    Returns:
        The best validation loss (inf if the run did not finish), for sweepers.

    Raises:
        Those of ``run_job``.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    skip_exit_gc()  # a sweep's worker or a SLURM task is a process of ours
    hc = HydraConfig.get()
    in_sweep = in_multirun()
    if in_sweep and not hc.sweeper.get("verbose", False):
        quiet_console()
    raw = OmegaConf.to_container(cfg, resolve=True)
    return run_job(raw, overrides=list(hc.overrides.task), in_sweep=in_sweep, say=say)


def backend_for(cfg: RunConfig, world_size: int = 1) -> Backend:
    """The task's backend, its preflight passed.

    Raises:
        ConfigError: an unknown backend, or a setting it cannot honour (before any run exists).
    """
    backend = backends.of(cfg)
    backend.preflight(cfg, world_size)
    return backend


def train_tracked(cfg: RunConfig, overrides: Sequence[str] = (),
                  sinks: Sequence[StepSink] = ()) -> RunResult:
    """``run.train`` inside an MLflow run (or without one when tracking is disabled).

    Under torchrun this joins the process group first; only rank 0 creates the MLflow run.
    ``sinks`` are extra per-step consumers on this rank.
    """
    world = distributed.setup(cfg.device)
    backend = backend_for(cfg, world)  # a backend's refusal comes before the run exists
    fit = backend.train
    if distributed.is_main():  # another run's records in this folder are moved, not overwritten
        claim(cfg.output_dir, cfg, world)
    if not cfg.tracking.enabled or not distributed.is_main():
        with distributed.rank_guard():
            result = fit(cfg, sinks, world_size=world)
            distributed.leave()  # in the guard: a peer that broke at the barrier is named
        return result
    # Deferred SIGTERM: when torchrun tears the ranks down, rank 0 still closes its run.
    record = run_record(cfg, overrides, world, backend.unused_params)
    with sigterm_deferred(), TrackedRun(record) as tracked:
        with distributed.rank_guard():
            result = fit(cfg, sinks=[tracked.sink, *sinks], world_size=world)
            distributed.leave()
        tracked.finish(result.summary, result.status, result.reason)
    # A tracking outage never fails the run: MLflow's part waits in the folder (pending sync).
    log.info("MLflow run %s (%s)%s", tracked.run_id or "(not created yet)", redact_uri(tracked.uri),
             ", kept locally: pending sync" if tracked.pending else "")
    return result


def run_job(raw: Mapping[str, Any], overrides: Sequence[str] = (), in_sweep: bool = False,
            say: Callable[[str], None] = log.info) -> float:
    """Train the configuration in ``raw``; returns its best validation loss (inf if not finished).

    Args:
        raw: the composed config as plain nested dicts.
        overrides: the Hydra override strings of this job (recorded with the run).
        in_sweep: inside a multirun an unexpected failure is logged and returns ``inf`` so the
            sweep goes on; a single run re-raises it.
        say: where a single run's one-line result goes.

    Raises:
        ConfigError: ``raw`` is not a valid config; outside a sweep (or distributed) also a
            point the device cannot run.
        TrackingError: outside a sweep (or distributed), the tracking store is unusable.
        SweepError: outside a sweep (or distributed), the disk is full (exit status 1).
    """
    cfg = to_run_config(raw)
    scrub_hydra_files(Path(cfg.output_dir))
    alone = not in_sweep or distributed.is_distributed()
    try:
        result = train_tracked(cfg, overrides)
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        # Disk full (a checkpoint, steps.csv): one line; the run is closed FAILED with it.
        message = err.strerror if isinstance(err, DiskFull) else str(err)
        if alone:
            raise SweepError(message, 1) from None
        log.error("error: %s", message)
        return math.inf
    except (ConfigError, TrackingError) as err:
        if alone:
            raise
        # In a sweep, one point the device cannot run (or a tracking outage) must not end the
        # other jobs: the sweeper counts it as not finished.
        log.error("run not trained, the sweep goes on: %s", err)
        return math.inf
    except Exception:
        # Distributed, the process group is broken after a failure: the ranks stop together.
        if alone:
            raise
        log.exception("run failed; the sweep goes on")
        return math.inf
    if distributed.is_main():
        (log.info if in_sweep else say)(summary_line(result))
    return result.best_val_loss if result.status == "finished" else math.inf


def summary_line(result: RunResult) -> str:
    """One readable line at the end of a run (in a sweep: in the job's log)."""
    s = result.summary
    return (f"{result.status}: best val_loss {result.best_val_loss:.4f} at epoch "
            f"{result.best_epoch}, clip fraction {s['clip_fraction']:.3f}, skipped steps "
            f"{s['skip_count']}, {result.wall_time_s:.1f}s -> {result.output_dir}")
