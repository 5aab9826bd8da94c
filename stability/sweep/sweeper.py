"""The study sweeper: Hydra's BasicSweeper plus de-duplication, resume, MLflow and progress.

Before any job starts, the sweeper composes every grid point once (so a bad value fails the
whole sweep early, naming the key), drops duplicates (clip-off points differ only in settings
that cannot matter), checks the tracking store, creates the experiment and the sweep's parent
run once (parallel workers initialising a brand-new SQLite store at the same time crash
MLflow's migrations), and skips points already FINISHED in the experiment. Jobs are launched
longest first (``schedule``): through the local worker pool (``pool``) all at once, a job
starting whenever a core frees, the status area (``display``: done, running, ETA, best so
far) updated as each ends; through any other launcher in batches, updated between them. A
failed job never stops the sweep. The Hydra plugin in ``hydra_plugins/stability_sweeper`` is a
thin subclass of this.
"""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

from stability.core.config import ConfigError, RunConfig, to_run_config
from stability.core.signals import StopRequest, Terminated
from stability.sweep import launch, pool, schedule
from stability.sweep.compose import CachedComposer
from stability.sweep.display import Display, check_mode
from stability.sweep.grid import SweepPoint, dedupe, make_point, override_key
from stability.sweep.parent import (
    SweepRun,
    next_job_index,
    open_sweep_run,
    override,
    resumable_folders,
)
from stability.sweep.progress import Progress, format_duration
from stability.tracking.auth import AuthError, check_credentials, check_no_userinfo
from stability.tracking.sync import sync_paths
from stability.tracking.uri import (
    TrackingError,
    redact_uri,
    resolve_tracking_uri,
    scrub_hydra_files,
)

log = logging.getLogger(__name__)

# Launchers that log a line per job they launch (the status area says it; -v keeps them).
LAUNCHER_LOGGERS = ("hydra._internal.core_plugins.basic_launcher",
                    "hydra_plugins.hydra_joblib_launcher._core",
                    "hydra_plugins.hydra_submitit_launcher.submitit_launcher")
# Set by the sweeper on every job; a user's own values for these would be ambiguous.
JOB_TRACKING_KEYS = ("tracking.uri", "tracking.sweep_id", "tracking.parent_run_id")


def _fail(message: str, status: int) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def _say(message: str) -> None:
    print(f"[sweep] {message}", flush=True)


def _on_cpu(points: Sequence[SweepPoint]) -> bool:
    """Whether the points train on a CPU (``device=auto`` without CUDA here)."""
    import torch

    devices = {p.cfg.device for p in points}
    return devices == {"cpu"} or ("cuda" not in devices and not torch.cuda.is_available())


