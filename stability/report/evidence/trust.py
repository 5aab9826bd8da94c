"""What the report may rebuild from a run: the recorded-config check of ``tracking.trusted``.

It lives in the tracking layer because a sweep checks a FINISHED run it would adopt with the
same rules (``tracking/adoption.py``); the report reads it through this module's names.
"""

from __future__ import annotations

from stability.tracking.trusted import (
    BUILTIN_TASKS,
    HYDRA_KEYS,
    MAX_DATA_ELEMENTS,
    MAX_RECORDED_SIZE,
    SIZED_SECTIONS,
    TRUSTED_OPTIM,
    TRUSTED_SCHEDULE_PREFIX,
    TRUSTED_SCHEDULES,
    Untrusted,
    allowed_tasks,
    read_recorded,
    trusted_config,
)

__all__ = ["BUILTIN_TASKS", "HYDRA_KEYS", "MAX_DATA_ELEMENTS", "MAX_RECORDED_SIZE",
           "SIZED_SECTIONS", "TRUSTED_OPTIM", "TRUSTED_SCHEDULES", "TRUSTED_SCHEDULE_PREFIX",
           "Untrusted", "allowed_tasks", "read_recorded", "trusted_config"]
