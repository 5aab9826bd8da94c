"""The two trainer examples run as their READMEs say, and fail as they say (exit 2, one line)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(example: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    folder = ROOT / "examples" / example
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{folder}", "MLFLOW_TRACKING_URI": ""}
    return subprocess.run([sys.executable, "study.py", "--epochs", "1", "--seeds", "0",
                           "--out", str(tmp / "runs"), "--uri", f"sqlite:///{tmp}/mlflow.db",
                           *args], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_lightning_example_records_the_scheduler_stepping_on_skipped_steps(
        tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    proc = _run("lightning_task", tmp_path, "--precisions", "fp16", "--init-scale", "1e9")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("fp16 clip=")]
    assert len(lines) == 3
    with (tmp_path / "runs" / "fp16-clipNone-s0" / "steps.csv").open() as f:
        rows = list(csv.DictReader(f))
    skipped = [r for r in rows if r["skipped"] == "1"]
    assert skipped and all(r["scheduler_stepped"] == "1" for r in skipped)
    assert f"skipped {len(skipped)} (scheduler stepped on {len(skipped)} of them)" in lines[0]


@pytest.mark.slow
def test_hf_example_trains_and_refuses_fp16_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    proc = _run("hf_task", tmp_path, "--precisions", "fp32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "runs" / "fp32-clip0.5-s0" / "layer_norms.csv").exists()
    refused = _run("hf_task", tmp_path / "b", "--precisions", "fp16")
    assert refused.returncode == 2
    [line] = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: precision=fp16 is invalid for the HF Trainer on cpu")
    assert not (tmp_path / "b" / "runs").exists()  # refused before any training
