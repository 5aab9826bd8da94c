"""The report of a resumed sweep covers its whole grid, runs of the earlier invocation included.

A re-run of a sweep gets a new sweep id and skips the points already FINISHED; those runs keep
the earlier sweep's id, and the report of the latest sweep must still read them
(``Artifact.ADOPTED_RUNS`` on its parent run, ``report.evidence.fetch.adopted_runs``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from stability.tracking.contract import Artifact
from tests.helpers.stores import sqlite_store

TINY = ["+sweep=smoke", "device=cpu"]  # 300 samples, 2 epochs


def train_runs(c: MlflowClient, exp_id: str) -> list:
    return c.search_runs([exp_id], "tags.`stability.kind` = 'train'", max_results=100)


@pytest.mark.slow
def test_the_report_of_a_resumed_sweep_covers_the_runs_it_skipped(tmp_path: Path,
                                                                  monkeypatch) -> None:
    """Seed 0 first, then seeds 0,1 with the same store: the second sweep's report reads all
    four points once, seed 0 with the losses the first invocation recorded."""
    from hydra.core.global_hydra import GlobalHydra

    from stability import cli
    from stability.report import ReportConfig, build_report
    from stability.report.evidence.fetch import fetch_runs, find_sweep

    uri = sqlite_store(tmp_path / "mlflow.db")

    def sweep(seeds: str) -> None:
        monkeypatch.setattr(sys, "argv", [
            "stability-sweep", "-m", *TINY, "hydra/launcher=basic", "clip.enabled=false",
            "train.accum_steps=1,2", "precision=fp32", f"seed={seeds}", f"tracking.uri={uri}",
            "tracking.experiment=resumed", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
        try:
            cli.sweep()
        finally:
            GlobalHydra.instance().clear()

    c = MlflowClient(uri)
    sweep("0")
    exp_id = c.get_experiment_by_name("resumed").experiment_id
    first = {r.info.run_id: r for r in train_runs(c, exp_id)}
    assert len(first) == 2
    sweep("0,1")
    runs = train_runs(c, exp_id)
    assert len(runs) == 4  # seed 0 was skipped, not run again
    later = find_sweep(c, "resumed", None)
    assert {r.data.tags["stability.sweep_id"] for r in first.values()} != {later.sweep_id}
    path = c.download_artifacts(later.parent_run_id, Artifact.ADOPTED_RUNS, str(tmp_path))
    adopted = json.loads(Path(path).read_text())
    assert sorted(adopted) == sorted(first)

    got = fetch_runs(c, later)
    assert sorted(got["run_id"]) == sorted(r.info.run_id for r in runs)  # each point once
    assert len(got.groupby(["fingerprint", "seed"])) == 4
    assert (got["outcome"] == "finished").all()
    for run_id, r in first.items():
        row = got.set_index("run_id").loc[run_id]
        assert row["seed"] == 0
        assert row["best_val_loss"] == r.data.metrics["best_val_loss"]

    out = build_report(ReportConfig(tracking_uri=uri, experiment="resumed", device="cpu",
                                    output_dir=str(tmp_path / "reports"), register=False,
                                    plots=False))
    assert out.sweep_id == later.sweep_id
    summary = pd.read_csv(out.folder / "summary.csv").set_index("fingerprint")
    losses = {fp: sorted(r.data.metrics["best_val_loss"] for r in runs
                         if r.data.tags["stability.fingerprint"] == fp)
              for fp in {r.data.tags["stability.fingerprint"] for r in runs}}
    assert set(summary.index) == set(losses)
    for fp, values in losses.items():
        assert (summary.loc[fp, "seeds_finished"], str(summary.loc[fp, "seed_list"])) == (2, "0 1")
        assert summary.loc[fp, "loss_mean"] == pytest.approx(sum(values) / 2)
