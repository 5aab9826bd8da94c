"""The GradScaler internals our step uses: restarting its growth streak.

``GradScaler.update(new_scale)`` sets the scale but leaves the count of successive unskipped
steps (``_growth_tracker``) as it was; an overflow found by ``unscale_`` resets it inside
``torch._amp_update_scale_``. A step skipped for a non-finite loss never runs backward, so
``unscale_`` records no overflow: to back off exactly as an overflow would, the step sets the
scale itself and restarts the streak here. torch has no public call for the second half.
"""

from __future__ import annotations

from typing import Any

from stability.compat.gate import VersionGate

GATE = VersionGate(package="torch", low="2.13", below="2.14", module="stability/compat/torch.py",
                   reads="torch.amp.GradScaler._growth_tracker")


def restart_growth_streak(scaler: Any) -> None:
    """Zero ``scaler``'s count of successive unskipped steps (as an overflow in ``update`` does).

    Call after ``scaler.update(new_scale)`` on an enabled scaler that has scaled a loss.

    Raises:
        RuntimeError: this torch's GradScaler keeps no ``_growth_tracker`` tensor.
    """
    GATE.check()
    tracker = getattr(scaler, "_growth_tracker", None)
    if tracker is None or not hasattr(tracker, "zero_"):
        raise RuntimeError(f"{type(scaler).__name__} has no _growth_tracker tensor: "
                           f"{GATE.why_not() or 'its internals changed'}")
    tracker.zero_()
