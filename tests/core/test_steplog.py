"""steps.csv: the column contract, per-row flushing, determinism and surviving SIGKILL."""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import FrozenInstanceError, dataclass, fields
from pathlib import Path

import pytest

from stability.core.config import ClipConfig, PrecisionConfig, RunConfig, TrainConfig
from stability.core.loop import train
from stability.core.measure import RECORDED, Measurement, StepMeter, unmeasured
from stability.core.steplog import (
    COLUMN,
    CSV_COLUMNS,
    EPOCH,
    FIXED,
    STEP_METRICS,
    CsvStepWriter,
    SkipReason,
    StepLog,
    build,
    column,
    csv_columns,
    extend,
    flag_fields,
)
from stability.tasks.sign_sum import DataConfig

ROOT = Path(__file__).resolve().parents[2]
FIRST_COLUMNS = ["step", "lr", "grad_l2_pre_clip", "grad_l2_post_clip", "loss", "skipped",
                 "skip_reason", "scaler_scale"]
# The header as written since these columns exist: a column renamed, dropped or moved fails
# here; a new StepLog field (a new per-step quantity) is a new column after them.
ALL_COLUMNS = [*FIRST_COLUMNS, "epoch", "clipped", "micro_batches", "samples",
               "skips_cumulative", "underflow_frac", "nonfinite_param"]


def _header_ok(header: list[str]) -> bool:
    return header == list(CSV_COLUMNS) and header[:len(ALL_COLUMNS)] == ALL_COLUMNS


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
    assert _header_ok(header)
    assert {k: v for k, v in zip(header, row, strict=True) if k in ALL_COLUMNS} == {
        "step": "7", "lr": "0.001", "grad_l2_pre_clip": "2.5", "grad_l2_post_clip": "1.25",
        "loss": "0.75", "skipped": "1", "skip_reason": "nonfinite_grad", "scaler_scale": "512.0",
        "epoch": "4", "clipped": "0", "micro_batches": "3", "samples": "96",
        "skips_cumulative": "2", "underflow_frac": "0.125", "nonfinite_param": "rnn.weight_hh_l0"}


def test_a_run_without_steps_leaves_the_header(tmp_path: Path) -> None:
    """Closed before any step (a run that failed at once): the file holds the header."""
    writer = CsvStepWriter(tmp_path / "steps.csv")
    writer.close()
    [header] = _rows(tmp_path / "steps.csv")
    assert _header_ok(header)


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
    assert _header_ok(rows[0]) and [r[0] for r in rows[1:]] == ["1", "3"]
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
    assert _header_ok(rows[0])
    body = rows[1:]
    assert len(body) >= 40
    for row in body:
        record = dict(zip(CSV_COLUMNS, row, strict=True))
        for key in ("lr", "grad_l2_pre_clip", "grad_l2_post_clip", "loss", "scaler_scale"):
            assert math.isfinite(float(record[key])), (key, row)
        assert record["skipped"] == "0" and record["skip_reason"] == ""
    assert [int(r[0]) for r in body] == list(range(1, len(body) + 1))


# -- the schema: StepLog's fields are the columns and the per-step metrics ------------------

def test_the_header_is_steplogs_fields_with_the_epoch_after_the_fixed_ones() -> None:
    names = [f.name for f in fields(StepLog)]
    fixed = [f.name for f in fields(StepLog) if f.metadata[FIXED]]
    assert fixed == FIRST_COLUMNS == names[:len(fixed)]
    assert list(CSV_COLUMNS) == [*fixed, EPOCH, *names[len(fixed):]]
    assert tuple(COLUMN) == CSV_COLUMNS and COLUMN.grad_l2_pre_clip == "grad_l2_pre_clip"
    with pytest.raises(AttributeError):
        COLUMN.grad_norm  # noqa: B018 - a name that is not a column fails where it is read


def test_bools_are_written_as_0_and_1_and_logged_as_floats() -> None:
    assert flag_fields() == ("skipped", "clipped")
    assert set(flag_fields()) <= set(STEP_METRICS)


@dataclass(frozen=True)
class _Extended(StepLog):
    """A StepLog subclass as a trainer integration declares one: one more column."""

    scheduler_stepped: int = column(default=0)


