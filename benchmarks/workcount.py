"""The work one run does, counted instead of timed: torch ops, host reads, Python calls.

    PYTHONPATH=. python -m benchmarks.workcount                 # the default run, 2 epochs
    PYTHONPATH=. python -m benchmarks.workcount telemetry.update_ratio=false

On shared cores a run's time scatters by ±20% from one minute to the next, so a timed A/B of
two commits cannot resolve a few percent. Counts can: the same config does the same work
whatever the load. Run this module from two checkouts (``git worktree add``) with the same
overrides and compare the counts. ``aten`` counts every operator dispatched (a TorchDispatchMode
sees each ATen call once, fused ``_foreach`` ops included); ``host_reads`` counts
``aten._local_scalar_dense`` (``.item()``, ``float(t)``) plus ``Tensor.tolist`` calls (which a
CPU tensor serves without dispatching): each one waits for the device;
``python_calls`` counts the Python function calls of the training thread (cProfile).
Tracking is off: what the run's own loop does, not what MLflow's store does.
"""

from __future__ import annotations

import collections
import cProfile
import json
import pstats
import sys
import tempfile
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks import PROJECT_ROOT
from stability.core.config import to_run_config
from stability.core.loop import train

HOST_READ = "aten._local_scalar_dense.default"


class _OpCounter(TorchDispatchMode):
    """Counts each ATen operator call by name, then runs it unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def count(overrides: list[str]) -> dict[str, Any]:
    """Counts of one run of the default config with ``overrides`` (tracking off).

    Args:
        overrides: Hydra-style ``key=value`` overrides (default: ``train.epochs=2``).

    Returns:
        ``steps`` (optimizer steps), ``aten``, ``host_reads``, ``python_calls`` and the ten
        most frequent operators.
    """
    with tempfile.TemporaryDirectory() as out:
        with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
            raw = compose("config", overrides=["train.epochs=2", "tracking.enabled=false",
                                                f"output_dir={out}", *overrides])
        cfg = to_run_config(raw)
        counter, profile = _OpCounter(), cProfile.Profile()
        tolist, lists = torch.Tensor.tolist, collections.Counter()

        def counted_tolist(t: torch.Tensor):  # noqa: ANN202
            lists["tolist"] += 1
            return tolist(t)

        torch.Tensor.tolist = counted_tolist
        try:
            with counter:
                profile.enable()
                result = train(cfg)
                profile.disable()
        finally:
            torch.Tensor.tolist = tolist
        steps = len(result.csv_path.read_text().splitlines()) - 1
    calls = sum(stat[1] for stat in pstats.Stats(profile).stats.values())
    return {"overrides": overrides, "steps": steps, "aten": sum(counter.ops.values()),
            "host_reads": counter.ops[HOST_READ] + lists["tolist"], "python_calls": calls,
            "top_ops": dict(counter.ops.most_common(10))}


if __name__ == "__main__":
    print(json.dumps(count(sys.argv[1:]), indent=1))
