"""Issue 46: runs planted into the store against the sweep (``stability sweep``).

A malformed run of the experiment is one bad run, never the end of every later sweep: real
SQLite store, the runs planted through the MLflow client, the real command in-process.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from stability.tracking.contract import Tag
from tests.helpers.in_process import in_process
from tests.helpers.stores import sqlite_store

TINY = ["data.num_samples=200", "device=cpu", "train.epochs=1", "clip.enabled=false",
        "precision=fp32", "train.accum_steps=1", "hydra/launcher=basic"]


@pytest.mark.slow
def test_a_malformed_seed_or_heartbeat_stops_no_sweep(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 10: a FINISHED run tagged ``stability.seed=zero`` (``queries.point_of``) and a
    RUNNING sweep run with ``stability.heartbeat=99999999999999999999`` (``orphans.
    stale_reason``: errno 75) each stopped every later sweep of the experiment."""
    from stability.tracking.orphans import heartbeat_of, process_gone
    from stability.tracking.queries import point_of

    uri = sqlite_store(tmp_path / "mlflow.db")
    c = MlflowClient(uri)
    exp_id = c.create_experiment("p10", artifact_location=(tmp_path / "art").as_uri())
    bad_seed = c.create_run(exp_id, tags={Tag.KIND: "train", Tag.FINGERPRINT: "abc",
                                          Tag.SEED: "zero", Tag.OUTCOME: "finished"})
    c.set_terminated(bad_seed.info.run_id)
    bad_beat = c.create_run(exp_id, tags={Tag.KIND: "sweep", Tag.SWEEP_ID: "old",
                                          Tag.HEARTBEAT: "99999999999999999999",
                                          Tag.PROCESS: "h:99999999999999999999"},
                        start_time=int(time.time() * 1000) - 3_600_000)  # an hour ago
    done = in_process(["sweep", "-m", *TINY, "seed=0", f"tracking.uri={uri}",
                       "tracking.experiment=p10", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                      capsys)
    assert done.code == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert c.get_run(bad_beat.info.run_id).info.status == "KILLED"  # its start time is old
    assert point_of(c.get_run(bad_seed.info.run_id)) is None
    assert heartbeat_of(c.get_run(bad_beat.info.run_id)) == bad_beat.info.start_time
    assert not process_gone(f"{__import__('socket').gethostname()}:99999999999999999999")
    runs = c.search_runs([exp_id], "tags.`stability.kind` = 'train' and "
                                   "attributes.status = 'FINISHED'")
    assert len(runs) == 2  # the sweep's own run trained
