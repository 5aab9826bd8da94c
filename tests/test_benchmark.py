"""Smoke tests: ``experiments/benchmark.py`` runs end to end on tiny data and writes its outputs.

No timing is asserted (the machines are shared): only that every part ran, measured something
real and wrote it where the docs say.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stability.tracking.server import MlflowServer

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--reps", "1", "--epochs", "2", "--accum-rounds", "2", "--num-samples", "300",
        "--accum-steps", "1"]


def _bench(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "experiments/benchmark.py", *TINY, "--out", str(out),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow
@pytest.mark.server
def test_benchmark_default_parts(mlflow_server: MlflowServer, tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = _bench(out, "--tracking-uri", mlflow_server.uri, "--memory-reps", "1")
    result = json.loads((out / "bench.json").read_text())
    assert result["parts"] == ["overhead", "memory", "precision", "accum"]
    assert result["machine"]["torch_threads"] == 1

    overhead = result["overhead"]
    assert set(overhead["variants"]) == {"bare", "instrumented", "instrumented_per_layer",
                                         "tracked_server", "tracked_sqlite",
                                         "tracked_sqlite_log_batch"}
    assert overhead["sqlite_direct_vs_log_batch"]["run_cpu_s"]["ratio"] > 0
    assert overhead["per_layer_vs_instrumented"]["epoch_s"]["ratio"] > 0
    for variant in overhead["variants"].values():
        assert variant["epoch_s"]["median"] > 0
        assert variant["step_cpu_s"]["n"] > 0  # 4 steps an epoch at accum 1: 3 steady-state
    for store in ("server", "sqlite", "sqlite_log_batch"):
        assert overhead["fixed_cost_s"][store]["median"] > 0
    for store in ("server", "sqlite"):  # the SQLite store holds the runs of both routes
        # every per-step metric of every tracked run reached the store
        assert overhead["full_resolution"][store]["all_complete"]

    assert set(result["memory"]) == {"bare", "instrumented", "tracked", "tracked-lean"}
    for mem in result["memory"].values():
        assert mem["peak_rss_mib"] >= mem["rss_after_imports_mib"] > 0
    # MLflow imported in full pulls pandas; the worker's own (lean) path to a server does not
    assert "pandas" in result["memory"]["tracked"]["loaded"]
    assert not {"pandas", "pyarrow"} & set(result["memory"]["tracked-lean"]["loaded"])

    assert set(result["precision"]) == {"fp32", "fp16", "bf16"}

    curve = result["accum"]["curve"]
    assert [p["accum_steps"] for p in curve] == [1, 2, 4, 8, 16]
    assert all(p["samples_per_s"] > 0 for p in curve)
    # DDP (world size 1): one gradient all-reduce per optimizer step, whatever the accumulation
    assert all(s["hook"] == 1 for s in result["accum"]["grad_syncs"].values())
    assert json.loads((out / "accum-curve.json").read_text())["curve"] == curve
    assert (out / "accum-curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    table = (out / "bench.md").read_text()
    assert "| Instrumented: TrainStep" in table and "| Peak RSS, tracked" in table
    assert table.strip() in proc.stdout
    targets = {t["name"] for t in result["targets"]}
    assert {"instrumented_ratio", "per_layer_ratio", "tracked_ratio", "fixed_cost_s",
            "tracked_sqlite_ratio", "tracked_sqlite_cpu_run"} <= targets
    # both routes into SQLite, side by side: MLflow's log_batch costs more CPU a point
    written = overhead["store_write"]["cpu_us_per_point"]
    assert written["mlflow"] > written["direct"] > 0
    assert "MLflow's `log_batch` / `DirectMetrics`" in table
    assert "| Per-layer gradient norms: instrumented + per-layer / instrumented" in table


@pytest.mark.slow
def test_benchmark_study_runs_and_reads_the_sweep(tmp_path: Path) -> None:
    out = tmp_path / "results"
    _bench(out, "--part", "study", "--run-study", "--study-runs", "2", "--experiment", "smoke",
           "--study-overrides", "+sweep=smoke train.epochs=1")
    study = json.loads((out / "bench.json").read_text())["study"]
    assert study["runs"] == 12  # the smoke preset: 16 grid points, 12 after de-duplication
    assert study["epochs_total"] == 12
    # one bare timing per distinct (precision, accum_steps) of the preset: fp32/fp16 x 1/4
    assert len(study["bare_s_per_epoch"]) == 4
    assert study["ideal_s"] > 0 and study["command_wall_s"] > study["parent_wall_s"] > 0
    # two study runs, each on its own fresh store; the target is judged on the slower one
    runs = study["repeats"]
    assert len(runs) == 2 and runs[0]["sweep_id"] != runs[1]["sweep_id"]
    assert all(r["runs"] == 12 and r["pooled_ideal_s"] >= r["ideal_s"] for r in runs)
    assert study["command_ratio"] == max(r["command_ratio"] for r in runs)
    assert (out / "study-2" / "mlflow.db").exists()
    assert "| Study run 2/2" in (out / "bench.md").read_text()


def test_benchmark_rejects_a_bad_option(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "experiments/benchmark.py", "--reps", "0",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert "--reps=0 is invalid: allowed values are an integer >= 1" in proc.stderr


def test_benchmark_rejects_a_skinny_python_that_is_not_one(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "experiments/benchmark.py", "--part", "memory",
                           "--skinny-python", str(tmp_path / "nope"), "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert f"--skinny-python={tmp_path / 'nope'} is invalid: allowed values are" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.browser
def test_benchmark_scale_part_measures_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "experiments/benchmark.py", "--part", "scale",
                           "--scale-runs", "12,24", "--scale-stores", "sqlite",
                           "--scale-writers", "2", "--scale-window", "2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "bench.json").read_text())
    assert result["parts"] == ["scale"]
    scale = result["scale"]
    assert scale["shape"]["step_points_per_run"]["12"] == 2304  # the default study's mean
    store = scale["stores"]["sqlite"]
    # the bulk-built runs have every key, history and artifact a server-written run has
    assert store["shape_check"]["differences"] == 0
    assert [s["runs"] for s in store["sizes"]] == [12, 24]
    for size in store["sizes"]:
        assert size["build"]["runs"] == 12  # each size adds the runs its grid lacks
        assert size["build"]["metric_rows"] > 0 and size["store_mb_after"] > 0
        for window in size["ingest"]:
            assert window["step_points"] > 0 and window["step_points_per_s"] > 0
            assert window["cpu"]["server_cores"] > 0
        assert size["report"]["wall_s"] > size["report"]["build_report_s"] > 0
        assert all(size["ui"][k] > 0 for k in ("runs_page_cold_s", "runs_page_warm_s",
                                                "grouped_s", "chart_s"))
        resume = size["resume"]
        assert resume["finished_points"] == size["runs"]  # the sweeper skipped every run
        assert resume["sweep_wall_s"] > resume["finished_points_s"] > 0
    assert [w["writers"] for w in store["sizes"][0]["ingest"]] == [2]
    assert [w["writers"] for w in store["sizes"][1]["ingest"]] == [8]
    assert store["sizes"][0]["store_cost"]["us_per_point_cpu"] > 0
    assert store["two_workers"]["step_points_per_s"] > 0
    assert {g["name"] for g in scale["goals"]} == {
        "ingest_points_per_s_sqlite", "report_s_sqlite", "report_marginal_growth_sqlite",
        "runs_page_s_sqlite"}
    assert (out / "scale-growth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| SQLite | 24 |" in (out / "bench.md").read_text()


def test_benchmark_scale_rejects_sizes_that_are_not_nested_grids(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "experiments/benchmark.py", "--part", "scale",
                           "--scale-runs", "25", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "--scale-runs=25 is invalid: allowed values are 12 x (thresholds + 1)" in proc.stderr
    assert "Traceback" not in proc.stderr
