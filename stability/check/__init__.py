"""``stability check``: probes of a training loop's stability mechanics (docs/check.md).

``stability.check.loop(train_step, model, loss_fn, batches, ...)`` checks a loop of one's own
(``stability.check.anyloop``); imported on first use.
"""

from typing import Any


def loop(*args: Any, **kwargs: Any) -> int:
    """``stability.check.anyloop.loop``: every probe on a user's own ``train_step``."""
    from stability.check.anyloop import loop as check_loop

    return check_loop(*args, **kwargs)
