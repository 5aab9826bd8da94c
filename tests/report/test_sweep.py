"""End to end: a real tiny sweep (real training, real MLflow server), then experiments/report.py.

The runs are trained in-process with ``stability.sweep.job.train_tracked`` under one sweep id and a
parent run created here, exactly as the sweeper tags them; one config really diverges (an inf
gradient at step 1 with a monitor that aborts on the first skip).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from stability.core.config import to_run_config
from stability.core.identity import fingerprint
from stability.sweep.job import train_tracked
from stability.tracking.uri import ensure_experiment

pytestmark = [pytest.mark.slow, pytest.mark.server]

PROJECT = Path(__file__).resolve().parents[2]
EXPERIMENT = "report-e2e"
SWEEP = "e2e-sweep"
CONFIGS = {
    "fp32 noclip": {"precision": {"name": "fp32"}},
    "bf16 clip": {"precision": {"name": "bf16"},
                  "clip": {"enabled": True, "max_norm": 0.5}},
    "fp16 accum": {"precision": {"name": "fp16", "growth_interval": 100},
                   "train": {"accum_steps": 2}, "fault": {"inf_grad_at_step": 3}},
    "diverges": {"precision": {"name": "fp32"},
                 "fault": {"inf_grad_at_step": 1}, "monitor": {"max_skip_rate": 0.0,
                                                               "abort_after": 1}},
}


def tiny(overrides: dict, seed: int, uri: str, parent: str, out: Path) -> dict:
    raw = {"seed": seed, "device": "cpu", "data": {"num_samples": 300},
           "model": {"hidden_size": 16},
           "tracking": {"uri": uri, "experiment": EXPERIMENT, "sweep_id": SWEEP,
                        "parent_run_id": parent},
           "output_dir": str(out)}
    for key, value in overrides.items():
        raw[key] = raw.get(key, {}) | value if isinstance(value, dict) else value
    raw["train"] = {"epochs": 2} | raw.get("train", {})
    return raw


def test_real_sweep_then_report(mlflow_server, tmp_path):
    uri = mlflow_server.uri
    exp_id = ensure_experiment(uri, EXPERIMENT)
    c = MlflowClient(uri)
    parent = c.create_run(exp_id, run_name=f"sweep {SWEEP}", tags={
        "stability.kind": "sweep", "stability.sweep_id": SWEEP}).info.run_id
    fps = {}
    for name, overrides in CONFIGS.items():
        for seed in (0, 1):
            cfg = to_run_config(tiny(overrides, seed, uri, parent, tmp_path / f"{name}-{seed}"))
            result = train_tracked(cfg)
            assert result.status == ("diverged" if name == "diverges" else "finished")
            fps[name] = fingerprint(cfg)
    c.set_terminated(parent)

    done = subprocess.run(
        [sys.executable, str(PROJECT / "experiments" / "report.py"), f"tracking.uri={uri}",
         f"experiment={EXPERIMENT}", f"output_dir={tmp_path / 'reports'}", "device=cpu",
         "registry.model_name=report-e2e-winner"],
        cwd=tmp_path, env=os.environ | {"MLFLOW_TRACKING_URI": ""}, capture_output=True,
        text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "report finished in" in done.stdout

    folder = tmp_path / "reports" / SWEEP
    summary = pd.read_csv(folder / "summary.csv").set_index("label")
    winner = summary[summary["winner"]]
    assert len(winner) == 1 and winner["fingerprint"].iloc[0] != fps["diverges"]
    diverged = summary[summary["fingerprint"] == fps["diverges"]].iloc[0]
    assert diverged["seeds_diverged"] == 2 and diverged["rank"] == len(summary)
    skipped = summary[summary["fingerprint"] == fps["fp16 accum"]].iloc[0]
    assert skipped["skip_count_mean"] >= 1  # the injected inf gradient was really skipped
    # v2 adds max_norm_advice.png, telemetry.per_layer (on by default) layer_norms.png
    assert len(list((folder / "plots").glob("*.png"))) == 8
    # The heatmap names, for the representative fp16 seed, the parameter the step itself found
    # non-finite (steps.csv's nonfinite_param) on its first such skip.
    md = (folder / "report.md").read_text()
    assert "![Per-layer gradient norms](plots/layer_norms.png)" in md
    # No two configs here differ in one factor only: the factor section says so, no figure.
    assert "## Factor effects (every run, seeds as blocks)" in md
    assert "no factor effects" in md or "| factor | contrast |" in md
    [(seed, name, step)] = re.findall(r"\(seed (\d+)\): first non-finite `([^`]+)` at step (\d+)",
                                      md)
    steps = pd.read_csv(tmp_path / f"fp16 accum-{seed}" / "steps.csv")
    first = steps[steps["skip_reason"] == "nonfinite_grad"].iloc[0]
    assert (name, int(step)) == (first["nonfinite_param"], int(first["step"]))
    assert diverged["stability"] == "unstable" and "diverged" in diverged["stability_reason"]
    assert (folder / "report.html").is_file()

    reports = c.search_runs([exp_id], "tags.`stability.kind` = 'report'")
    assert len(reports) == 1 and reports[0].info.status == "FINISHED"
    win_fp = reports[0].data.tags["stability.chosen"]
    assert win_fp == winner["fingerprint"].iloc[0]
    trains = c.search_runs([exp_id], "tags.`stability.kind` = 'train'")
    with_test = {r.data.tags["stability.fingerprint"] for r in trains
                 if "test_loss" in r.data.metrics}
    assert with_test == {win_fp}
    [version] = c.search_model_versions("name='report-e2e-winner'")
    assert version.tags["winner"] == win_fp
