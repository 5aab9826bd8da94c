"""The benchmark's behaviour on tiny sizes, in process: every part measures what it says and
writes it where the docs say.

No timing is asserted (the machines are shared): only that every figure exists and is finite
(and the accumulation curve's plot draws each of its points),
that what must hold whatever the machine holds (one gradient sync per optimizer step, every
per-step point in the store), and that the JSON and the Markdown tables parse. A hang is cut
off by ``time_limit``.
"""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import accum as accum_part
from benchmarks.cli import main
from stability.tracking.server import MlflowServer

TINY = ["--reps", "1", "--epochs", "2", "--precision-epochs", "1", "--accum-rounds", "1",
        "--num-samples", "300", "--accum-steps", "1"]


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise ``TimeoutError`` in this (the main) thread after ``seconds``: a hang, not a figure."""
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the benchmark ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _bench(out: Path, *args: str, limit_s: int = 240) -> dict[str, Any]:
    threads = torch.get_num_threads()  # the benchmark pins one thread, as a sweep worker
    try:
        with time_limit(limit_s):
            main([*TINY, "--out", str(out), *args])
    finally:
        torch.set_num_threads(threads)
    return json.loads((out / "bench.json").read_text())


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Each table of ``text`` as rows of cells; a malformed table fails the test."""
    tables, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            rows = [[c.strip() for c in row.strip().strip("|").split(" | ")] for row in block]
            assert all(len(r) == len(rows[0]) for r in rows), block
            assert all(c.strip(":-") == "" for c in rows[1]), block[1]  # the alignment row
            tables.append([rows[0], *rows[2:]])
            block = []
    return tables


