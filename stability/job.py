"""The job behind ``experiments/sweep.py``: plain mapping in, best validation loss out.

This is the edge: the composed Hydra config arrives as a plain dict, is converted once
to a frozen ``RunConfig``, and a user mistake ends the job with a one-line error and
exit status 2 instead of a traceback.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from stability.config import ConfigError, RunConfig, to_run_config
from stability.run import RunResult, train

log = logging.getLogger(__name__)


def load_run_config(raw: Mapping[str, Any]) -> RunConfig:
    """``to_run_config`` that turns a ``ConfigError`` into a clean exit (status 2)."""
    try:
        return to_run_config(raw)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def run_job(raw: Mapping[str, Any], overrides: Sequence[str] = ()) -> float:
    """Train the configuration in ``raw``; returns its best validation loss (inf if diverged).

    Args:
        raw: the composed config as plain nested dicts.
        overrides: the Hydra override strings of this job (recorded with the run).
    """
    cfg = load_run_config(raw)
    try:
        result: RunResult = train(cfg)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print_summary(result)
    return result.best_val_loss if result.status == "finished" else math.inf


def print_summary(result: RunResult) -> None:
    """One readable block at the end of a run."""
    s = result.summary
    print(
        f"{result.status}: best val_loss {result.best_val_loss:.4f} at epoch {result.best_epoch}, "
        f"clip fraction {s['clip_fraction']:.3f}, skipped steps {s['skip_count']}, "
        f"{result.wall_time_s:.1f}s -> {result.output_dir}"
    )
