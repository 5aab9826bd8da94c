"""hydra-submitit-launcher's SLURM launcher, except that one lost task does not end the sweep.

Upstream collects the array with ``[job.results()[0] for job in jobs]``: the first task that
wrote no result (``scancel``, a node failure, a setup line that exits, the OOM killer) raises
``UncompletedJobError`` out of the sweep while the other tasks are still running, so the
sweep never closes its parent run nor counts them. Here every task is awaited and a lost one
becomes a FAILED ``JobReturn`` naming its SLURM state and log, which the sweeper counts as
not finished (the run itself was closed KILLED by its job, or is closed by the sweeper).

Hydra instantiates plugins only from ``hydra_plugins`` and imports this module at start-up,
so it stays light (submitit is imported by ``launch``). No ``from __future__ import
annotations``: see hydra_plugins/stability_sweeper.
"""

import logging
import shlex
import time
from collections.abc import Sequence

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

# Seconds between ``sacct`` calls while the sweep awaits a task. submitit alone spaces them by
# half the time since submission (up to 10 minutes), so a task lost an hour into a sweep was
# noticed half an hour later; a task that finished is still seen by its result file, each second.
STATE_POLL_S = 10


def _sh_uri(value: object) -> str:
    """A URI as one shell word, without ``user:password@`` (credentials reach the tasks in
    ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD`` through sbatch's environment, never the
    script file)."""
    from stability.tracking.uri import redact_uri

    return shlex.quote(redact_uri(str(value)))


# ``${stability.sh_uri:${oc.env:VAR}}`` in conf/hydra/launcher/slurm.yaml's setup lines: the
# value is pasted into the sbatch script as one shell word, whatever characters it holds.
OmegaConf.register_new_resolver("stability.sh_uri", _sh_uri, replace=True)


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    """``submitit_slurm`` that awaits every array task and reports lost ones as FAILED."""

    def launch(self, job_overrides: Sequence[Sequence[str]],
               initial_job_idx: int) -> Sequence[JobReturn]:
        """Submit one job array and return one ``JobReturn`` per task, lost ones FAILED."""
        import submitit

        captured: list[list[submitit.Job]] = []
        original = submitit.AutoExecutor.map_array

        def map_array(executor: submitit.AutoExecutor, *args: object) -> list[submitit.Job]:
            captured.append(original(executor, *args))
            return []  # upstream then collects nothing; the jobs are collected below

        # Upstream builds the executor and the array (resources, folders, per-job params);
        # only its collection step is replaced, so the submission stays exactly upstream's.
        submitit.AutoExecutor.map_array = map_array
        try:
            super().launch(job_overrides, initial_job_idx)
        finally:
            submitit.AutoExecutor.map_array = original
        (jobs,) = captured
        return [self._result(job, overrides)
                for job, overrides in zip(jobs, job_overrides, strict=True)]

    @staticmethod
    def _result(job: object, overrides: Sequence[str]) -> JobReturn:
        try:
            _await(job)
            return job.results()[0]  # type: ignore[attr-defined]
        except Exception as err:  # UncompletedJobError, FailedJobError, unpickling errors
            state = job.state  # type: ignore[attr-defined]
            log.error("SLURM task %s ended %s without a result (log: %s): %s", job.job_id,
                      state, job.paths.stdout, str(err).splitlines()[0])
            from stability.sweep.errors import JobLost

            return JobReturn(overrides=list(overrides), status=JobStatus.FAILED,
                             _return_value=JobLost(job.job_id, str(state)))


def _await(job: object, poll_s: float = STATE_POLL_S) -> None:
    """Return once ``job`` wrote its result or SLURM's accounting says it ended.

    Args:
        job: a ``submitit.Job``.
        poll_s: seconds between forced ``sacct`` calls (submitit's own, spaced further and
            further apart, go on in between).
    """
    next_forced = time.monotonic() + poll_s
    while True:
        forced = time.monotonic() >= next_forced
        if job.done(force_check=forced):  # type: ignore[attr-defined]
            return
        if forced:
            next_forced = time.monotonic() + poll_s
        time.sleep(1)