@pytest.mark.slow  # an end-to-end run over a few seconds (pyproject's marker)
def test_overhead_precision_and_accum_parts_measure_every_figure(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture
                                                                 ) -> None:
    out = tmp_path / "results"
    # Two SQLite stores stand in for the server and the embedded store: no server to start.
    result = _bench(out, "--part", "overhead", "--part", "precision", "--part", "accum",
                    "--tracking-uri", f"sqlite:///{tmp_path / 'server.db'}")
    assert result["parts"] == ["overhead", "precision", "accum"]
    assert result["machine"]["torch_threads"] == 1

    overhead = result["overhead"]
    assert set(overhead["variants"]) == {"bare", "instrumented", "instrumented_per_layer",
                                         "tracked_server", "tracked_sqlite",
                                         "tracked_sqlite_log_batch"}
    for variant in overhead["variants"].values():
        for metric in ("epoch_s", "step_cpu_s", "run_cpu_s"):
            assert _finite(variant[metric]["median"]) and _finite(variant[metric]["ratio_vs_bare"])
    assert overhead["variants"]["bare"]["epoch_s"]["ratio_vs_bare"] == 1.0
    for paired in ("per_layer_vs_instrumented", "sqlite_direct_vs_log_batch"):
        assert all(_finite(overhead[paired][m]["ratio"]) for m in ("epoch_s", "run_cpu_s"))
    assert all(_finite(f["median"]) for f in overhead["fixed_cost_s"].values())
    # every per-step metric of every tracked run reached its store
    assert all(overhead["full_resolution"][s]["all_complete"] for s in ("server", "sqlite"))
    assert all(_finite(v) for v in overhead["store_write"]["cpu_us_per_point"].values())

    assert set(result["precision"]) == {"fp32", "fp16", "bf16"}
    assert all(_finite(p["instrumented_ratio"]) for p in result["precision"].values())
    curve = result["accum"]["curve"]
    assert [p["accum_steps"] for p in curve] == [1, 2, 4, 8, 16]
    assert all(_finite(p["samples_per_s"]) and _finite(p["speedup_vs_1"]) for p in curve)
    # DDP (world size 1): one gradient all-reduce per optimizer step, whatever the accumulation
    assert all(s["hook"] == 1 for s in result["accum"]["grad_syncs"].values())
    assert json.loads((out / "accum-curve.json").read_text())["curve"] == curve
    assert (out / "accum-curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    throughput, latency = accum_part.draw(curve).axes  # what the PNG shows: every point
    assert (throughput.get_title(), latency.get_title()) == ("Training throughput",
                                                             "Optimizer-step latency")
    assert (throughput.get_ylabel(), latency.get_ylabel()) == ("samples / s",
                                                               "median ms per optimizer step")
    (line,) = [ln for ln in throughput.get_lines() if ln.get_marker() == "o"]
    assert list(line.get_xdata()) == [1, 2, 4, 8, 16]
    assert list(line.get_ydata()) == [p["samples_per_s"] for p in curve]
    (line,) = latency.get_lines()
    assert list(line.get_ydata()) == [p["ms_per_optimizer_step"] for p in curve]
    assert curve[0]["speedup_vs_1"] == 1.0

    targets = {t["name"]: t for t in result["targets"]}
    assert {"instrumented_ratio", "per_layer_ratio", "tracked_ratio", "fixed_cost_s",
            "tracked_sqlite_ratio", "tracked_sqlite_cpu_run"} <= set(targets)
    assert all(isinstance(t["met"], bool) and _finite(t["value"]) for t in targets.values())

    text = (out / "bench.md").read_text()
    assert text.strip() in capsys.readouterr().out
    variants, costs, precision, accum = markdown_tables(text)
    assert len(variants) == 1 + 6 and variants[1][0].startswith("Bare PyTorch loop")
    assert [row[0] for row in precision[1:]] == ["fp32", "fp16", "bf16"]
    assert [row[0] for row in accum[1:]] == ["1", "2", "4", "8", "16"]
    assert any(row[0].startswith("Fixed cost per run") for row in costs)


@pytest.mark.slow
@pytest.mark.server
def test_memory_part_reads_each_variants_peak_and_the_lean_import(
        mlflow_server: MlflowServer, tmp_path: Path) -> None:
    result = _bench(tmp_path, "--part", "memory", "--memory-reps", "1",
                    "--tracking-uri", mlflow_server.uri, limit_s=600)
    assert set(result["memory"]) == {"bare", "instrumented", "tracked", "tracked-lean"}
    for mem in result["memory"].values():
        assert mem["peak_rss_mib"] >= mem["rss_after_imports_mib"] > 0
        assert _finite(mem["ratio_vs_bare"])
    # MLflow imported in full pulls pandas; the worker's own (lean) path to a server does not
    assert "pandas" in result["memory"]["tracked"]["loaded"]
    assert not {"pandas", "pyarrow"} & set(result["memory"]["tracked-lean"]["loaded"])


@pytest.mark.slow
@pytest.mark.server
def test_scale_part_measures_ingest_and_the_report_through_mlflow(
        mlflow_server: MlflowServer, tmp_path: Path) -> None:
    result = _bench(tmp_path, "--part", "scale", "--scale-runs", "12", "--scale-writers", "2",
                    "--scale-warm", "1", "--scale-window", "1",
                    "--tracking-uri", mlflow_server.uri, limit_s=600)
    scale = result["scale"]
    assert scale["ingest"]["writers"] == 2 and scale["ingest"]["step_points"] > 0
    assert _finite(scale["ingest"]["step_points_per_s"])
    assert scale["sweep"]["runs"] == 12
    assert scale["report"]["wall_s"] > scale["report"]["build_report_s"] > 0
    # the report's target is set at 10x the default study only; the ingest floor always
    assert [t["name"] for t in result["targets"]] == ["ingest_points_per_s"]
    (costs,) = markdown_tables((tmp_path / "bench.md").read_text())
    assert [row[0].split(" (")[0] for row in costs[1:]] == [
        "Ingest into the tracking server", "The report of a 12-run sweep"]


@pytest.mark.slow
def test_study_part_runs_and_reads_the_sweep(tmp_path: Path) -> None:
    # the smoke preset in fp32 with clipping off only (a command-line override wins over the
    # preset's grid): fp16 epochs cost ~6x fp32 ones here, and one precision proves the same;
    # each run is one epoch. The jobs run in the sweeper's process (hydra/launcher=basic): what
    # this part reads and times is the sweep in MLflow and the command's wall time, whichever
    # launcher ran it, and two worker processes starting cost each study run more than its runs.
    study = _bench(tmp_path, "--part", "study", "--run-study", "--study-runs", "2",
                   "--experiment", "smoke",
                   "--study-overrides", "+sweep=smoke train.epochs=1 precision=fp32 "
                   "clip.enabled=false hydra/launcher=basic",
                   limit_s=900)["study"]
    assert study["runs"] == 2  # 4 grid points, 2 after de-duplication (clip off: one max_norm)
    assert study["epochs_total"] == 2
    # one bare timing per distinct (precision, accum_steps) of the sweep: fp32 x 1/4
    keys = sorted(k.split("/")[:2] for k in study["bare_s_per_epoch"])
    assert keys == [["fp32", "1"], ["fp32", "4"]]
    assert study["ideal_s"] > 0 and study["command_wall_s"] > study["parent_wall_s"] > 0
    # two study runs, each on its own fresh store; the target is judged on the slower one
    runs = study["repeats"]
    assert len(runs) == 2 and runs[0]["sweep_id"] != runs[1]["sweep_id"]
    assert all(r["runs"] == 2 and r["pooled_ideal_s"] >= r["ideal_s"] for r in runs)
    assert study["command_ratio"] == max(r["command_ratio"] for r in runs)
    # the same keys timed with every core busy; the ratios follow from the two ideals
    assert study["saturated_s_per_epoch"].keys() == study["bare_s_per_epoch"].keys()
    assert study["core_contention"] == pytest.approx(
        study["saturated_ideal_s"] / study["ideal_s"])
    assert study["command_ratio_saturated"] == pytest.approx(
        study["command_ratio"] / study["core_contention"])
    assert (tmp_path / "study-2" / "mlflow.db").exists()
    (costs,) = markdown_tables((tmp_path / "bench.md").read_text())
    assert costs[-1][0].startswith("Study run 2/2")


@pytest.mark.parametrize(("args", "message"), [
    (["--reps", "0"], "--reps=0 is invalid: allowed values are an integer >= 1"),
    (["--part", "memory", "--skinny-python", "/nonexistent/python"],
     "--skinny-python=/nonexistent/python is invalid: allowed values are"),
    (["--part", "scale", "--scale-runs", "25"],
     "--scale-runs=25 is invalid: allowed values are 12 x (thresholds + 1)"),
    (["--part", "scale", "--scale-writers", "0"],
     "--scale-writers=0 is invalid: allowed values are an integer >= 1"),
    (["--part", "scale", "--scale-warm", "-1"],
     "--scale-warm=-1.0 is invalid: allowed values are a number of seconds >= 0"),
])
def test_a_bad_option_exits_2_naming_it_before_anything_runs(
        args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_, time_limit(60):
        main([*args, "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bench.json").exists()


@pytest.mark.slow
def test_workcount_sees_the_per_layer_table_read_at_its_flush_not_every_step() -> None:
    """Counted, not timed: per-layer norms stay on the device until the table's flush (each
    epoch's end), so they add a read per flush, not per optimizer step, and some operators;
    the update ratio adds operators but shares that read."""
    from benchmarks.workcount import count

    on, off = count([]), count(["telemetry.per_layer=false"])
    no_ratio = count(["telemetry.update_ratio=false"])
    assert on["steps"] == off["steps"] > 0
    assert 0 < on["host_reads"] - off["host_reads"] <= on["steps"] // 10
    assert no_ratio["host_reads"] == on["host_reads"]
    assert off["aten"] < no_ratio["aten"] < on["aten"]


def test_profile_pieces_are_ours_by_module_file(tmp_path: Path) -> None:
    """``--profile``'s fixed-cost pieces: a function counts for a module when its file is that
    module's resolved file; a user's ``stability/core/batches.py`` with an ``evaluate_task`` (a
    path that ends like ours) is not ours."""
    import importlib.util
    import io

    from benchmarks.profiling import profile_call
    from stability.core.config import RunConfig
    from stability.core.loop import write_config

    fake = tmp_path / "stability" / "core" / "batches.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def evaluate_task():\n    return sum(range(1000))\n")
    spec = importlib.util.spec_from_file_location("users_loop", fake)
    assert spec is not None and spec.loader is not None
    users = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(users)

    def work() -> None:
        users.evaluate_task()
        torch.save(torch.zeros(3), io.BytesIO())
        write_config(RunConfig(), tmp_path / "config.yaml")

    pieces = profile_call(work, tmp_path / "profile.txt")
    assert {"checkpoints (torch.save)", "config.yaml"} <= set(pieces), pieces
    assert "validation passes (inside epochs)" not in pieces, pieces
