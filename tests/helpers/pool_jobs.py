"""Task functions for the worker-pool tests: picklable by reference, no training."""

from __future__ import annotations

import time

from omegaconf import DictConfig


def sleep_for_seed(cfg: DictConfig) -> int:
    """Sleeps ``seed / 10`` seconds and returns the seed; seed 99 raises KeyboardInterrupt."""
    if cfg.seed == 99:  # what a job sees on Ctrl-C: it closes its run, then re-raises
        raise KeyboardInterrupt
    time.sleep(cfg.seed / 10)
    return int(cfg.seed)
