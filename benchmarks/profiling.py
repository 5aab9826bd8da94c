"""cProfile evidence: where the instrumented and the tracked loop spend their time.

``--profile`` writes the top functions by own time for one instrumented and one tracked run
(after the warm-up) to ``profile-*.txt`` and puts the cumulative time of the fixed-cost
pieces (MLflow run creation, setup, checkpoints, artifact upload, teardown) into the JSON.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (file suffix, function name) -> label of a piece of the fixed cost per run.
FIXED_PIECES = {
    ("stability/tracking/run.py", "__enter__"): "mlflow: create run, tags, params",
    ("stability/tracking/run.py", "finish"): "mlflow: summary, tags",
    ("stability/tracking/run.py", "__exit__"): "mlflow: flush, upload artifacts, terminate",
    ("stability/tasks/sign_sum.py", "make_splits"): "data: generate and split",
    ("stability/core/loop.py", "write_config"): "config.yaml",
    ("torch/serialization.py", "save"): "checkpoints (torch.save)",
    ("stability/core/loop.py", "evaluate"): "validation passes (inside epochs)",
    ("stability/core/step.py", "step"): "TrainStep.step (inside epochs)",
}


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
    for (filename, _, func), (_, _, _, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        for (suffix, name), label in FIXED_PIECES.items():
            if func == name and filename.endswith(suffix):
                pieces[label] = pieces.get(label, 0.0) + cumtime
    return pieces
