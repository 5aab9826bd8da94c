"""One training run end to end: fault injection through ``run.train`` and the CLI example."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from stability.core.config import (
    ClipConfig,
    FaultConfig,
    PrecisionConfig,
    RunConfig,
    TrainConfig,
)
from stability.core.loop import train
from stability.tasks.sign_sum import DataConfig

ROOT = Path(__file__).resolve().parents[2]
K = 3  # faulty optimizer step
MAX_NORM = 1.0


def _train(tmp: Path, precision: str, fault: FaultConfig) -> list[dict[str, str]]:
    """Train on tiny data (clip on) and return steps.csv as dict rows."""
    cfg = RunConfig(
        seed=1, device="cpu", output_dir=str(tmp), data=DataConfig(num_samples=300),
        precision=PrecisionConfig(precision),
        clip=ClipConfig(enabled=True, max_norm=MAX_NORM), fault=fault,
        train=TrainConfig(epochs=1, batch_size=16, accum_steps=2),
    )
    result = train(cfg)
    assert result.status == "finished"
    with result.csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1))
    assert len(rows) > K + 1
    return rows


def _others(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [r for r in rows if int(r["step"]) != K]


# Which check fires is pinned per fault. An inf written into a gradient is caught after
# unscale_ (nonfinite_grad). A x1e8 target spike gives a huge but *finite* BCE loss (about
# -5e6 here: float32 holds it), so the loss check passes; scaled by 2**16 its backward overflows
# fp16's range (65504) and the unscaled gradient is inf: nonfinite_grad too, never
# nonfinite_loss. (In fp32/bf16 the same spike is finite all the way: see the next test.)
@pytest.mark.parametrize(("fault", "reason"), [
    (FaultConfig(inf_grad_at_step=K), "nonfinite_grad"),
    (FaultConfig(loss_spike_at_step=K), "nonfinite_grad"),
], ids=["inf-grad", "spike"])
def test_fp16_faults_take_the_skip_path(tmp_path: Path, fault: FaultConfig, reason: str) -> None:
    """fp16: both faults skip step K for the pinned reason; the next step has half the scale."""
    rows = _train(tmp_path, "fp16", fault)
    bad, after = rows[K - 1], rows[K]
    assert bad["skipped"] == "1"
    assert bad["skip_reason"] == reason
    assert bad["loss"] not in ("inf", "-inf", "nan")  # the loss itself stayed finite
    assert float(after["scaler_scale"]) == float(bad["scaler_scale"]) / 2
    assert float(bad["scaler_scale"]) == float(rows[0]["scaler_scale"]) == 2.0**16
    assert all(r["skipped"] == "0" for r in _others(rows))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_loss_spike_without_scaler_is_a_clipped_norm_spike(tmp_path: Path, precision: str) -> None:
    """fp32/bf16: the spike is taken, not skipped: a huge pre-clip norm clipped to max_norm."""
    rows = _train(tmp_path, precision, FaultConfig(loss_spike_at_step=K))
    bad = rows[K - 1]
    assert bad["skipped"] == "0" and bad["skip_reason"] == ""
    assert bad["clipped"] == "1"
    typical = max(float(r["grad_l2_pre_clip"]) for r in _others(rows))
    assert float(bad["grad_l2_pre_clip"]) > 1000 * typical
    assert float(bad["grad_l2_post_clip"]) == pytest.approx(MAX_NORM, rel=1e-4)
    assert all(r["skipped"] == "0" and r["scaler_scale"] == "1.0" for r in rows)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_inf_grad_without_scaler_is_skipped(tmp_path: Path, precision: str) -> None:
    """fp32/bf16: an inf gradient skips exactly that step as nonfinite_grad."""
    rows = _train(tmp_path, precision, FaultConfig(inf_grad_at_step=K))
    bad = rows[K - 1]
    assert bad["skipped"] == "1" and bad["skip_reason"] == "nonfinite_grad"
    assert bad["nonfinite_param"] == "rnn.weight_ih_l0"
    assert all(r["skipped"] == "0" for r in _others(rows))
    assert rows[-1]["skips_cumulative"] == "1"


@pytest.mark.slow
def test_cli_example_run(tmp_path: Path) -> None:
    """The README example: exits 0, logs each epoch, step 5 skipped, step 6 at half the scale."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "experiments/sweep.py", "precision=fp16", "clip.enabled=true",
         "clip.max_norm=1.0", "train.accum_steps=4", "seed=3", "fault.inf_grad_at_step=5",
         "train.epochs=2", "device=cpu", "tracking.enabled=false", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "epoch  1/2" in output and "epoch  2/2" in output, output
    assert "Traceback" not in output
    with (run_dir / "steps.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows[4]["step"] == "5"
    assert rows[4]["skipped"] == "1" and rows[4]["skip_reason"] == "nonfinite_grad"
    assert float(rows[5]["scaler_scale"]) == float(rows[4]["scaler_scale"]) / 2
    assert sum(r["skipped"] == "1" for r in rows) == 1
    assert {r["epoch"] for r in rows} == {"1", "2"}
    assert (run_dir / "config.yaml").exists()
    assert (run_dir / "checkpoints" / "best.pt").exists()
