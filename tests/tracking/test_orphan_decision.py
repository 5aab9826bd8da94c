"""One writer decides a run's end state: the sweep parent versus the run's own SIGTERM close.

``orphans.closing_outcome`` is the parent's decision; the run's own close (``TrackedRun``)
writes KILLED on SIGTERM. Both orderings of the two writes must end the run KILLED when the
scheduler cancelled its job (tests/sweep/test_slurm.py's scancel test is the end-to-end check).
"""

from __future__ import annotations

from stability.sweep.errors import JobLost
from stability.tracking.contract import Outcome
from stability.tracking.orphans import closing_outcome


def _final(order: list[str], scheduler_killed: bool) -> Outcome:
    """Replay the two writers on one run's status in ``order`` (``run`` / ``parent``)."""
    status, outcome = "RUNNING", Outcome.RUNNING
    for writer in order:
        if writer == "run":  # the run's SIGTERM handler: KILLED, whatever the parent wrote
            status, outcome = "KILLED", Outcome.KILLED
        else:
            decided = closing_outcome(status, scheduler_killed, interrupted=False)
            if decided is not None:
                status, outcome = decided.status, decided
    return outcome


def test_a_cancelled_run_ends_killed_whichever_writer_is_last() -> None:
    assert _final(["run", "parent"], scheduler_killed=True) == Outcome.KILLED
    assert _final(["parent", "run"], scheduler_killed=True) == Outcome.KILLED
    assert _final(["parent"], scheduler_killed=True) == Outcome.KILLED  # SIGKILLed mid-close


def test_the_parent_never_overwrites_a_terminal_state() -> None:
    for status in ("KILLED", "FINISHED", "FAILED"):
        assert closing_outcome(status, scheduler_killed=False, interrupted=False) is None
    assert closing_outcome("RUNNING", False, False) == Outcome.FAILED
    assert closing_outcome("RUNNING", False, True) == Outcome.KILLED


def test_a_cancelled_slurm_task_counts_as_killed_by_the_scheduler() -> None:
    assert JobLost("8_0", "CANCELLED by 0").killed
    assert JobLost("8_1", "TIMEOUT").killed
    assert not JobLost("8_2", "OUT_OF_MEMORY").killed
    assert not JobLost("8_3", "FAILED").killed
    assert str(JobLost("8_0", "CANCELLED by 0")) == "SLURM task 8_0: CANCELLED by 0"
