"""One round of a sweep: order its points, launch them, and collect what each one did.

Jobs are launched longest first (``schedule``): through the local worker pool (``pool``) all
at once, a job starting whenever a core frees, the status area (``display``: done, running,
ETA, best so far) updated as each ends; through any other launcher in batches, updated between
them. A failed job never stops the round: it comes back as a ``PointResult`` that did not
finish.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher

from stability.core.signals import StopRequest
from stability.sweep import launch, schedule
from stability.sweep.display import Display
from stability.sweep.errors import JobLost
from stability.sweep.grid import SweepPoint
from stability.sweep.progress import Progress
from stability.sweep.session import Key, Session
from stability.sweep.strategy_base import FINISHED, NOT_FINISHED, NOT_STARTED, PointResult


def on_cpu(points: Sequence[SweepPoint]) -> bool:
    """Whether the points train on a CPU (``device=auto`` without CUDA here)."""
    import torch

    devices = {p.cfg.device for p in points}
    return devices == {"cpu"} or ("cuda" not in devices and not torch.cuda.is_available())


@dataclass
class Launching:
    """How a sweep hands its jobs to the launcher (the same for every round).

    Attributes:
        launcher: Hydra's launcher (``pool.PoolLauncher`` streams; others run batches).
        streams: hand the launcher a whole round at once (``launcher.stream``).
        batch_size: jobs per launcher call when not streaming (0: a round at once).
        workers: jobs that run at once (the ETA's model).
        job_dirs: Hydra's ``<sweep dir>/<job number>`` layout is in use (job folders are known).
        sweep_dir: the sweep's folder.
        state_dir: the sweep's pool state folder (stop file, start marks).
        title: the sweep's name on the status area (its id).
        progress: the status area's mode (``display.MODES``).
        progress_every_s: plain status lines at most this often.
        stream: where the status area writes (None: stdout).
    """

    launcher: Launcher
    streams: bool
    batch_size: int
    workers: int
    job_dirs: bool
    sweep_dir: Path
    state_dir: Path
    title: str
    progress: str = "auto"
    progress_every_s: float = 60.0
    stream: TextIO | None = None


@dataclass(frozen=True)
class RoundPlan:
    """One round's jobs: the points to launch and where each one's job goes.

    Attributes:
        todo: the points to run, not yet ordered.
        skipped: points of this round not launched because they already FINISHED.
        resume: the folder of each point that resumes from a checkpoint.
        offset: Hydra job number of the round's first job.
    """

    todo: Sequence[SweepPoint]
    skipped: int
    resume: Mapping[Key, Path]
    offset: int


@dataclass
class RoundOutcome:
    """What one round did."""

    results: list[PointResult] = field(default_factory=list)  # one per point launched
    returns: list[JobReturn] = field(default_factory=list)  # Hydra's, as they came
    launched: set[int] = field(default_factory=set)  # positions of jobs that started
    job_dirs: dict[Key, Path] = field(default_factory=dict)  # each point's folder
    failed: int = 0  # jobs that ended without finishing
    scheduler_killed: set[Key] = field(default_factory=set)  # jobs scancelled, preempted...
    progress: Progress | None = None


def run_round(how: Launching, plan: RoundPlan, session: Session, stop: StopRequest,
              out: RoundOutcome) -> None:
    """Launch ``plan.todo`` and fill ``out`` as jobs end (so a stopped round still counts).

    Args:
        how: the launcher and the status area's settings.
        plan: the round's points, the skipped count, resumed folders and first job number.
        session: the sweep's tracking (job overrides).
        stop: the sweep's stop request (no new batch once requested).
        out: receives the outcome.
    """
    todo, resume, offset = plan.todo, plan.resume, plan.offset
    # Longest first: a pool that takes the next job as a core frees ends soonest that way;
    # without measured costs, one job of each kind first, so the ETA measures every kind.
    observed = session.run.costs if session.run else None
    costed = schedule.order(todo, observed, on_cpu=on_cpu(todo))
    if not schedule.measured(todo, observed):
        costed = schedule.with_probes(costed)
    points, costs = [p for p, _ in costed], [c for _, c in costed]
    if how.job_dirs:
        out.job_dirs = {p.key: how.sweep_dir / str(offset + i) for i, p in enumerate(points)}
    out.job_dirs |= {p.key: resume[p.key] for p in points if p.key in resume}
    progress = out.progress = Progress.of(points, costs, how.workers or len(points),
                                          plan.skipped)
    display = Display(progress, how.title, how.progress, how.progress_every_s,
                      poll=(lambda: launch.poll_marks(display, how.state_dir, offset,
                                                      len(points)))
                      if how.streams else None, stream=how.stream)
    jobs = [session.job_overrides(p, resume) for p in points]
    ended: dict[int, JobReturn] = {}
    watch = launch.Watch(display=display, started=out.launched, ended=ended)
    try:
        with display:
            if how.streams:
                launch.stream(how.launcher, jobs, offset, how.state_dir, watch)
            else:
                launch.batches(how.launcher, jobs, costs, offset, how.batch_size, stop=stop,
                               watch=watch)
    finally:
        for i, p in enumerate(points):
            if i in ended:
                loss = launch.value(ended[i])
                out.results.append(PointResult(p, FINISHED if loss is not None else NOT_FINISHED,
                                               loss))
            elif i not in out.launched:
                out.results.append(PointResult(p, NOT_STARTED))
        out.returns = list(ended.values())
        out.scheduler_killed = {p.key for i, p in enumerate(points) if i in ended
                                and isinstance(ended[i]._return_value, JobLost)
                                and ended[i]._return_value.killed}
        out.failed = progress.failed
        # folders that exist were started, even if their start was not seen (killed)
        out.launched |= {i for i, p in enumerate(points)
                         if p.key in out.job_dirs and out.job_dirs[p.key].is_dir()}
