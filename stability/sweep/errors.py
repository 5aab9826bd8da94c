"""What a sweep or a job raises when it cannot go on for a reason the user can act on.

Library code raises; ``stability.cli`` turns the exception into its one line and exit status.
"""

from __future__ import annotations


class SweepError(Exception):
    """A sweep or job stopped: ``str(err)`` is the one line for the user.

    Args:
        message: what went wrong, naming the key and its allowed values where one is at fault.
        exit_code: the process's exit status (2: a user mistake; 1: the environment, e.g. an
            unreachable store or a full disk).
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# SLURM job states in which the scheduler (scancel, preemption, the time limit) stopped the
# task from outside: its run was killed, never failed (the task's own SIGTERM handler closes
# it KILLED too, so both possible writers agree whatever order they run in).
SCHEDULER_KILLED = ("CANCELLED", "PREEMPTED", "TIMEOUT", "DEADLINE")


class JobLost(RuntimeError):
    """A launcher's job ended without a result; ``state`` is its scheduler state.

    Args:
        job_id: the scheduler's id of the task.
        state: e.g. ``CANCELLED by 0``, ``OUT_OF_MEMORY``.
    """

    def __init__(self, job_id: str, state: str) -> None:
        super().__init__(f"SLURM task {job_id}: {state}")
        self.state = state

    @property
    def killed(self) -> bool:
        """The scheduler stopped it from outside (``SCHEDULER_KILLED``)."""
        return self.state.split()[0].upper().startswith(SCHEDULER_KILLED) if self.state else False
