"""What a training worker imports: no pandas/pyarrow/scipy when it logs to a tracking server.

Each check runs a fresh interpreter (this one has imported everything already) and reads its
``sys.modules`` at exit. A top-level ``import pandas`` anywhere on the worker's path (our code
or a new MLflow import that bypasses ``stability.tracking.lean``) fails the first test.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from stability.tracking.contract import STEP_METRICS
from stability.tracking.lean import HIDDEN

ROOT = Path(__file__).resolve().parents[1]
# Runs experiments/sweep.py as `python experiments/sweep.py ARGS` does, then prints which of
# the watched libraries the process holds at exit (after the run has ended in MLflow).
WORKER = """
import atexit, json, runpy, sys
WATCHED = {watched!r}
atexit.register(lambda: print("LOADED " + json.dumps(
    [m for m in WATCHED if sys.modules.get(m) is not None]), flush=True))
sys.argv = [{script!r}, *sys.argv[1:]]
runpy.run_path({script!r}, run_name="__main__")
"""
# The trainer integrations' libraries (optional extras): a worker of our own loop never loads them.
TRAINERS = ("lightning", "pytorch_lightning", "transformers", "accelerate")
WATCHED = (*HIDDEN, "sqlalchemy", "alembic", "mlflow", *TRAINERS)
TINY = ["train.epochs=2", "train.batch_size=32", "data.num_samples=300", "seed=3"]


def _worker(args: list[str], cwd: Path, env: dict[str, str] | None = None,
            preamble: str = "") -> tuple[subprocess.CompletedProcess[str], list[str]]:
    code = preamble + WORKER.format(watched=WATCHED, script=str(ROOT / "experiments/sweep.py"))
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600,
                          env=os.environ | {"MLFLOW_TRACKING_URI": "", "PYTHONPATH": str(ROOT)}
                          | (env or {}))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("LOADED ")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc, json.loads(line.removeprefix("LOADED "))


@pytest.mark.slow
@pytest.mark.server
def test_worker_tracking_to_a_server_imports_neither_pandas_nor_pyarrow(mlflow_server,
                                                                        tmp_path: Path) -> None:
    """A run logged to a server: the whole contract reaches MLflow, without pandas & co."""
    exp = f"imports-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "run"
    proc, loaded = _worker([*TINY, f"tracking.uri={mlflow_server.uri}",
                            f"tracking.experiment={exp}", f"hydra.run.dir={out}"], ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "mlflow" in loaded  # MLflow was imported (and used): the check is not vacuous
    assert not set(loaded) & {*HIDDEN, "sqlalchemy", "alembic", *TRAINERS}, loaded

    # The lean MLflow logged everything a run records (docs/TRACKING.md).
    c = MlflowClient(mlflow_server.uri)
    [run] = c.search_runs([c.get_experiment_by_name(exp).experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["stability.outcome"] == "finished"
    assert run.data.params["seed"] == "3" and run.data.params["train.epochs"] == "2"
    with (out / "steps.csv").open() as f:
        n = len(list(csv.DictReader(f)))
    for key in STEP_METRICS:
        steps = sorted(m.step for m in c.get_metric_history(run.info.run_id, key))
        assert steps == list(range(1, n + 1)), key
    names = {a.path for a in c.list_artifacts(run.info.run_id)}
    assert {"steps.csv", "config.yaml", "checkpoints"} <= names
    copy = c.download_artifacts(run.info.run_id, "steps.csv", str(tmp_path / "dl"))
    assert Path(copy).read_bytes() == (out / "steps.csv").read_bytes()


@pytest.mark.slow  # an end-to-end run over a few seconds (pyproject's marker)
def test_our_worker_the_reports_model_flavor_and_the_integrations_package_load_no_trainer(
        ) -> None:
    """The sweep worker's modules, the report's ``mlflow.pytorch`` and ``stability.integrations``
    (with its neutral recorder) import neither Lightning nor transformers; the Lightning module
    does (the check can fail), and MLflow's Lightning autolog still imports afterwards.
    Validating the default optimizer builds none (torch's first build imports torch._dynamo)."""
    watch = f"[m for m in {TRAINERS!r} if sys.modules.get(m) is not None]"
    code = ("import sys\n"
            "import stability.cli, stability.sweep.job, stability.core.loop\n"
            "import stability.tracking.run, stability.integrations.step_recorder\n"
            f"print({watch})\n"
            "from stability.core.optim import OptimConfig\n"
            "OptimConfig()\n"  # validating the default builds no optimizer: no torch._dynamo
            "print('torch._dynamo' in sys.modules)\n"
            "from stability.report.publish.publish import _pytorch_flavor\n"
            f"print(_pytorch_flavor().__name__, {watch})\n"
            "import stability.integrations.lightning\n"
            "print('lightning' in sys.modules)\n"
            "from mlflow.pytorch._lightning_autolog import patched_fit\n"
            "print(patched_fit.__module__)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=os.environ | {"PYTHONPATH": str(ROOT)})
    # make test installs the extras (setup-dev): a missing lightning fails here, not skips
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:5] == ["[]", "False", "mlflow.pytorch []", "True",
                                           "mlflow.pytorch._lightning_autolog"]


@pytest.mark.slow  # an end-to-end run over a few seconds (pyproject's marker)
def test_after_a_lean_import_pandas_still_imports() -> None:
    """Only MLflow's own import runs without pandas: a task's later ``import pandas`` works."""
    code = ("import sys\n"
            "from stability.tracking.lean import import_mlflow\n"
            "import_mlflow(server=True)\n"
            "assert 'mlflow' in sys.modules and sys.modules.get('pandas') is None\n"
            "import pandas, scipy.stats\n"
            "from mlflow.entities import Metric\n"
            "print(pandas.DataFrame({'a': [1]}).shape, Metric('k', 1.0, 0, 1).key)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["(1,", "1)", "k"]


@pytest.mark.slow
def test_without_a_database_store_the_embedded_default_is_a_user_error(tmp_path: Path) -> None:
    """mlflow-skinny has no SQLAlchemy: a run on the embedded store exits 2 naming the key.

    The interpreter is made to lack ``sqlalchemy`` the way an mlflow-skinny install does (the
    import finds nothing); docs/cluster.md's skinny venv gives the same line.
    """
    hide = "import sys\nsys.modules['sqlalchemy'] = None\n"
    proc, loaded = _worker([*TINY, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                           preamble=hide)
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: tracking.uri=null (the embedded store sqlite:///")
    assert "allowed values here are http(s)://host:port" in line
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()
