"""Task functions for the worker-pool tests: picklable by reference, no training."""

from __future__ import annotations

import os
import signal
import time

from omegaconf import DictConfig


def sleep_for_seed(cfg: DictConfig) -> int:
    """Sleeps ``seed / 10`` seconds and returns the seed.

    Seed 99 raises KeyboardInterrupt (what a job does on Ctrl-C once it closed its run);
    seed 98 SIGKILLs its own worker process (as the OOM killer would).
    """
    if cfg.seed == 99:
        raise KeyboardInterrupt
    if cfg.seed == 98:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(cfg.seed / 10)
    return int(cfg.seed)
