"""The local launcher: one worker per core, each taking the next job the moment it is free.

Hydra's joblib launcher runs a list of jobs and returns when the last one ends; the sweeper
used to hand it a batch per core and wait for each batch's slowest run (an fp16 run takes 6x
an fp32 one on a CPU, so a mixed batch idled a core for most of it). ``PoolLauncher`` is that
launcher (same loky workers, same ``hydra.launcher.*`` keys) plus ``stream``: the whole grid
in one call, results yielded as each job ends, so the sweeper reports progress per job.
Each worker composes its jobs' configs through ``compose.CachedComposer`` (Hydra's own
composition of every job costs ~4% of the default study's ideal wall time).

Stopping: a job is only a function call in a worker; once queued, joblib starts it. So each
call first looks for the sweep's stop file (written by the sweeper on the first Ctrl-C or
SIGTERM) and returns at once, unstarted, when it exists. A worker that dies (the OOM killer)
costs the jobs it was running, never the rest of the sweep. A job interrupted while it runs has
already closed its MLflow run as KILLED; its worker returns that as a result rather than
raising, because an exception would make joblib kill the other workers mid-close.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from hydra_plugins.hydra_joblib_launcher import _core
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from omegaconf import DictConfig, open_dict

from stability.core.signals import Terminated
from stability.sweep.compose import CachedComposer

log = logging.getLogger(__name__)

STOP_FILE = "stop"  # in the sweep's state folder: written on the first Ctrl-C / SIGTERM
STARTED = ".started"  # <job number>.started: that job was taken by a worker


# Per worker process: the composer of the sweep it serves (keyed by the sweep's stop file,
# unique per sweep; a worker outlives a sweep when joblib reuses it for the next one).
_composer: dict[str, CachedComposer] = {}


def _execute(idx: int, overrides: Sequence[str], sweep_key: str, hydra_context: HydraContext,
             config: DictConfig, task_function: TaskFunction,
             singleton_state: dict[Any, Any]) -> JobReturn:
    """``hydra_joblib_launcher._core.execute_job`` with the cached composition."""
    setup_globals()
    Singleton.set_state(singleton_state)
    if sweep_key not in _composer:
        _composer.clear()
        _composer[sweep_key] = CachedComposer(hydra_context, config)
    sweep_config = _composer[sweep_key].job_config(overrides)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    return run_job(hydra_context=hydra_context, config=sweep_config,
                   task_function=task_function, job_dir_key="hydra.sweep.dir",
                   job_subdir_key="hydra.sweep.subdir")


def _run_unless_stopped(idx: int, overrides: Sequence[str], state_dir: str,
                        *args: Any) -> tuple[int, JobReturn | None]:
    """Run job ``idx`` in a worker; ``None`` when the sweep was stopped before it started."""
    state = Path(state_dir)
    if (state / STOP_FILE).exists():
        return idx, None
    (state / f"{idx}{STARTED}").touch()  # tells a worker that died from one never started
    try:
        return idx, _execute(idx, overrides, state_dir, *args)
    except (KeyboardInterrupt, Terminated) as err:  # the job closed its run as KILLED
        ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
        ret._return_value = err
        return idx, ret


def start_marks(state_dir: Path) -> dict[int, float]:
    """``{Hydra job number: when a worker took it (file time, seconds)}`` of a sweep."""
    marks = {}
    with os.scandir(state_dir) as entries:
        for entry in entries:
            if entry.name.endswith(STARTED) and entry.name[: -len(STARTED)].isdigit():
                marks[int(entry.name[: -len(STARTED)])] = entry.stat().st_mtime
    return marks


def _died(overrides: Sequence[str]) -> JobReturn:
    ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
    ret._return_value = RuntimeError("its worker process died (killed, or out of memory)")
    return ret


class PoolLauncher(JoblibLauncher):
    """``JoblibLauncher`` that can also stream a whole grid through its workers.

    Args:
        **kwargs: ``joblib.Parallel`` options, as for the joblib launcher (``n_jobs``...).
    """

    def stream(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
               state_dir: Path) -> Iterator[tuple[int, JobReturn | None]]:
        """Run every job, at most ``n_jobs`` at a time, in the given order.

        A worker that dies (SIGKILL, the OOM killer) breaks joblib's pool and takes the
        running jobs with it: those are yielded as failed (their MLflow runs are closed by
        the sweeper's orphan check), and the jobs not started yet go on in a fresh pool.

        Args:
            job_overrides: each job's overrides, in the order they should start.
            initial_job_idx: Hydra job number of the first (``hydra.job.num``, its folder).
            state_dir: an existing folder of this sweep: once ``STOP_FILE`` exists in it,
                jobs not yet started return unstarted; jobs mark their start in it.

        Yields:
            ``(position in job_overrides, JobReturn or None if it never started)``, in the
            order the jobs end.
        """
        from joblib.externals.loky.process_executor import BrokenProcessPool

        pending = dict(enumerate(job_overrides))
        while pending:
            try:
                for i, ret in self._one_pool(pending, initial_job_idx, state_dir):
                    del pending[i]
                    yield i, ret
            except BrokenProcessPool as err:
                log.error("a worker died, the sweep goes on in a fresh pool: %s", err)
                for i in [i for i in pending
                          if (state_dir / f"{initial_job_idx + i}{STARTED}").exists()]:
                    yield i, _died(pending.pop(i))

    def _one_pool(self, jobs: dict[int, Sequence[str]], initial_job_idx: int,
                  state_dir: Path) -> Iterator[tuple[int, JobReturn | None]]:
        from joblib import Parallel, delayed

        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        options = dict(self.joblib) | {"backend": "loky", "return_as": "generator_unordered"}
        _core.process_joblib_cfg(options)
        # One job per call: joblib's automatic batching would group short jobs on one worker.
        options["batch_size"] = 1
        # debug: the sweeper's own lines say what runs; a [HYDRA] terminal line adds nothing
        log.debug("streaming %d jobs through joblib (n_jobs=%s)", len(jobs),
                  options.get("n_jobs"))
        state = Singleton.get_state()
        calls = (delayed(_run_unless_stopped)(initial_job_idx + i, overrides, str(state_dir),
                                              self.hydra_context, self.config,
                                              self.task_function, state)
                 for i, overrides in list(jobs.items()))
        for idx, ret in Parallel(**options)(calls):
            yield idx - initial_job_idx, ret
