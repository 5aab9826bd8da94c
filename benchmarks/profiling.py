"""cProfile evidence: where the instrumented and the tracked loop spend their time.

``--profile`` writes the top functions by own time for one instrumented and one tracked run
(after the warm-up) to ``profile-*.txt`` and puts the cumulative time of the fixed-cost
pieces (MLflow run creation, setup, checkpoints, artifact upload, teardown) into the JSON.
"""

from __future__ import annotations

import cProfile
import importlib
import io
import os
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (module, function name) -> label of a piece of the fixed cost per run. A profiled function
# is the module's when its resolved file is the module's (never by a suffix of its path).
FIXED_PIECES = {
    ("stability.tracking.run", "__enter__"): "mlflow: create run, tags, params",
    ("stability.tracking.run", "finish"): "mlflow: summary, tags",
    ("stability.tracking.run", "__exit__"): "mlflow: flush, upload artifacts, terminate",
    ("stability.tasks.sign_sum", "make_splits"): "data: generate and split",
    ("stability.core.loop", "write_config"): "config.yaml",
    ("torch.serialization", "save"): "checkpoints (torch.save)",
    ("stability.core.batches", "evaluate_task"): "validation passes (inside epochs)",
    ("stability.core.step", "step"): "TrainStep.step (inside epochs)",
}


def _module_file(module: str) -> str:
    """The resolved file of ``module`` (imported: the profiled run imported it already)."""
    return os.path.realpath(importlib.import_module(module).__file__ or "")


def profile_call(fn: Callable[[], Any], path: Path, top: int = 30) -> dict[str, float]:
    """Profile ``fn()``; write the top ``top`` functions by own time to ``path``.

    Returns:
        Cumulative seconds of each ``FIXED_PIECES`` entry that ran, plus ``total``.
    """
    prof = cProfile.Profile()
    prof.enable()
    try:
        fn()
    finally:
        prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.getvalue())
    pieces: dict[str, float] = {"total": stats.total_tt}
    files = {module: _module_file(module) for module, _ in FIXED_PIECES}
    for (filename, _, func), (_, _, _, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        real = os.path.realpath(filename)
        for (module, name), label in FIXED_PIECES.items():
            if func == name and real == files[module]:
                pieces[label] = pieces.get(label, 0.0) + cumtime
    return pieces
