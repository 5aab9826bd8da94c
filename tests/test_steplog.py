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

from stability.core.config import ClipConfig, PrecisionConfig, RunConfig, TrainConfig
from stability.core.loop import train
from stability.core.steplog import CsvStepWriter, StepLog
from stability.tasks.sign_sum import DataConfig

ROOT = Path(__file__).resolve().parents[1]
FIRST_COLUMNS = ["step", "lr", "grad_l2_pre_clip", "grad_l2_post_clip", "loss", "skipped",
                 "skip_reason", "scaler_scale"]
# The whole header, written out: a column renamed, dropped or moved fails here.
ALL_COLUMNS = [*FIRST_COLUMNS, "epoch", "clipped", "micro_batches", "samples",
               "skips_cumulative", "underflow_frac", "nonfinite_param"]


def _log(step: int, skipped: bool = False, skips: int = 0) -> StepLog:
    return StepLog(step=step, lr=1e-3, grad_l2_pre_clip=2.0, grad_l2_post_clip=1.0, loss=0.5,
                   skipped=skipped, skip_reason="nonfinite_grad" if skipped else "",
                   scaler_scale=65536.0, clipped=not skipped, micro_batches=4, samples=256,
                   skips_cumulative=skips)


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


def test_first_columns_are_the_contract(tmp_path: Path) -> None:
    """The header is the pinned column list, and a row holds every ``StepLog`` field."""
    log = StepLog(step=7, lr=1e-3, grad_l2_pre_clip=2.5, grad_l2_post_clip=1.25, loss=0.75,
                  skipped=True, skip_reason="nonfinite_grad", scaler_scale=512.0, clipped=False,
                  micro_batches=3, samples=96, skips_cumulative=2, underflow_frac=0.125,
                  nonfinite_param="rnn.weight_hh_l0")
    writer = CsvStepWriter(tmp_path / "steps.csv")
    writer.on_step(log, epoch=4)
    writer.close()
    header, row = _rows(tmp_path / "steps.csv")
    assert header == ALL_COLUMNS
    assert dict(zip(header, row, strict=True)) == {
        "step": "7", "lr": "0.001", "grad_l2_pre_clip": "2.5", "grad_l2_post_clip": "1.25",
        "loss": "0.75", "skipped": "1", "skip_reason": "nonfinite_grad", "scaler_scale": "512.0",
        "epoch": "4", "clipped": "0", "micro_batches": "3", "samples": "96",
        "skips_cumulative": "2", "underflow_frac": "0.125", "nonfinite_param": "rnn.weight_hh_l0"}


def test_a_run_without_steps_leaves_the_header(tmp_path: Path) -> None:
    """Closed before any step (a run that failed at once): the file holds the header."""
    writer = CsvStepWriter(tmp_path / "steps.csv")
    writer.close()
    assert _rows(tmp_path / "steps.csv") == [ALL_COLUMNS]


def test_writer_state_cuts_the_file_back_and_continues_it(tmp_path: Path) -> None:
    """``load_state_dict`` of a saved length: later rows go, new ones follow the kept ones."""
    path = tmp_path / "steps.csv"
    writer = CsvStepWriter(path)
    writer.on_step(_log(1), epoch=1)
    state = writer.state_dict()
    writer.on_step(_log(2), epoch=1)  # written after the checkpoint: lost to a kill
    writer.close()
    resumed = CsvStepWriter(path)
    resumed.load_state_dict(state)
    resumed.on_step(_log(3), epoch=2)
    resumed.close()
    rows = _rows(path)
    assert rows[0] == ALL_COLUMNS and [r[0] for r in rows[1:]] == ["1", "3"]
    assert resumed.state_dict() == {"bytes": len(path.read_bytes())}


def test_each_row_is_on_disk_before_the_next_step(tmp_path: Path) -> None:
    """Every on_step is readable by another reader immediately (no close needed)."""
    path = tmp_path / "steps.csv"
    writer = CsvStepWriter(path)
    try:
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
    assert rows[0] == ALL_COLUMNS
    body = rows[1:]
    assert len(body) >= 40
    for row in body:
        assert len(row) == len(ALL_COLUMNS)
        record = dict(zip(ALL_COLUMNS, row, strict=True))
        for key in ("lr", "grad_l2_pre_clip", "grad_l2_post_clip", "loss", "scaler_scale"):
            assert math.isfinite(float(record[key])), (key, row)
        assert record["skipped"] == "0" and record["skip_reason"] == ""
    assert [int(r[0]) for r in body] == list(range(1, len(body) + 1))
