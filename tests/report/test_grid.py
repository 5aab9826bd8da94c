"""The sweep's own grid (``stability.report.evidence.grid``): a setting that cannot matter for a run
never makes it a stranger to its grid.

The sweep drops ``clip.max_norm`` from a clip-off point's overrides (it cannot matter there:
``core.identity.irrelevant``), so a clip-off run records the default max_norm while the sweep's
clipped runs record the grid's. Issue 54: the report set every clip-off run aside as "not a
point of the sweep's grid" and decided clipping from the clipped runs alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.entities import Param, Run, RunData, RunInfo
from mlflow.tracking import MlflowClient

from stability.core.config import to_run_config
from stability.core.identity import canonical, flatten, irrelevant
from stability.report.evidence import grid
from tests.helpers.stores import sqlite_store

SWEPT = ("clip.enabled", "precision", "seed")


def _run(rid: str, **params: object) -> Run:
    """A run as MLflow returns it: ``params`` as strings (``clip_enabled`` -> ``clip.enabled``)."""
    logged = {k.replace("__", "."): str(v) for k, v in params.items()}
    info = RunInfo(run_id=rid, experiment_id="0", user_id="u", status="FINISHED",
                   start_time=0, end_time=1, lifecycle_stage="active")
    return Run(info, RunData(params=[Param(k, v) for k, v in logged.items()]))


def test_a_clip_off_run_with_the_default_max_norm_is_a_point_of_the_grid() -> None:
    """Clip-off runs record max_norm 1.0, the clipped ones 0.25 (not swept): all count, even
    when the clip-off runs are the majority; a clipped run at another max_norm is still set
    aside (the setting matters for it)."""
    runs = [*(_run(f"off{i}", clip__enabled="False", clip__max_norm=1.0) for i in range(3)),
            *(_run(f"on{i}", clip__enabled="True", clip__max_norm=0.25) for i in range(2))]
    kept, lines = grid.outside(runs, SWEPT, runs)
    assert [r.info.run_id for r in kept] == [r.info.run_id for r in runs] and lines == []
    stranger = _run("on9", clip__enabled="True", clip__max_norm=0.5)
    kept, lines = grid.outside([*runs, stranger], SWEPT, [*runs, stranger])
    assert len(kept) == len(runs) and len(lines) == 1
    assert lines[0].startswith("run on9 set aside: not a point of the sweep's grid: param "
                               "clip.max_norm='0.5' is not swept and the sweep's runs have "
                               "'0.25'"), lines


def test_inert_is_the_rule_the_fingerprint_normalises() -> None:
    """``canonical`` sets exactly ``irrelevant``'s keys to None, for every clip method and
    precision: the sweep's de-duplication and the report's grid read one rule."""
    for clip in ({"enabled": False}, {"enabled": True, "method": "norm"},
                 {"enabled": True, "method": "value"}):
        for precision in ("fp32", "bf16", "fp16"):
            cfg = to_run_config({"clip": clip, "precision": {"name": precision}})
            flat, canon = flatten(cfg), canonical(cfg)
            assert {k for k, v in canon.items() if v is None and flat.get(k) is not None} \
                == irrelevant(flat), (clip, precision)


@pytest.mark.slow
def test_a_real_sweep_whose_clip_off_runs_carry_another_max_norm_counts_every_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real ``stability sweep`` of ``clip.enabled=false,true clip.max_norm=0.25`` (its
    clip-off runs record max_norm 1.0): the report reads all of them."""
    from stability.report.evidence.fetch import fetch_runs, find_sweep
    from tests.helpers.in_process import in_process

    uri = sqlite_store(tmp_path / "mlflow.db")
    done = in_process(["sweep", "-m", "data.num_samples=200", "device=cpu", "train.epochs=1",
                       "clip.enabled=false,true", "clip.max_norm=0.25", "precision=fp32",
                       "train.accum_steps=1", "seed=0,1", "hydra/launcher=basic",
                       f"tracking.uri={uri}", "tracking.experiment=grid",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}"], capsys)
    assert done.code == 0, done.stdout[-2000:] + done.stderr[-2000:]
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name("grid").experiment_id
    runs = c.search_runs([exp_id], "tags.`stability.kind` = 'train'")
    assert sorted((r.data.params["clip.enabled"], r.data.params["clip.max_norm"])
                  for r in runs) == [("False", "1.0")] * 2 + [("True", "0.25")] * 2
    set_aside: list[str] = []
    fetched = fetch_runs(c, find_sweep(c, "grid", None), set_aside=set_aside)
    assert len(fetched) == 4 and set_aside == [], set_aside
