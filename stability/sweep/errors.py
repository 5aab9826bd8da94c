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
