"""The HF example is studied as its README says: sweep, report, and a registered winner that
loads and predicts without this package. (The Lightning example's study, with its
scheduler-on-skip verdict: tests/integrations/test_study.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.in_process import in_process

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "examples" / "hf_task"


def _run(cmd: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{HF}", "MLFLOW_TRACKING_URI": ""}
    return subprocess.run([sys.executable, str(ROOT / "experiments" / f"{cmd}.py"), *args,
                           f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}"], cwd=HF, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_hf_example_study_registers_a_gpt2_that_predicts_logits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep is ``experiments/sweep.py`` in its own process, its runs in the launcher's
    workers; the report calls the same entry point as ``stability report`` in this process
    (``in_process``): the report is what is checked, not its process."""
    pytest.importorskip("transformers")
    import mlflow
    import numpy as np

    from stability.tracking.contract import Tag

    sweep = _run("sweep", tmp_path, "-m", "--config-dir", str(HF), "task=gpt2",
                 "precision=fp32", "clip.enabled=false,true", "seed=0,1", "train.epochs=1",
                 "task.num_samples=200", "tracking.experiment=gpt2-e2e",
                 f"hydra.sweep.dir={tmp_path / 'multirun'}")
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    # the Trainer's progress bars stay off the sweep's terminal (its status lines say enough)
    assert "Writing model shards" not in sweep.stdout + sweep.stderr
    [sweep_id] = re.findall(r"\[sweep\] sweep (\S+): parent run", sweep.stdout + sweep.stderr)
    monkeypatch.chdir(HF)  # `stability report` from the example's folder finds its task
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    report = in_process(["report", "experiment=gpt2-e2e", f"sweep_id={sweep_id}",
                         "task_target=gpt2_task.GPT2Task", f"output_dir={tmp_path / 'reports'}",
                         f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"], capsys)
    assert report.code == 0, report.stderr[-3000:]
    assert "Downloading artifacts" not in report.stdout + report.stderr  # MLflow's bars, off
    c = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.get_experiment_by_name("gpt2-e2e")
    runs = c.search_runs([exp.experiment_id], f"tags.`{Tag.KIND}` = 'train'")
    tested = [r for r in runs if "test_loss" in r.data.metrics]
    assert len(runs) == 4 and len(tested) == 2
    assert all(r.data.metrics["test_loss"] < 3.4 for r in tested)  # below log(28): learned
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model("models:/gpt2-e2e-winner@champion")
    ids = np.zeros((2, 32), dtype=np.int64)
    assert np.asarray(model.predict(ids)).shape == (2, 32, 28)  # logits over the alphabet
