"""``stability.track``: the docs' plain loop, run as written, then reported with its sealed
test; the config a plain run is rebuilt from."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from stability.core.batches import EvalSettings, evaluate_task, task_of
from stability.core.config import ConfigError, TrackingConfig, to_run_config
from stability.core.identity import fingerprint, flatten
from stability.integrations.track import rebuild_config, track
from stability.tasks.sign_sum import SignSumTask
from tests.helpers.in_process import in_process

ROOT = Path(__file__).resolve().parents[2]


def docs_snippet() -> str:
    """The python block of docs/integrations.md's "Any loop" section."""
    text = (ROOT / "docs" / "integrations.md").read_text()
    section = text.split("## Any loop: `stability.track`", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_docs_plain_loop_is_tracked_and_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The docs' loop runs as the user's own process; ``stability report`` then runs in that
    folder, called in this process (``in_process``: the report is checked, not its process)."""
    env = os.environ | {"MLFLOW_TRACKING_URI": "", "PYTHONPATH": str(ROOT)}
    code = docs_snippet()
    assert 12 <= len(code.strip().splitlines()) <= 30  # about 15 lines of loop
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=600)
    with (tmp_path / "runs" / "s0" / "steps.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 7  # 420 training samples, batch 64: 7 steps an epoch, 2 epochs
    for r in rows:  # run.step clipped as clip= says
        assert float(r["grad_l2_post_clip"]) <= 1.0 + 1e-6
        assert (r["clipped"] == "1") == (float(r["grad_l2_pre_clip"]) > 1.0)
    import mlflow

    c = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = c.search_runs([c.get_experiment_by_name("stability").experiment_id])
    assert len(runs) == 2 and {r.data.tags["stability.fingerprint"] for r in runs} != set()
    assert len({r.data.tags["stability.fingerprint"] for r in runs}) == 1  # seeds of one config
    for r in runs:
        m = r.data.metrics
        assert r.info.status == "FINISHED" and r.data.params["trainer"] == "plain"
        assert m["optimizer_steps"] == 14 and m["effective_batch"] == 64
        assert m["step_time_median_s"] > 0 and m["grad_syncs"] == 14
        assert 0 < m["best_val_acc"] <= 1 and m["best_epoch"] in (1, 2)
    # config= wrote what the report rebuilds the model from; the fingerprint is that config's
    written = yaml.safe_load((tmp_path / "runs" / "s0" / "config.yaml").read_text())
    assert written == {"seed": 0, "task": {"_target_": "stability.tasks.sign_sum.SignSumTask",
                                            "data": "${data}"},
                       "data": {"num_samples": 600},
                       "clip": {"enabled": True, "max_norm": 1.0}}
    assert {r.data.tags["stability.fingerprint"] for r in runs} == {
        fingerprint(to_run_config(written))}
    monkeypatch.chdir(tmp_path)  # the report of the folder's own store, ./mlflow.db
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    done = in_process(["report"], capsys)
    assert done.code == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    assert "chosen " in done.stdout and "of sweep my-loop" in done.stdout
    # The winner's one sealed test: both seeds rebuilt from config.yaml + best.pt and scored
    # on the task's test split, logged onto their runs: seed 0's figures are those of its
    # best weights evaluated here on that split.
    task = SignSumTask(data={"num_samples": 600})
    test_set = task.sealed_test(winner="the test's own check")
    report = (tmp_path / "reports" / "my-loop" / "report.md").read_text()
    line = next(x for x in report.splitlines() if x.startswith("Sealed test"))
    assert f"split of {len(test_set)} sequences" in line and "over 2 seeds" in line, line
    model = task.model()
    model.load_state_dict(torch.load(tmp_path / "runs" / "s0" / "checkpoints" / "best.pt",
                                     weights_only=True))
    want = evaluate_task(task, model, test_set, EvalSettings(precision="fp32", device="cpu"))
    (seed0,) = [r for r in c.search_runs([c.get_experiment_by_name("stability").experiment_id])
                if r.data.params.get("seed") == "0"]
    assert seed0.data.metrics["test_loss"] == pytest.approx(want["loss"], abs=1e-6)
    assert seed0.data.metrics["test_acc"] == pytest.approx(want["acc"], abs=1e-6)


def test_config_names_what_the_report_rebuilds(tmp_path: Path) -> None:
    """``rebuild_config``: the task, its sections, the seed and the settings (nested) as the
    written ``config.yaml``; the config the report reads back from it is the same."""
    cfg, raw = rebuild_config("stability.tasks.sign_sum.SignSumTask", 3,
                              {"precision.name": "bf16", "train.accum_steps": 2},
                              {"data": {"num_samples": 300}})
    assert raw == {"seed": 3, "task": {"_target_": "stability.tasks.sign_sum.SignSumTask",
                                       "data": "${data}"},
                   "data": {"num_samples": 300}, "precision": {"name": "bf16"},
                   "train": {"accum_steps": 2}}
    # the task the report builds from it is the loop's: the same data, so the same splits
    built, own = task_of(cfg), SignSumTask(data={"num_samples": 300})
    assert built.data == own.data
    assert len(built.sealed_test(winner="w")) == len(own.sealed_test(winner="w"))
    flat = flatten(cfg)
    assert (cfg.seed, flat["data.num_samples"], flat["precision.name"],
            flat["train.accum_steps"]) == (3, 300, "bf16", 2)
    assert to_run_config(yaml.safe_load(yaml.safe_dump(raw))) == cfg
    # seeds of one config share the fingerprint, other settings do not
    other, _ = rebuild_config("stability.tasks.sign_sum.SignSumTask", 4,
                              {"precision.name": "bf16", "train.accum_steps": 2},
                              {"data": {"num_samples": 300}})
    third, _ = rebuild_config("stability.tasks.sign_sum.SignSumTask", 3,
                              {"precision.name": "fp32", "train.accum_steps": 2},
                              {"data": {"num_samples": 300}})
    assert fingerprint(other) == fingerprint(cfg) != fingerprint(third)


@pytest.mark.parametrize(("settings", "config", "message"), [
    ({"my_knob": 1}, {}, "settings key 'my_knob' is invalid: allowed values are dotted"),
    ({"clip.enabled": True, "my.knob": 0.9}, {},
     "settings key 'my.knob' is invalid with config=: allowed values are the run "
     "config's dotted keys"),
    ({"optim.momentum": 0.9}, {}, "unknown key optim.momentum: allowed keys are"),
    ({"clip.max_norm": -1.0}, {}, "clip.max_norm"),
    ({}, {"data": 600}, "config['data']=600 is invalid: allowed values are a mapping"),
])
def test_a_config_that_cannot_describe_the_run_is_refused_before_it_starts(
        tmp_path: Path, settings: dict, config: dict, message: str) -> None:
    """One line naming the key, and nothing recorded: no folder, no MLflow run."""
    where = TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(ConfigError, match=re.escape(message)) as err, track(
            tmp_path / "run", task="stability.tasks.sign_sum.SignSumTask", sweep_id="s",
            settings=settings, config=config, tracking=where):
        pytest.fail("the block ran")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()
