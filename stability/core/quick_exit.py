"""Our own processes skip the garbage collector's passes over everything at interpreter exit.

A process that imported torch and MLflow spends about a second of CPU at exit in the cyclic
garbage collector, walking millions of objects it is about to free anyway (docs/performance.md,
"Process exit"). A sweep starts a parent, one process per worker and a report, each paying it;
the test suite starts hundreds. Freezing the tracked objects (``gc.freeze``) in an exit
handler, before the interpreter's final collections, leaves them out of those passes.

Only the entry points of our own processes call ``skip_exit_gc`` (the CLI, the experiments/
scripts, a sweep's job): everything they write is flushed and closed before they return, so no
file or run relies on a cycle's finalizer at exit. A library import never calls it: a user's
own process keeps Python's exit as it is.
"""

from __future__ import annotations

import atexit
import gc

_registered = False


def skip_exit_gc() -> None:
    """Freeze the garbage collector's objects when this process exits (idempotent).

    Registered once; ``atexit`` runs handlers last-in first-out, so the ones registered after
    this call (MLflow's, a run's own) run first, and those registered before still run, only
    without the collector walking the frozen objects afterwards.
    """
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True
