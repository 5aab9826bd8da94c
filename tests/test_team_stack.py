"""The team stack (docker-compose.yml) run natively: a sweep, the report and the UI against it.

    .venv/bin/pytest tests/test_team_stack.py

``team_stack`` (tests/conftest.py, tests/helpers/stack.py) starts PostgreSQL, moto's S3 server
and ``docker/mlflow-server.sh`` (basic-auth, proxied artifacts to ``s3://<bucket>/``) on
loopback ports. The training processes get only ``MLFLOW_TRACKING_URI`` and an MLflow user:
no S3 endpoint, no AWS key, no AWS config file. What they log is then looked up where it
physically is: rows in PostgreSQL and objects in the bucket.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from stability.core.rundir import CONFIG_NAME, CSV_NAME
from stability.tracking.contract import Kind, Tag
from tests.helpers.signin_proxy import signed_in_proxy
from tests.helpers.stack import TeamStack
from tests.test_ui_browser import CHROMIUM, render

pytestmark = [pytest.mark.server, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[1]
# 2 configs x 2 seeds, tiny data: the report needs two seeds for its intervals
GRID = ["data.num_samples=200", "train.epochs=2", "device=cpu", "clip.enabled=false",
        "clip.max_norm=1.0", "train.accum_steps=1,2", "precision=fp32", "seed=0,1"]
USER = "alice"


def run_script(script: str, args: list[str], env: dict[str, str], cwd: Path,
               timeout: int = 300) -> subprocess.CompletedProcess:
    """``python experiments/<script> ARGS`` with exactly ``env``."""
    return subprocess.run([sys.executable, str(PROJECT / "experiments" / script), *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


class Swept:
    """One sweep and its report on the team stack, shared by this module's tests."""

    def __init__(self, stack: TeamStack, root: Path) -> None:
        self.stack, self.root = stack, root
        self.experiment = f"team-{uuid.uuid4().hex[:8]}"
        self.model = f"team-winner-{uuid.uuid4().hex[:6]}"
        stack.create_user(USER)
        self.env = stack.node_env(USER)
        self.sweep = run_script("sweep.py", ["-m", *GRID, f"tracking.experiment={self.experiment}",
                                             f"hydra.sweep.dir={root / 'sweep'}"],
                                self.env, PROJECT)
        self.report = run_script("report.py", [f"experiment={self.experiment}",
                                               f"output_dir={root / 'reports'}", "device=cpu",
                                               f"registry.model_name={self.model}"],
                                 self.env, root)
        self.client = MlflowClient(stack.uri)
        exp = self.client.get_experiment_by_name(self.experiment)
        self.exp_id = exp.experiment_id if exp else None

    def runs(self, kind: Kind) -> list:
        """This experiment's runs of ``kind``."""
        return self.client.search_runs([self.exp_id], f"tags.`{Tag.KIND}` = '{kind}'")


@pytest.fixture(scope="module")
def swept(team_stack: TeamStack, tmp_path_factory: pytest.TempPathFactory,
          monkeypatch_module: pytest.MonkeyPatch) -> Swept:
    # this test process reads back as admin (the runs belong to alice)
    monkeypatch_module.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch_module.setenv("MLFLOW_TRACKING_PASSWORD", team_stack.admin_password)
    return Swept(team_stack, tmp_path_factory.mktemp("team-sweep"))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_nodes_get_no_s3_settings(swept: Swept) -> None:
    assert swept.env["MLFLOW_TRACKING_URI"] == swept.stack.uri
    leaked = {k for k in swept.env if k.startswith(("AWS_ACCESS", "AWS_SECRET", "MLFLOW_S3"))}
    assert not leaked
    assert swept.env["AWS_SHARED_CREDENTIALS_FILE"] == "/nonexistent"
    assert swept.exp_id is not None, swept.sweep.stderr[-3000:]
    location = swept.client.get_experiment(swept.exp_id).artifact_location
    assert location.startswith("mlflow-artifacts:/"), location  # proxied: the server uploads


def test_sweep_runs_finish_nested_under_the_parent(swept: Swept) -> None:
    assert swept.sweep.returncode == 0, swept.sweep.stderr[-3000:]
    assert "[sweep] finished" in swept.sweep.stdout
    (parent,) = swept.runs(Kind.SWEEP)
    train = swept.runs(Kind.TRAIN)
    assert len(train) == 4
    assert {r.info.status for r in train} == {"FINISHED"}
    assert {r.data.tags["mlflow.parentRunId"] for r in train} == {parent.info.run_id}
    # alice created the experiment, so basic-auth (its user store in PostgreSQL) let her manage it
    grants = swept.stack.postgres.query(swept.stack.dotenv["MLFLOW_AUTH_DB"], (
        "SELECT u.username, p.permission FROM role_permissions p "
        "JOIN user_role_assignments a ON a.role_id = p.role_id JOIN users u ON u.id = a.user_id "
        f"WHERE p.resource_type = 'experiment' AND p.resource_pattern = '{swept.exp_id}'"))
    assert grants == [(USER, "MANAGE")]


