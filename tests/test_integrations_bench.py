"""The callbacks' overhead benchmark runs and reports every paired ratio (no timing asserted)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("lightning.pytorch")
pytest.importorskip("transformers")


@pytest.mark.slow
def test_the_overhead_benchmark_reports_each_pair(tmp_path: Path) -> None:
    from benchmarks.integrations import PAIRS, run

    result = run(reps=1, epochs=1, out=tmp_path)
    assert set(result["paired_ratios"]) == {f"{a}/{b}" for a, b in PAIRS}
    for name, ratios in result["paired_ratios"].items():
        assert ratios["fit_s"] > 0 and math.isfinite(ratios["fit_s"]), name
    # The callback's own methods ran, timed, inside the fit: a share of it between 0 and 1.
    assert set(result["hook_share"]) == {"lightning_hooks", "hf_hooks"}
    for name, share in result["hook_share"].items():
        assert 0 < share < 1, name
    # The callback variants wrote their records; the bare and the empty ones did not.
    written = sorted(p.parent.name.split("-")[0] for p in tmp_path.glob("*/steps.csv"))
    assert written == ["hfcb", "hfhooks", "ours", "plcb", "plhooks"]
