"""Our processes skip the collector's exit passes; a library import leaves Python's exit alone."""

from __future__ import annotations

import subprocess
import sys

# An exit handler registered first runs last (atexit is last-in first-out): it sees whether
# the objects were frozen by the time the interpreter finalizes.
PROBE = """
import atexit, gc
atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0, flush=True))
{body}
"""


def _frozen_at_exit(body: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE.format(body=body)], capture_output=True,
                          text=True, timeout=120, check=True)
    return done.stdout.strip()


def test_an_entry_point_of_ours_freezes_the_objects_before_exit() -> None:
    body = ("from stability.core.quick_exit import skip_exit_gc\n"
            "before = atexit._ncallbacks()\n"
            "skip_exit_gc(); skip_exit_gc()\n"
            "assert atexit._ncallbacks() == before + 1")  # idempotent: one handler
    assert _frozen_at_exit(body) == "frozen True"


def test_importing_stability_leaves_the_exit_as_python_has_it() -> None:
    assert _frozen_at_exit("import stability, stability.cli, stability.sweep.job") == (
        "frozen False")