def test_runs_and_metrics_are_rows_in_postgres(swept: Swept) -> None:
    stack = swept.stack
    train_ids = {r.info.run_id for r in swept.runs(Kind.TRAIN)}
    rows = stack.sql(f"SELECT r.run_uuid, r.status FROM runs r JOIN experiments e "
                     f"ON r.experiment_id = e.experiment_id WHERE e.name = '{swept.experiment}'")
    assert train_ids <= {run for run, _ in rows}
    assert len(rows) == len(train_ids) + 2  # the sweep's parent and the report run
    in_list = ", ".join(f"'{r}'" for r in sorted(train_ids))
    ((metric_rows,),) = stack.sql(f"SELECT count(*) FROM metrics WHERE run_uuid IN ({in_list})")
    ((loss_rows,),) = stack.sql(f"SELECT count(*) FROM metrics WHERE run_uuid IN ({in_list}) "
                                "AND key = 'loss'")
    steps = sum(len(swept.client.get_metric_history(r, "loss")) for r in train_ids)
    assert loss_rows == steps > 0
    assert metric_rows > loss_rows
    print(f"postgres: {len(rows)} runs, {metric_rows} metric rows for {len(train_ids)} "
          f"training runs; {stack.postgres.version()}")


def test_artifacts_are_objects_in_the_bucket(swept: Swept) -> None:
    keys = swept.stack.s3.keys(swept.stack.bucket)
    mine = [k for k in keys if k.startswith(f"{swept.exp_id}/")]
    for r in swept.runs(Kind.TRAIN):
        prefix = f"{swept.exp_id}/{r.info.run_id}/artifacts/"
        assert f"{prefix}{CSV_NAME}" in mine and f"{prefix}{CONFIG_NAME}" in mine, (prefix, mine)
        assert r.info.artifact_uri.startswith("mlflow-artifacts:/")
    print(f"bucket {swept.stack.bucket}: {len(mine)} objects of this experiment")


def test_report_and_registry_entry_land_on_the_stack(swept: Swept) -> None:
    assert swept.report.returncode == 0, swept.report.stderr[-3000:]
    assert "report finished in" in swept.report.stdout
    (report,) = swept.runs(Kind.REPORT)
    assert report.info.status == "FINISHED"
    (version,) = swept.client.search_model_versions(f"name='{swept.model}'")
    assert version.tags["winner"] == report.data.tags["stability.chosen"]
    keys = swept.stack.s3.keys(swept.stack.bucket)
    assert any(k.startswith(f"{swept.exp_id}/{report.info.run_id}/artifacts/") for k in keys)


def test_the_password_lands_nowhere(swept: Swept) -> None:
    """Not in the run folders, logs, artifacts (the bucket), params, tags or any database row."""
    password = swept.stack.users[USER]
    secrets = {password, base64.b64encode(f"{USER}:{password}".encode()).decode()}
    haystacks = {"sweep output": swept.sweep.stdout + swept.sweep.stderr,
                 "report output": swept.report.stdout + swept.report.stderr}
    files = [p for p in swept.root.rglob("*") if p.is_file()]
    assert any(p.name == CONFIG_NAME for p in files) and any(p.suffix == ".log" for p in files)
    haystacks |= {str(p): p.read_bytes().decode("utf-8", "replace") for p in files}
    s3 = swept.stack.s3.client()
    for key in swept.stack.s3.keys(swept.stack.bucket):
        body = s3.get_object(Bucket=swept.stack.bucket, Key=key)["Body"].read()
        haystacks[f"s3://{swept.stack.bucket}/{key}"] = body.decode("utf-8", "replace")
    runs = [*swept.runs(Kind.TRAIN), *swept.runs(Kind.SWEEP), *swept.runs(Kind.REPORT)]
    assert len(runs) == 6
    for r in runs:
        haystacks[f"run {r.info.run_id}"] = repr(r.data.params) + repr(r.data.tags)
    haystacks["tracking database"] = swept.stack.postgres.dump(swept.stack.dotenv["POSTGRES_DB"])
    assert swept.experiment in haystacks["tracking database"]  # the dump holds the runs
    found = [where for where, text in haystacks.items() for s in secrets if s in text]
    assert not found, found
    assert len(haystacks) > 40  # the search really covered the run folders and the bucket


@pytest.mark.browser
def test_ui_shows_the_sweep_behind_the_login(swept: Swept, tmp_path: Path) -> None:
    assert Path(CHROMIUM).exists(), "install Chromium: apt-get install chromium (make setup-dev)"
    (parent,) = swept.runs(Kind.SWEEP)
    page = f"/#/experiments/{swept.exp_id}/runs"
    anonymous = render(swept.stack.uri + page, tmp_path / "anon")
    assert parent.info.run_name not in anonymous
    assert "sweep " not in anonymous  # no run of any sweep is shown without signing in
    with signed_in_proxy(swept.stack.uri, USER, swept.stack.users[USER]) as proxy:
        signed_in = render(proxy + page, tmp_path / "user")
    assert parent.info.run_name in signed_in
