"""What a sweep prints: one status area; per-epoch lines in each run's log file, or with -v."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.in_process import in_process

PROJECT = Path(__file__).resolve().parents[2]
TWO_RUNS = ["-m", "+sweep=smoke", "device=cpu", "clip.enabled=false", "train.accum_steps=1",
            "precision=fp32", "seed=0,1", "hydra.launcher.n_jobs=2"]


def sweep(tmp_path: Path, *extra: str, n_jobs: int = 2) -> subprocess.CompletedProcess:
    """``experiments/sweep.py`` on a fresh embedded store in ``tmp_path``, output captured.

    ``n_jobs`` worker processes (each pays for importing torch and MLflow once).
    """
    runs = [*TWO_RUNS[:-1], f"hydra.launcher.n_jobs={n_jobs}"]
    cmd = [sys.executable, str(PROJECT / "experiments" / "sweep.py"), *runs,
           f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
           f"hydra.sweep.dir={tmp_path / 'sweep'}", *extra]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"MLFLOW_TRACKING_URI": ""})


def epoch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "train_loss" in line and "epoch" in line]


@pytest.mark.slow
def test_a_sweep_prints_its_status_not_its_epochs_which_go_to_the_run_logs(
        tmp_path: Path) -> None:
    done = sweep(tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert epoch_lines(out) == []
    assert "finished: best val_loss" not in out and "MLflow run " not in out
    assert len(out.splitlines()) <= 15, out
    # Not a terminal: plain status lines (the first run's end, the sweep's end).
    status = [line for line in done.stdout.splitlines() if line.startswith("[sweep] runs ")]
    assert status[-1].startswith("[sweep] runs 2/2 done, 0 running, 0 failed, 0 skipped;")
    assert "lowest mean so far: fp32 noclip acc=1 (val loss " in status[-1]
    assert "2 seeds" in status[-1]
    for job in ("0", "1"):  # each run's log has its epochs and its result
        log = (tmp_path / "sweep" / job / "sweep.log").read_text()
        assert len(epoch_lines(log)) == 2  # +sweep=smoke: 2 epochs
        assert "finished: best val_loss" in log


@pytest.mark.slow
def test_verbose_brings_the_epoch_lines_back_to_the_terminal(tmp_path: Path) -> None:
    # One worker runs both jobs: -v is read by each job, and a worker's lines reach the
    # terminal the same way whichever worker it is (two workers: the test above).
    done = sweep(tmp_path, "-v", n_jobs=1)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert len(epoch_lines(out)) == 4  # 2 runs x 2 epochs
    assert out.count("finished: best val_loss") == 2


@pytest.mark.parametrize(("override", "message"), [
    ("hydra.sweeper.progress=fancy",
     "error: hydra.sweeper.progress=fancy is invalid: allowed values are auto | live | plain"),
    ("hydra.sweeper.progress_every_s=-1",
     "error: hydra.sweeper.progress_every_s=-1.0 is invalid: allowed values are a number of "
     "seconds >= 0"),
    ("hydra.sweeper.strategy=no.such.Strategy",
     "error: hydra.sweeper.strategy=no.such.Strategy is invalid: allowed values are grid, "
     "adaptive, decide or an importable class module.Class (called as Class(points, make, "
     "settings))"),
    ("hydra.sweeper.strategy=adaptive hydra.sweeper.adaptive.n0=1",
     "error: hydra.sweeper.adaptive.n0=1 is invalid: allowed values are an integer >= 2"),
    ("hydra.sweeper.strategy=adaptive hydra.sweeper.adaptive.margin=big",
     "error: hydra.sweeper.adaptive.margin='big' is invalid: allowed values are a share of the "
     "best config's mean loss (\"5%\") or a loss difference > 0"),
])
def test_a_bad_progress_setting_is_one_line_and_exit_2(
        tmp_path: Path, override: str, message: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    done = in_process(["sweep", *TWO_RUNS, f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}", *override.split()], capsys)
    assert done.code == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip() == message
    assert not (tmp_path / "mlflow.db").exists()  # nothing started


def test_dash_v_is_the_verbose_override_for_both_entry_points() -> None:
    from stability.cli import verbose_argv

    assert verbose_argv(["-m", "-v", "seed=1"]) == ["-m", "hydra.sweeper.verbose=true", "seed=1"]
    assert verbose_argv(["--verbose"]) == ["hydra.sweeper.verbose=true"]
    assert verbose_argv(["-m", "seed=-v"]) == ["-m", "seed=-v"]  # only the flag itself


def test_a_sweep_says_its_axes_and_which_come_from_the_default_study_before_any_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Narrowing three axes keeps the default study's accum and max_norm: the sweep says so."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    done = in_process(["sweep", "-m", "device=cpu", "precision=fp32,bf16",
                       "clip.enabled=false,true", "seed=0,1", "hydra.sweeper.dry_run=true",
                       f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}"], capsys)
    assert done.code == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[:4] == [
        "[sweep] axes given: clip.enabled=false,true, precision=fp32,bf16, seed=0,1",
        "[sweep] axes from the study config (hydra.sweeper.params, not given on the command "
        "line; give key=value to fix one): clip.max_norm=1.0,5.0,10.0, train.accum_steps=1,2,4,8",
        "[sweep] planned: 96 grid points (2 clip.enabled x 3 clip.max_norm x 4 "
        "train.accum_steps x 2 precision x 2 seed)",
        "[sweep] grid: 96 points, 64 after de-duplication (32 duplicates: settings that cannot "
        "matter, e.g. clip.max_norm with clipping off)"]
    assert sum(line.startswith("[sweep] would run: ") for line in lines) == 64
