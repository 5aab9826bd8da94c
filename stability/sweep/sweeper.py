"""The study sweeper: Hydra's BasicSweeper plus de-duplication, resume, MLflow and progress.

Before any job starts, the sweeper composes every grid point once (so a bad value fails the
whole sweep early, naming the key) and drops duplicates (clip-off points differ only in
settings that cannot matter). Then it runs a loop over its strategy
(``hydra.sweeper.strategy``, looked up by name in ``strategy_registry``; the default is the
whole grid in one round)::

    points = strategy.initial()
    open the sweep's tracking                      # session: parent run, what is done
    while points:
        run the round                               # rounds: schedule, launch, collect
        points = strategy.next(results)
    close the sweep's tracking                      # session: sync, orphans, summary

A failed job never stops the sweep. The Hydra plugin in ``hydra_plugins/stability_sweeper``
is this class with ``stability.cli``'s edge: the library raises (``errors.SweepError``, or
``KeyboardInterrupt``/``Terminated`` once a stopped sweep is closed) and the CLI turns that
into one line and an exit status. What the sweeper tells the user goes through ``say``
(default: the log) and the status area's ``stream``, both set by the CLI.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

from stability.compat.hydra import BASIC_LAUNCHER_LOGGER, BasicSweeper
from stability.core.config import ConfigError, RunConfig, to_run_config
from stability.core.signals import StopRequest, Terminated
from stability.sweep import pool
from stability.sweep.compose import CachedComposer
from stability.sweep.display import check_mode
from stability.sweep.errors import SweepError
from stability.sweep.grid import Axis, SweepPoint, axes_lines, dedupe, grid_axes, make_point
from stability.sweep.parent import SweepSetup, next_job_index
from stability.sweep.progress import format_duration
from stability.sweep.rounds import Launching, RoundOutcome, RoundPlan, run_round
from stability.sweep.session import Session, open_session
from stability.sweep.strategy_base import SKIPPED, PointResult, Strategy, settings_of
from stability.sweep.strategy_registry import DEFAULT, load_strategy, names
from stability.tracking.uri import redact_uri, scrub_hydra_files

log = logging.getLogger(__name__)

# Launchers that log a line per job they launch (the status area says it; -v keeps them).
LAUNCHER_LOGGERS = (BASIC_LAUNCHER_LOGGER,
                    "hydra_plugins.hydra_joblib_launcher._core",
                    "hydra_plugins.hydra_submitit_launcher.submitit_launcher")


class StabilitySweeper(BasicSweeper):
    """BasicSweeper that de-duplicates, resumes, tracks the sweep in MLflow and reports progress.

    Args:
        max_batch_size: jobs per launcher call; None picks one from the launcher (joblib:
            its worker count, basic: 1, anything else: the whole grid at once).
        params: the grid, ``{key: "v1,v2"}`` (Hydra sweep syntax).
        resume: skip points (fingerprint + seed) already FINISHED in the experiment.
        dry_run: say the grid size and the points that would run; launch nothing.
        progress: the status area (``display.MODES``): ``auto``, ``live`` or ``plain``.
        progress_every_s: plain status lines at most this often (seconds).
        verbose: the jobs print their per-epoch lines to the terminal too (read by the jobs,
            ``stability.sweep.job``).
        strategy: how the sweep plans: a name in ``strategy_registry`` (None: ``grid``, the
            whole grid), else a class ``module.Class`` (or the class itself).
        settings: every other key, ``hydra.sweeper.<name>``: a registered strategy's settings
            (read only for the strategy the sweep names, into its ``settings_type``).

    Attributes:
        say: where the sweeper's lines go (default: this module's log; the CLI prints them).
        stream: where the status area writes (None: stdout).
    """

    # Hydra instantiates it from the sweeper config's keys: one keyword each, no record.
    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None,
                 resume: bool = True, dry_run: bool = False, progress: str = "auto",
                 progress_every_s: float = 60.0, verbose: bool = False,
                 strategy: str | type | None = None, **settings: Any) -> None:
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
        self.strategy = strategy
        self.settings = settings
        self.grid: dict[str, str] = {}
        self.axes: list[Axis] = []
        self.say: Callable[[str], None] = log.info
        self.stream: TextIO | None = None
        self._composer: CachedComposer | None = None
        self._composed: dict[tuple[str, ...], RunConfig] = {}

    def _compose(self, overrides: Sequence[str]) -> RunConfig:
        """The ``RunConfig`` a job with ``overrides`` will see (``compose.CachedComposer``:
        composing from scratch costs ~0.1 s a point, a minute for the default study).

        Raises:
            SweepError: the point's config is invalid (exit 2, the grid point named).
        """
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
            raise SweepError(f"{err} (grid point: {' '.join(overrides)})", 2) from None
        self._composed[key] = run  # frozen: points with the same overrides may share it
        return run

    def make_point(self, overrides: Sequence[str]) -> SweepPoint:
        """The point of one job's overrides: composed, validated, irrelevant settings dropped."""
        p = make_point(overrides, self._compose(overrides))
        if len(p.overrides) < len(overrides):  # settings that cannot matter were dropped:
            p = replace(p, cfg=self._compose(p.overrides))  # keep the config that will run
        return p

    def plan(self, arguments: list[str]) -> tuple[int, list[SweepPoint]]:
        """Expand the grid and compose every point; returns (grid size, unique points).

        Also sets ``self.grid``: every grid and command-line override (later ones win),
        recorded on the parent run; ``tracking.*`` is left out (URIs may carry credentials).
        """
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides(self._parse_config() + list(arguments))
        self.axes = grid_axes(parser.parse_overrides(self._parse_config()),
                              parser.parse_overrides(list(arguments)))
        self.grid = {o.get_key_element().lstrip("+~"): o.input_line.partition("=")[2]
                     for o in overrides
                     if not o.get_key_element().lstrip("+~").startswith("tracking.")}
        jobs = self.split_arguments(overrides, None)[0]
        t0 = time.perf_counter()
        points = [self.make_point(job) for job in jobs]
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

    def strategy_class(self) -> type[Strategy]:
        """The class of ``hydra.sweeper.strategy`` (``strategy_registry.load_strategy``).

        Raises:
            SweepError: it names no registered strategy and no importable class, or a
                ``hydra.sweeper.<key>`` is none of the sweeper's keys and no strategy's (exit 2).
        """
        try:
            known = names()
            for name in self.settings:
                if name not in known:
                    raise ConfigError(f"hydra.sweeper.{name} is unknown: allowed keys are the "
                                      "sweeper's (conf/hydra/sweeper/study.yaml) and a "
                                      f"strategy's settings ({', '.join(known)})")
            return load_strategy(self.strategy)
        except ConfigError as err:
            raise SweepError(str(err), 2) from None

    def sweep(self, arguments: list[str]) -> list[Sequence[JobReturn]]:
        """Plan, de-duplicate, then run the strategy's rounds (see the module docstring).

        Raises:
            SweepError: a bad setting or grid value (exit 2), a store that cannot take the
                sweep (exit 1); nothing was launched then.
            KeyboardInterrupt | Terminated: the sweep was stopped (after it was closed).
        """
        assert self.config is not None
        try:
            check_mode(self.progress, self.progress_every_s)
        except ConfigError as err:
            raise SweepError(str(err), 2) from None
        make_strategy = self.strategy_class()
        settings = self.strategy_settings(make_strategy)
        if not self.verbose:
            for name in LAUNCHER_LOGGERS:
                logging.getLogger(name).setLevel(logging.WARNING)
        grid_size, points = self.plan(arguments)
        dupes = grid_size - len(points)
        for line in axes_lines(self.axes):
            self.say(line)
        self.say(f"grid: {grid_size} points, {len(points)} after de-duplication ({dupes} "
                 "duplicates: settings that cannot matter, e.g. clip.max_norm with clipping off)")
        if self.dry_run:
            for p in points:
                self.say(f"would run: {' '.join(p.overrides)}")
            return []
        try:
            strategy = make_strategy(points, self.make_point, settings)
        except ConfigError as err:
            raise SweepError(str(err), 2) from None
        batch = dedupe(strategy.initial())
        self._relay(strategy)
        sweep_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        sweep_dir = Path(self.config.hydra.sweep.dir)
        scrub_hydra_files(sweep_dir)
        setup = SweepSetup(sweep_id=sweep_id, grid_size=grid_size, arguments=tuple(arguments),
                           grid=self.grid, sweep_dir=sweep_dir)
        session = open_session(batch, setup, self.resume)
        session.tag(strategy.tags())
        state_dir = sweep_dir / f".pool-{sweep_id}"  # stop file, jobs' start marks (pool)
        how = Launching(launcher=self.launcher, streams=self._streams(),
                        batch_size=self.batch_size(), workers=self.batch_size(),
                        job_dirs=self._job_dirs_known(), sweep_dir=sweep_dir,
                        state_dir=state_dir, title=sweep_id, progress=self.progress,
                        progress_every_s=self.progress_every_s, stream=self.stream)
        stop = StopRequest(in_process=self._launcher_target().endswith("BasicLauncher"),
                           stop_file=state_dir / pool.STOP_FILE, say=self.say)
        rounds: list[RoundOutcome] = []
        seen: set[tuple[str, int]] = set()
        skipped, status, started = 0, "FAILED", time.time()
        try:
            with stop.installed():
                while batch:
                    # a point proposed again is not run twice in one sweep
                    batch = [p for p in batch if p.key not in seen]
                    seen.update(p.key for p in batch)
                    todo = [p for p in batch if p.key not in session.done]
                    skipped += len(batch) - len(todo)
                    session.adopt([p.key for p in batch if p.key in session.done])
                    resume, offset = self._durability(session, todo, sweep_dir, first=not rounds)
                    if not rounds:
                        self._opened(session, sweep_id, len(batch), len(todo), state_dir)
                        started = time.time()
                    else:
                        self.say(f"round {len(rounds) + 1}: {len(todo)} more points to run")
                    rounds.append(RoundOutcome())
                    session.record(planned=[p.key for p in batch])
                    plan = RoundPlan(todo=todo, skipped=len(batch) - len(todo), resume=resume,
                                     offset=offset)
                    run_round(how, plan, session, stop, rounds[-1])
                    session.record(folders=list(rounds[-1].job_dirs.values()))
                    if stop.requested:
                        raise stop.exception()
                    results = self._results(strategy, session, rounds[-1], batch)
                    batch = dedupe(strategy.next(results) or [])
                    self._relay(strategy)
            status = "FINISHED"
        except (KeyboardInterrupt, Terminated):  # the CLI exits with 128 + the signal
            status = "KILLED"
            raise
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)
            self._summary(session, setup, status, unique=len(seen) or len(points),
                          skipped=skipped, rounds=rounds, elapsed=time.time() - started)
        return [r.returns for r in rounds]

    def strategy_settings(self, make_strategy: type[Strategy]) -> Any:
        """The strategy's settings: ``hydra.sweeper.<name>`` as its own ``settings_type``,
        validated before anything runs (a class named by ``module.Class``: the type's defaults).

        Raises:
            SweepError: a bad key or value (exit 2, one line naming it).
        """
        name = DEFAULT if self.strategy is None else self.strategy
        values = self.settings.get(name) if isinstance(name, str) else None
        try:
            return settings_of(make_strategy.settings_type, values, f"hydra.sweeper.{name}")
        except ConfigError as err:
            raise SweepError(str(err), 2) from None

    def _results(self, strategy: Strategy, session: Session, outcome: RoundOutcome,
                 batch: Sequence[SweepPoint]) -> list[PointResult]:
        """The round's results for ``strategy.next``: launched points as they ended, points
        FINISHED before the sweep with their recorded loss, run times read from the store
        (not for a strategy that does not read them, e.g. the grid)."""
        if not strategy.reads_losses:
            return outcome.results + [PointResult(p, SKIPPED) for p in batch
                                      if p.key in session.done]
        now = session.recorded()
        out = [replace(r, seconds=now[r.point.key].seconds) if r.point.key in now else r
               for r in outcome.results]
        for p in batch:
            if p.key in session.done:
                rec = session.done[p.key]
                out.append(PointResult(point=p, status=SKIPPED, best_val_loss=rec.best_val_loss,
                                       seconds=rec.seconds))
        return out

    def _relay(self, strategy: Strategy) -> None:
        """Say what the strategy has to say (``lines()``)."""
        for line in strategy.lines():
            self.say(line)

    def _durability(self, session: Session, todo: Sequence[SweepPoint], sweep_dir: Path,
                    first: bool) -> tuple[dict[tuple[str, int], Path], int]:
        """Killed points go on from their checkpoint, and a re-run in the same folder never
        reuses an old job's folder (docs/TRACKING.md)."""
        resume = session.resumable(todo)
        offset = next_job_index(sweep_dir) if sweep_dir.is_dir() else 0
        if first and session.run is not None:
            self.say(f"synced {session.run.synced} pending runs; ended {session.run.stale} runs "
                     f"without heartbeat as KILLED; {len(resume)} points resume from a "
                     "checkpoint")
        return resume, offset

    def _opened(self, session: Session, sweep_id: str, planned: int, todo: int,
                state_dir: Path) -> None:
        """Say what the sweep skips and where it is tracked; write its folder's records."""
        assert self.config is not None
        run = session.run
        if run is not None:
            self.say(f"skipped {planned - todo} points already FINISHED in experiment "
                     f"'{run.experiment}' ({redact_uri(run.uri)}); {todo} to run")
            self.say(f"sweep {sweep_id}: parent run {run.run_id}")
        state_dir.parent.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, state_dir.parent / "multirun.yaml")
        state_dir.mkdir(parents=True)

    def _summary(self, session: Session, setup: SweepSetup, status: str, unique: int,
                 skipped: int, rounds: Sequence[RoundOutcome], elapsed: float) -> None:
        """Close the sweep's tracking and say its one-line outcome.

        Args:
            session: the sweep's tracking, closed here.
            setup: the sweep's grid size and folder (synced, its orphaned runs closed).
            status: how the sweep ended (FINISHED, FAILED or KILLED).
            unique: points the sweep planned, after de-duplication.
            skipped: points not launched because they already FINISHED.
            rounds: what each round did.
            elapsed: seconds since the first round started.
        """
        job_dirs: dict[Any, Path] = {}
        for r in rounds:
            job_dirs |= r.job_dirs
        summary = {"runs_grid": setup.grid_size, "runs_unique": unique,
                   "runs_launched": sum(len(r.launched) for r in rounds),
                   "runs_skipped_done": skipped,
                   "runs_not_finished": sum(r.failed for r in rounds)}
        killed = set().union(*(r.scheduler_killed for r in rounds))
        summary |= session.close(status, summary, job_dirs, setup.sweep_dir, self.say, killed)
        self.say(f"{status.lower()} after {format_duration(elapsed)}: "
                 + ", ".join(f"{k.removeprefix('runs_')}={int(v)}" for k, v in summary.items()))
        if session.run is not None:
            self.say(f"view: {session.run.view_hint()}")

    def _streams(self) -> bool:
        """Whether to hand the launcher the whole grid at once (``pool.PoolLauncher``).

        Not when ``max_batch_size`` is set: the user asked for batches.
        """
        return hasattr(self.launcher, "stream") and not self.max_batch_size

    def _launcher_target(self) -> str:
        assert self.config is not None
        return str(self.config.hydra.launcher.get("_target_", ""))

    def _job_dirs_known(self) -> bool:
        """Hydra's default layout: each job's folder is ``<sweep dir>/<job number>``."""
        assert self.config is not None
        sweep = OmegaConf.to_container(self.config.hydra.sweep, resolve=False)
        return sweep.get("subdir") == "${hydra.job.num}"
