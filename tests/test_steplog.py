"""steps.csv: the column contract, per-row flushing, determinism and surviving SIGKILL."""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stability.core.config import ClipConfig, DataConfig, PrecisionConfig, RunConfig, TrainConfig
from stability.core.loop import train
from stability.core.steplog import CSV_COLUMNS, CsvStepWriter, StepLog

ROOT = Path(__file__).resolve().parents[1]
FIRST_COLUMNS = ["step", "lr", "grad_l2_pre_clip", "grad_l2_post_clip", "loss", "skipped",
                 "skip_reason", "scaler_scale"]


def _log(step: int, skipped: bool = False, skips: int = 0) -> StepLog:
    return StepLog(step=step, lr=1e-3, grad_l2_pre_clip=2.0, grad_l2_post_clip=1.0, loss=0.5,
                   skipped=skipped, skip_reason="nonfinite_grad" if skipped else "",
                   scaler_scale=65536.0, clipped=not skipped, micro_batches=4, samples=256,
                   skips_cumulative=skips)


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


def test_first_columns_are_the_contract(tmp_path: Path) -> None:
    """The header starts with exactly the eight contract columns, in order."""
    writer = CsvStepWriter(tmp_path / "steps.csv")
    writer.close()
    header = _rows(tmp_path / "steps.csv")[0]
    assert header[:8] == FIRST_COLUMNS
    assert header == CSV_COLUMNS


def test_each_row_is_on_disk_before_the_next_step(tmp_path: Path) -> None:
    """Every on_step is readable by another reader immediately (no close needed)."""
    path = tmp_path / "steps.csv"
    writer = CsvStepWriter(path)
    try:
        assert len(_rows(path)) == 1  # header flushed at creation
        for n in range(1, 4):
            writer.on_step(_log(n, skipped=n == 2, skips=int(n >= 2)), epoch=1)
            rows = _rows(path)
            assert len(rows) == 1 + n
            assert path.read_text().endswith("\n")
    finally:
        writer.close()
    writer.close()  # idempotent
    rows = [dict(zip(rows[0], r, strict=True)) for r in _rows(path)[1:]]
    assert [r["skipped"] for r in rows] == ["0", "1", "0"]
    assert [r["skip_reason"] for r in rows] == ["", "nonfinite_grad", ""]
    assert [r["skips_cumulative"] for r in rows] == ["0", "1", "1"]
    assert [r["clipped"] for r in rows] == ["1", "0", "1"]
    assert float(rows[0]["scaler_scale"]) == 65536.0
    assert math.isnan(float(rows[0]["underflow_frac"]))


def _tiny(tmp: Path, seed: int) -> RunConfig:
    return RunConfig(seed=seed, device="cpu", output_dir=str(tmp),
                     data=DataConfig(num_samples=300),
                     clip=ClipConfig(enabled=True, max_norm=0.5),
                     precision=PrecisionConfig("fp32"),
                     train=TrainConfig(epochs=2, batch_size=16, accum_steps=2))


def test_same_seed_same_config_gives_byte_identical_csv(tmp_path: Path) -> None:
    """fp32, same seed and config: two runs write byte-identical steps.csv."""
    a = train(_tiny(tmp_path / "a", seed=7))
    b = train(_tiny(tmp_path / "b", seed=7))
    c = train(_tiny(tmp_path / "c", seed=8))
    blob = a.csv_path.read_bytes()
    assert blob == b.csv_path.read_bytes()
    assert blob != c.csv_path.read_bytes()
    assert len(blob.splitlines()) == len(c.csv_path.read_bytes().splitlines()) > 10


@pytest.mark.slow
def test_sigkill_leaves_only_complete_consecutive_rows(tmp_path: Path) -> None:
    """SIGKILL mid-run: every line of steps.csv is complete and the steps are 1..n."""
    run_dir = tmp_path / "run"
    log_path = tmp_path / "sweep.log"
    log_file = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "experiments/sweep.py", "train.epochs=200", "tracking.enabled=false",
         "device=cpu", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT,
    )
    csv_path = run_dir / "steps.csv"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if csv_path.exists() and csv_path.read_bytes().count(b"\n") > 40:
                break
            assert proc.poll() is None, f"the run ended early:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.05)
        else:
            pytest.fail("steps.csv never reached 40 rows")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        log_file.close()
    assert proc.returncode == -signal.SIGKILL

    text = csv_path.read_text()
    assert text.endswith("\n")
    rows = list(csv.reader(text.splitlines()))
    assert rows[0] == CSV_COLUMNS
    body = rows[1:]
    assert len(body) >= 40
    for row in body:
        assert len(row) == len(CSV_COLUMNS)
        record = dict(zip(CSV_COLUMNS, row, strict=True))
        for key in ("lr", "grad_l2_pre_clip", "grad_l2_post_clip", "loss", "scaler_scale"):
            assert math.isfinite(float(record[key])), (key, row)
        assert record["skipped"] == "0" and record["skip_reason"] == ""
    assert [int(r[0]) for r in body] == list(range(1, len(body) + 1))