def test_a_subclass_adds_its_columns_after_ours(tmp_path: Path) -> None:
    assert csv_columns(_Extended) == (*CSV_COLUMNS, "scheduler_stepped")
    writer = CsvStepWriter(tmp_path / "steps.csv", columns=csv_columns(_Extended))
    writer.on_step(extend(_log(3), _Extended, scheduler_stepped=1), epoch=2)
    writer.close()
    header, row = _rows(tmp_path / "steps.csv")
    record = dict(zip(header, row, strict=True))
    assert record["scheduler_stepped"] == "1" and record["step"] == "3"
    assert record["epoch"] == "2" and record["clipped"] == "1"


def test_extend_is_the_subclass_built_from_the_same_values() -> None:
    log = _log(5, skipped=True, skips=2)
    out = extend(log, _Extended, scheduler_stepped=1)
    assert type(out) is _Extended
    assert out == _Extended(**vars(log), scheduler_stepped=1)
    with pytest.raises(FrozenInstanceError):
        out.scheduler_stepped = 0  # type: ignore[misc]
    with pytest.raises(TypeError, match="needs exactly"):
        extend(log, _Extended)
    with pytest.raises(TypeError, match="needs exactly"):
        extend(log, _Extended, scheduler_stepped=1, other=2)
    with pytest.raises(TypeError, match="cannot extend"):
        extend(out, StepLog)


def test_build_is_the_record_built_from_its_init() -> None:
    """``build`` (the meter's record, every step) equals the dataclass built through its
    ``__init__``, stays frozen, and refuses a missing or unknown field."""
    values = vars(_log(7, skipped=True, skips=3)) | {"underflow_frac": 0.25}
    out = build(StepLog, dict(values))
    assert type(out) is StepLog and out == StepLog(**values)
    with pytest.raises(FrozenInstanceError):
        out.loss = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError, match="needs exactly"):
        build(StepLog, {k: v for k, v in values.items() if k != "nonfinite_param"})
    with pytest.raises(TypeError, match="needs exactly"):
        build(StepLog, values | {"other": 1})


def test_the_meter_copies_a_measurement_by_field_name() -> None:
    """A Measurement field named as a StepLog field is that field's value: a new measured
    quantity needs no wiring between ``measure`` and the record."""
    m = Measurement(grad_l2_pre_clip=3.0, grad_l2_post_clip=1.0, loss=0.25, finite=True,
                    clipped=True, scaler_scale=1024.0, underflow_frac=0.5,
                    nonfinite_param="")
    # every field but the two that decide the skip (the gradients, the losses)
    assert set(RECORDED) == {f.name for f in fields(Measurement)} - {"finite", "loss_finite"}
    meter = StepMeter(ClipConfig(enabled=True, max_norm=1.0))
    log = meter.log(step=meter.begin(), lr=0.1, skip=SkipReason.NONE, micro_batches=2,
                    samples=32, measured=m)
    assert {n: getattr(log, n) for n in RECORDED} == {n: getattr(m, n) for n in RECORDED}
    assert (log.step, log.lr, log.skipped, log.skips_cumulative) == (1, 0.1, False, 0)
    over = meter.log(step=meter.begin(), lr=0.1, skip=SkipReason.NONFINITE_GRAD,
                     micro_batches=1, samples=16, measured=m, loss=9.0, grad_l2_post_clip=3.0)
    assert (over.loss, over.grad_l2_post_clip, over.grad_l2_pre_clip) == (9.0, 3.0, 3.0)
    assert (over.skipped, over.skip_reason, over.skips_cumulative) == (True, "nonfinite_grad", 1)


def test_a_step_skipped_before_backward_records_no_norms() -> None:
    meter = StepMeter(ClipConfig(enabled=True, max_norm=1.0))
    log = meter.log(step=meter.begin(), lr=0.1, skip=SkipReason.NONFINITE_LOSS,
                    micro_batches=1, samples=8, measured=unmeasured(math.inf, 512.0))
    assert math.isnan(log.grad_l2_pre_clip) and math.isnan(log.grad_l2_post_clip)
    assert (log.loss, log.scaler_scale, log.clipped, log.nonfinite_param) == (
        math.inf, 512.0, False, "")
    assert math.isnan(log.underflow_frac)
