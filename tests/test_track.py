"""``stability.track``: the docs' plain loop, run as written, then reported (issue 33, item 4)."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def docs_snippet() -> str:
    """The python block of docs/integrations.md's "Any loop" section."""
    text = (ROOT / "docs" / "integrations.md").read_text()
    section = text.split("## Any loop: `stability.track`", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_docs_plain_loop_is_tracked_and_reported(tmp_path: Path) -> None:
    env = os.environ | {"MLFLOW_TRACKING_URI": "", "PYTHONPATH": str(ROOT)}
    code = docs_snippet()
    assert 12 <= len(code.strip().splitlines()) <= 30  # about 15 lines of loop
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=600)
    with (tmp_path / "runs" / "s0" / "steps.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 7  # 420 training samples, batch 64: 7 steps an epoch, 2 epochs
    for r in rows:  # run.step clipped as clip= says
        assert float(r["grad_l2_post_clip"]) <= 1.0 + 1e-6
        assert (r["clipped"] == "1") == (float(r["grad_l2_pre_clip"]) > 1.0)
    import mlflow

    c = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = c.search_runs([c.get_experiment_by_name("stability").experiment_id])
    assert len(runs) == 2 and {r.data.tags["stability.fingerprint"] for r in runs} != set()
    assert len({r.data.tags["stability.fingerprint"] for r in runs}) == 1  # seeds of one config
    for r in runs:
        m = r.data.metrics
        assert r.info.status == "FINISHED" and r.data.params["trainer"] == "plain"
        assert m["optimizer_steps"] == 14 and m["effective_batch"] == 64
        assert m["step_time_median_s"] > 0 and m["grad_syncs"] == 14
        assert 0 < m["best_val_acc"] <= 1 and m["best_epoch"] in (1, 2)
    done = subprocess.run([sys.executable, "-m", "stability.cli", "report"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    assert "winner " in done.stdout and "of sweep my-loop" in done.stdout