class StabilitySweeper(BasicSweeper):
    """BasicSweeper that de-duplicates, resumes, tracks the sweep in MLflow and reports progress.

    Args:
        max_batch_size: jobs per launcher call; None picks one from the launcher (joblib:
            its worker count, basic: 1, anything else: the whole grid at once).
        params: the grid, ``{key: "v1,v2"}`` (Hydra sweep syntax).
        resume: skip points (fingerprint + seed) already FINISHED in the experiment.
        dry_run: print the grid size and the points that would run; launch nothing.
        progress: the status area (``display.MODES``): ``auto``, ``live`` or ``plain``.
        progress_every_s: plain status lines at most this often (seconds).
        verbose: the jobs print their per-epoch lines to the terminal too (read by the jobs,
            ``stability.sweep.job``).
    """

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None,
                 resume: bool = True, dry_run: bool = False, progress: str = "auto",
                 progress_every_s: float = 60.0, verbose: bool = False) -> None:
        # Not BasicSweeper.__init__: its ``super(BasicSweeper, self)`` breaks when Hydra's plugin
        # scan re-executes that module after this class was defined (it rebinds the name).
        Sweeper.__init__(self)
        self.overrides = None
        self.batch_index = 0
        self.max_batch_size = max_batch_size
        self.params = params or {}
        self.hydra_context = None
        self.config = None
        self.launcher = None
        self.resume = resume
        self.dry_run = dry_run
        self.progress = progress
        self.progress_every_s = progress_every_s
        self.verbose = verbose
        self.grid: dict[str, str] = {}
        self._composer: CachedComposer | None = None
        self._composed: dict[tuple[str, ...], RunConfig] = {}

    def _compose(self, overrides: Sequence[str]) -> RunConfig:
        """The ``RunConfig`` a job with ``overrides`` will see (``compose.CachedComposer``:
        composing from scratch costs ~0.1 s a point, a minute for the default study)."""
        assert self.hydra_context is not None and self.config is not None
        key = tuple(overrides)
        if key in self._composed:  # e.g. every clip-off point once its max_norm is dropped
            return self._composed[key]
        if self._composer is None:
            self._composer = CachedComposer(self.hydra_context, self.config)
        cfg = self._composer.app_config(overrides)
        try:
            run = to_run_config(OmegaConf.to_container(cfg, resolve=True))
        except ConfigError as err:
            _fail(f"{err} (grid point: {' '.join(overrides)})", 2)
            raise  # unreachable: _fail exits
        self._composed[key] = run  # frozen: points with the same overrides may share it
        return run

    def plan(self, arguments: list[str]) -> tuple[int, list[SweepPoint]]:
        """Expand the grid and compose every point; returns (grid size, unique points).

        Also sets ``self.grid``: every grid and command-line override (later ones win),
        recorded on the parent run; ``tracking.*`` is left out (URIs may carry credentials).
        """
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides(self._parse_config() + list(arguments))
        self.grid = {o.get_key_element().lstrip("+~"): o.input_line.partition("=")[2]
                     for o in overrides
                     if not o.get_key_element().lstrip("+~").startswith("tracking.")}
        jobs = self.split_arguments(overrides, None)[0]
        t0 = time.perf_counter()
        points = []
        for job in jobs:
            p = make_point(job, self._compose(job))
            if len(p.overrides) < len(job):  # settings that cannot matter were dropped:
                p = replace(p, cfg=self._compose(p.overrides))  # keep the config that will run
            points.append(p)
        log.debug("composed %d grid points in %.1fs", len(points), time.perf_counter() - t0)
        return len(points), dedupe(points)

    def batch_size(self) -> int:
        """Jobs per launcher call (0 = all at once): small batches make progress visible."""
        if self.max_batch_size:
            return self.max_batch_size
        assert self.config is not None
        launcher = self.config.hydra.launcher
        if "n_jobs" in launcher:  # joblib: one batch fills every worker once
            import joblib

            n = int(launcher.n_jobs)
            return n if n > 0 else max(1, joblib.cpu_count() + 1 + n)
        if str(launcher.get("_target_", "")).endswith("BasicLauncher"):
            return 1
        return 0  # submitit & co: the scheduler decides the parallelism

    def sweep(self, arguments: list[str]) -> list[Sequence[JobReturn]]:
        """Plan, de-duplicate, skip finished points, then launch longest first."""
        assert self.config is not None
        try:
            check_mode(self.progress, self.progress_every_s)
        except ConfigError as err:
            _fail(str(err), 2)
        if not self.verbose:
            for name in LAUNCHER_LOGGERS:
                logging.getLogger(name).setLevel(logging.WARNING)
        grid_size, points = self.plan(arguments)
        dupes = grid_size - len(points)
        _say(f"grid: {grid_size} points, {len(points)} after de-duplication ({dupes} duplicates: "
             "settings that cannot matter, e.g. clip.max_norm with clipping off)")
        if self.dry_run:
            for p in points:
                _say(f"would run: {' '.join(p.overrides)}")
            return []
        sweep_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        sweep_dir = Path(self.config.hydra.sweep.dir)
        scrub_hydra_files(sweep_dir)
        run, done = self._open_tracking(points, grid_size, sweep_id, arguments, sweep_dir)
        todo = [p for p in points if p.key not in done]
        # --- durability (docs/TRACKING.md): killed points go on from their checkpoint, and a
        # re-run in the same folder never reuses an old job's folder
        resume = resumable_folders(run, todo) if run is not None else {}
        offset = next_job_index(sweep_dir) if sweep_dir.is_dir() else 0
        if run is not None:
            _say(f"synced {run.synced} pending runs; ended {run.stale} runs without heartbeat "
                 f"as KILLED; {len(resume)} points resume from a checkpoint")
        # --- end durability
        if run is not None:
            _say(f"skipped {len(points) - len(todo)} points already FINISHED in experiment "
                 f"'{run.experiment}' ({redact_uri(run.uri)}); {len(todo)} to run")
            _say(f"sweep {sweep_id}: parent run {run.run_id}")
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")

        # Longest first: a pool that takes the next job as a core frees ends soonest that way;
        # without measured costs, one job of each kind first, so the ETA measures every kind.
        observed = run.costs if run else None
        costed = schedule.order(todo, observed, on_cpu=_on_cpu(todo))
        if not schedule.measured(todo, observed):
            costed = schedule.with_probes(costed)
        todo, costs = [p for p, _ in costed], [c for _, c in costed]
        job_dirs = self._job_dirs(todo, offset) | {p.key: resume[p.key] for p in todo
                                                   if p.key in resume}
        streams = self._streams()
        workers = self.batch_size() or len(todo)
        progress = Progress.of(todo, costs, workers, skipped=len(points) - len(todo))
        state_dir = sweep_dir / f".pool-{sweep_id}"  # stop file, jobs' start marks (pool)
        state_dir.mkdir(parents=True)
        display = Display(progress, sweep_id, self.progress, self.progress_every_s,
                          poll=(lambda: launch.poll_marks(display, state_dir, offset, len(todo)))
                          if streams else None)
        stop = StopRequest(in_process=self._launcher_target().endswith("BasicLauncher"),
                           stop_file=state_dir / pool.STOP_FILE)
        status, started, returns = "FAILED", set(), []
        try:
            with stop.installed(), display:
                jobs = self._jobs(todo, run, resume)
                if streams:
                    returns = [launch.stream(self.launcher, jobs, offset, state_dir, display,
                                             started)]
                else:
                    returns = launch.batches(self.launcher, jobs, costs, offset,
                                             self.batch_size(), display, started, stop)
                if stop.requested:
                    raise stop.exception()
            status = "FINISHED"
        except (KeyboardInterrupt, Terminated) as err:
            status = "KILLED"
            interrupted = isinstance(err, KeyboardInterrupt)
            raise SystemExit(128 + (signal.SIGINT if interrupted else signal.SIGTERM)) from None
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)
            launched = len(started | {i for i, p in enumerate(todo)
                                      if p.key in job_dirs and job_dirs[p.key].is_dir()})
            summary = {"runs_grid": grid_size, "runs_unique": len(points),
                       "runs_launched": launched, "runs_skipped_done": len(points) - len(todo),
                       "runs_not_finished": progress.failed}
            if run is not None:
                summary |= self._close(run, status, summary, job_dirs, sweep_dir)
            _say(f"{status.lower()} after {format_duration(progress.elapsed())}: "
                 + ", ".join(f"{k.removeprefix('runs_')}={int(v)}" for k, v in summary.items()))
            if run is not None:
                _say(f"view: {run.view_hint()}")
        return returns

    def _streams(self) -> bool:
        """Whether to hand the launcher the whole grid at once (``pool.PoolLauncher``).

        Not when ``max_batch_size`` is set: the user asked for batches.
        """
        return hasattr(self.launcher, "stream") and not self.max_batch_size

    def _launcher_target(self) -> str:
        assert self.config is not None
        return str(self.config.hydra.launcher.get("_target_", ""))

    def _job_dirs(self, batch: list[SweepPoint], first: int) -> dict[tuple[str, int], Path]:
        """Each job's output folder (Hydra's default layout: <sweep dir>/<job number>)."""
        assert self.config is not None
        sweep = OmegaConf.to_container(self.config.hydra.sweep, resolve=False)
        if sweep.get("subdir") != "${hydra.job.num}":
            return {}
        root = Path(self.config.hydra.sweep.dir)
        return {p.key: root / str(first + i) for i, p in enumerate(batch)}

    def _open_tracking(self, points: list[SweepPoint], grid_size: int, sweep_id: str,
                       arguments: list[str], sweep_dir: Path
                       ) -> tuple[SweepRun | None, set[tuple[str, int]]]:
        if not points:
            return None, set()
        tracking = points[0].cfg.tracking
        for p in points:
            t = p.cfg.tracking
            if (t.uri, t.experiment, t.enabled) != (tracking.uri, tracking.experiment,
                                                    tracking.enabled):
                _fail("tracking.uri, tracking.experiment and tracking.enabled cannot vary "
                      "within a sweep (allowed: one value each)", 2)
        if not tracking.enabled:
            return None, set()
        try:  # before any run: a refused password is a user error, not a grid of failed runs
            # A password in tracking.uri would be in Hydra's multirun.yaml and every job's
            # overrides: refused (MLFLOW_TRACKING_USERNAME / _PASSWORD carry credentials).
            check_no_userinfo(tracking.uri or "")
            check_credentials(resolve_tracking_uri(tracking.uri))
        except (AuthError, ConfigError) as err:
            _fail(str(err), 2)
        try:
            return open_sweep_run(tracking, sweep_id, grid_size, len(points), arguments,
                                  self.grid, self.resume, sweep_dir)
        except (TrackingError, ConfigError) as err:
            _fail(str(err), 1)
            raise  # unreachable: _fail exits
        except Exception as err:  # e.g. MlflowException: a store that refuses the sweep
            _fail(redact_uri(f"cannot prepare the sweep in tracking store "
                             f"{tracking.uri or '(default)'}: {type(err).__name__}: {err}"), 1)
            raise

    @staticmethod
    def _jobs(points: list[SweepPoint], run: SweepRun | None,
              resume: dict[tuple[str, int], Path]) -> list[list[str]]:
        """Each point's overrides, plus the sweep's tracking and a resumed point's folder."""
        extra = run.job_overrides() if run else []
        return [[o for o in p.overrides if override_key(o) not in JOB_TRACKING_KEYS] + extra
                + ([override("output_dir", str(resume[p.key]))] if p.key in resume else [])
                for p in points]

    @staticmethod
    def _close(run: SweepRun, status: str, summary: dict[str, int],
               job_dirs: dict[tuple[str, int], Path], sweep_dir: Path) -> dict[str, int]:
        try:
            synced = len(sync_paths([sweep_dir], run.uri, end_stale=False))
            _say(f"synced {synced} pending runs of this sweep")
            orphans = run.close_orphans(job_dirs, killed=status == "KILLED")
            if orphans:
                _say(f"closed {orphans} runs their jobs left open (worker killed or crashed)")
            return run.close(status, summary) | {"runs_orphaned": orphans}
        except Exception as err:  # never hide the sweep's own outcome behind a tracking error
            log.error("could not close the sweep's parent run %s: %s", run.run_id, err)
            return {}
