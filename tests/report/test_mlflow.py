"""The report against a real MLflow server: winner, sealed test split, report run, registry.

One fixture sweep with known validation losses (tests/helpers/report_fixtures.py) is reported
twice; the tests read what the two reports left in MLflow and on disk.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from stability.core.identity import fingerprint
from stability.report import ReportConfig, build_report
from stability.report.decide.select import DECISION_RULE, RANKING_RULE, SELECTION_RULE
from stability.report.evidence.fetch import find_sweep
from tests.helpers.report_fixtures import Spec, log_run, make_sweep, run_config
from tests.helpers.stores import sqlite_store

# One xdist group: under ``make test`` (``-n auto --dist loadgroup``) the module's tests run on
# one worker, so the ``reported`` fixture (a sweep reported twice) is built once, not per worker.
pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.xdist_group("report_mlflow")]

EXPERIMENT = "report-known"
SWEEP = "known-1"
MODEL = "report-test-winner"
WINNER = Spec(precision="bf16", clip=1.0, accum=2, losses={0: 0.40, 1: 0.41, 2: 0.42})
BASELINE = Spec(precision="fp32", clip=None, accum=1, losses={0: 0.50, 1: 0.52, 2: 0.51})
LUCKY = Spec(precision="fp16", clip=1.0, accum=1, losses={0: 0.30, 1: 0.31, 2: "diverged"},
             skips=2)  # best seeds, one lost
SHORT = Spec(precision="fp32", clip=0.5, accum=4, losses={0: 0.45, 1: 0.46})  # seed 2 missing
FLAKY = Spec(precision="fp16", clip=None, accum=1, losses={0: 0.60, 1: "failed", 2: 0.61})
SPECS = [BASELINE, WINNER, LUCKY, SHORT, FLAKY]
PROJECT = Path(__file__).resolve().parents[2]


def fp_of(spec: Spec) -> str:
    return fingerprint(run_config(spec, 0, Path(".")))


@pytest.fixture(scope="module")
def reported(mlflow_server, tmp_path_factory):
    """The fixture sweep (plus a superseded failed run of a finished point), reported twice."""
    root = tmp_path_factory.mktemp("report-known")
    ids = make_sweep(mlflow_server.uri, EXPERIMENT, SWEEP, SPECS, root)
    c = MlflowClient(mlflow_server.uri)
    exp_id = c.get_experiment_by_name(EXPERIMENT).experiment_id
    # A resumed sweep: an earlier failed attempt of (baseline, seed 0) must not count.
    log_run(c, exp_id, Spec(precision="fp32", clip=None, accum=1, losses={0: "failed"}), 0,
            root / "old", SWEEP, "")
    cfg = ReportConfig(tracking_uri=mlflow_server.uri, experiment=EXPERIMENT,
                       output_dir=str(root / "reports"), model_name=MODEL, device="cpu")
    first = build_report(cfg)
    second = build_report(cfg)
    summary = pd.read_csv(first.folder / "summary.csv").set_index("fingerprint")
    return {"c": c, "exp_id": exp_id, "ids": ids, "first": first, "second": second,
            "summary": summary}


def train_runs(c: MlflowClient, exp_id: str) -> list:
    return c.search_runs([exp_id], "tags.`stability.kind` = 'train'", max_results=1000)


def test_the_known_winner_is_chosen(reported):
    assert reported["first"].winner == fp_of(WINNER)
    assert reported["first"].sweep_id == SWEEP  # the latest (only) sweep by default
    row = reported["summary"].loc[fp_of(WINNER)]
    assert row["rank"] == 1 and row["winner"]
    assert row["label"] == "bf16 clip=1 acc=2"
    assert row["loss_mean"] == pytest.approx(0.41)


def test_a_config_with_a_diverged_seed_cannot_win_even_with_the_best_seeds(reported):
    lucky = reported["summary"].loc[fp_of(LUCKY)]
    assert lucky["loss_mean"] == math.inf
    assert lucky["seeds_diverged"] == 1 and lucky["rank"] > 1
    flaky = reported["summary"].loc[fp_of(FLAKY)]
    assert flaky["seeds_failed"] == 1 and flaky["loss_mean"] == math.inf


def test_missing_seeds_are_flagged_and_superseded_runs_ignored(reported):
    s = reported["summary"]
    assert s.loc[fp_of(SHORT), "flag"] == "missing seeds 2"
    base = s.loc[fp_of(BASELINE)]
    assert (base["seeds"], base["seeds_finished"], base["seeds_failed"]) == (3, 3, 0)


def test_only_the_winners_runs_carry_test_metrics(reported):
    c, exp_id = reported["c"], reported["exp_id"]
    carrying = {r.info.run_id for r in train_runs(c, exp_id)
                if {"test_loss", "test_acc"} & set(r.data.metrics)}
    winner_runs = {rid for (fp, _), rid in reported["ids"].items() if fp == fp_of(WINNER)}
    assert carrying == winner_runs and len(winner_runs) == 3
    report_run = c.get_run(reported["first"].report_run_id)
    losses = [c.get_run(rid).data.metrics["test_loss"] for rid in winner_runs]
    assert report_run.data.metrics["test_loss_mean"] == pytest.approx(sum(losses) / 3)
    assert all(0 < loss < 10 for loss in losses)


def test_report_folder_and_mlflow_report_run_hold_the_report(reported):
    out, c = reported["first"], reported["c"]
    md = (out.folder / "report.md").read_text()
    assert out.folder.name == SWEEP
    assert DECISION_RULE in md and RANKING_RULE in md and "Train with `bf16 clip=1 acc=2`" in md
    assert "## Factor effects (every run, seeds as blocks)" in md
    pngs = {p.name for p in (out.folder / "plots").glob("*.png")}
    assert {"grad_norm.png", "clip_fraction.png", "val_loss_curves.png", "fp16_scaler.png",
            "skipped_steps.png", "heatmap.png"} <= pngs
    for name in pngs:
        assert f"](plots/{name})" in md
    run = c.get_run(out.report_run_id)
    tags = run.data.tags
    assert tags["stability.kind"] == "report" and tags["stability.sweep_id"] == SWEEP
    assert tags["stability.chosen"] == fp_of(WINNER)
    assert tags["stability.selection_rule"] == SELECTION_RULE
    assert run.info.status == "FINISHED"
    assert {"test_loss_mean", "test_loss_std", "test_acc_mean", "test_acc_std"} <= set(
        run.data.metrics)
    files = {a.path for a in c.list_artifacts(out.report_run_id)}
    plots = {a.path for a in c.list_artifacts(out.report_run_id, "plots")}
    assert {"report.md", "summary.csv"} <= files and f"plots/{'heatmap.png'}" in plots


def test_v2_outputs_verdicts_html_max_norm_tag_and_the_parent_run_note(reported):
    out, c, s = reported["first"], reported["c"], reported["summary"]
    assert s.loc[fp_of(WINNER), "stability"] == "stable"
    assert s.loc[fp_of(LUCKY), "stability"] == "unstable"  # a diverged seed, 2/6 steps skipped
    assert "diverged" in s.loc[fp_of(LUCKY), "stability_reason"]
    files = {a.path for a in c.list_artifacts(out.report_run_id)}
    assert "report.html" in files
    page = (out.folder / "report.html").read_text()
    assert "Train with <code>bf16 clip=1 acc=2</code>" in page and "data:image/png;base64," in page
    md = (out.folder / "report.md").read_text()
    assert "\nStability: The chosen config is stable;" in md and "max_norm_advice.png" in md
    tags = c.get_run(out.report_run_id).data.tags
    assert tags["stability.chosen_stability"] == "stable"
    # Clip-off runs at accum 1 (baseline, flaky fp16): one recommendation.
    assert tags["stability.max_norm_recommendation"].startswith("acc=1:")
    assert tags["stability.model_uri"] == f"models:/{MODEL}@champion"
    parent = c.get_run(c.get_run(out.report_run_id).data.tags["stability.sweep_run_id"]).data.tags
    assert parent["stability.report_run_id"] in {out.report_run_id,
                                                 reported["second"].report_run_id}
    assert parent["stability.chosen"] == fp_of(WINNER)
    note = parent["mlflow.note.content"]
    assert "**Train with `bf16 clip=1 acc=2`**" in note
    assert f"runs/{parent['stability.report_run_id']}/artifactPath/report.html" in note


def test_a_second_report_registers_no_second_version_and_logs_no_duplicates(reported):
    first, second, c = reported["first"], reported["second"], reported["c"]
    assert first.model_created and not second.model_created
    assert first.model_version == second.model_version
    versions = c.search_model_versions(f"name='{MODEL}'")
    assert len(versions) == 1
    v = versions[0]
    assert v.tags["sweep_id"] == SWEEP and v.tags["winner"] == fp_of(WINNER)
    assert float(v.tags["test_loss_mean"]) == pytest.approx(
        c.get_run(first.report_run_id).data.metrics["test_loss_mean"])
    assert v.run_id == reported["ids"][(fp_of(WINNER), 0)]  # lowest validation loss seed
    for (fp, _), rid in reported["ids"].items():
        if fp == fp_of(WINNER):
            assert len(c.get_metric_history(rid, "test_loss")) == 1
    reports = c.search_runs([reported["exp_id"]], "tags.`stability.kind` = 'report'")
    assert {r.info.run_id for r in reports} == {first.report_run_id, second.report_run_id}
    md = (second.folder / "report.md").read_text()
    assert md.count("already logged") == 3


def test_the_winner_loads_as_an_mlflow_model_and_champion_moves_to_the_newest(reported,
                                                                           mlflow_server,
                                                                           tmp_path):
    c, first = reported["c"], reported["first"]
    v = c.get_model_version(MODEL, first.model_version)
    assert c.get_model_version_by_alias(MODEL, "champion").version == first.model_version
    for text in ("bf16 clip=1 acc=2", SWEEP, "seed 0", SELECTION_RULE, "Test (sealed split"):
        assert text in v.description
    predicted = predict_in_fresh_process(mlflow_server.uri, f"models:/{MODEL}@champion", tmp_path)
    assert predicted["n"] == 5
    assert v.source.startswith("models:/m-")  # registered from the logged model
    model = c.get_logged_model(v.model_id or v.source.removeprefix("models:/"))
    assert model.source_run_id == first.report_run_id  # logged by the report run
    # ... in the sweep's experiment (not MLflow's Default one, where team users may only read)
    assert model.experiment_id == c.get_run(first.report_run_id).info.experiment_id != "0"
    # A newer sweep with another winner: a new version, and the alias follows it.
    make_sweep(mlflow_server.uri, "report-newer", "known-2",
               [Spec(precision="fp32", clip=2.0, accum=1, losses={0: 0.2, 1: 0.21}),
                Spec(precision="fp32", clip=None, accum=1, losses={0: 0.3, 1: 0.3})],
               tmp_path)
    newer = build_report(ReportConfig(tracking_uri=mlflow_server.uri, experiment="report-newer",
                                      output_dir=str(tmp_path / "reports"), model_name=MODEL,
                                      device="cpu", plots=False))
    assert newer.sweep_id == "known-2" and newer.model_created
    assert c.get_model_version_by_alias(MODEL, "champion").version == newer.model_version
    assert newer.model_version != first.model_version


def test_latest_sweep_is_the_default(mlflow_server, tmp_path):
    specs = [Spec(precision="fp32", clip=None, accum=1, losses={0: 0.5})]
    make_sweep(mlflow_server.uri, "report-latest", "older", specs, tmp_path)
    make_sweep(mlflow_server.uri, "report-latest", "newer", specs, tmp_path)
    c = MlflowClient(mlflow_server.uri)
    assert find_sweep(c, "report-latest", None).sweep_id == "newer"
    assert find_sweep(c, "report-latest", "older").sweep_id == "older"


def test_report_and_registry_work_on_the_sqlite_store(tmp_path):
    uri = sqlite_store(tmp_path / "mlflow.db")
    make_sweep(uri, "report-sqlite", "sq", [WINNER, BASELINE], tmp_path)
    out = build_report(ReportConfig(tracking_uri=uri, experiment="report-sqlite",
                                    output_dir=str(tmp_path / "reports"), model_name=MODEL,
                                    device="cpu", plots=False))
    assert out.winner == fp_of(WINNER) and out.model_created
    c = MlflowClient(uri)
    [version] = c.search_model_versions(f"name='{MODEL}'")
    assert version.source.startswith("models:/m-")  # a logged MLflow Model, not a folder
    assert c.get_model_version_by_alias(MODEL, "champion").version == version.version
    predicted = predict_in_fresh_process(uri, f"models:/{MODEL}@champion", tmp_path)
    assert predicted["n"] == 5 and predicted["stability_imported"] is False


def predict_in_fresh_process(uri: str, model_uri: str, cwd: Path) -> dict:
    """Load ``model_uri`` with ``mlflow.pyfunc`` in a new interpreter and predict its example."""
    code = (
        "import json, sys, mlflow, numpy as np\n"
        f"m = mlflow.pyfunc.load_model({model_uri!r})\n"
        "x = m.input_example\n"
        "y = np.asarray(m.predict(x))\n"
        "print(json.dumps({'n': int(len(y)), 'shape': list(x.shape), "
        "'finite': bool(np.isfinite(y).all()), "
        "'stability_imported': any(k.startswith('stability') for k in sys.modules)}))\n")
    env = os.environ | {"MLFLOW_TRACKING_URI": uri}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["finite"] and out["shape"][1:] == [30, 1]
    return out
