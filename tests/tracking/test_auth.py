"""MLflow authentication on the team stack: no one in who does not belong.

    .venv/bin/pytest tests/tracking/test_auth.py

Runs against ``team_stack`` (tests/conftest.py): ``docker/mlflow-server.sh`` with
``--app-name basic-auth``, its user store in PostgreSQL, default permission READ. The sweep
and report with valid credentials, and the search for the password in everything they leave,
are in tests/test_team_stack.py (same stack, same sweep).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tests.helpers.stack import ADMIN, TeamStack

pytestmark = [pytest.mark.server, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
TINY = ["data.num_samples=200", "train.epochs=1", "device=cpu", "clip.enabled=false",
        "clip.max_norm=1.0", "train.accum_steps=1", "precision=fp32", "seed=0,1"]


def signed_in(monkeypatch: pytest.MonkeyPatch, user: str, password: str) -> None:
    """This process's MLflow client signs in as ``user`` (MLflow reads the variables per call)."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)


def sweep(env: dict[str, str], sweep_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """``python experiments/sweep.py -m`` (tiny grid) with exactly ``env``."""
    return subprocess.run([sys.executable, "experiments/sweep.py", "-m", *TINY, *args,
                           f"hydra.sweep.dir={sweep_dir}"], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_anonymous_requests_are_refused_but_health_is_open(team_stack: TeamStack) -> None:
    r = requests.get(f"{team_stack.uri}/api/2.0/mlflow/experiments/search",
                     params={"max_results": 1}, timeout=30)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"].startswith("Basic")
    wrong = requests.get(f"{team_stack.uri}/api/2.0/mlflow/experiments/search",
                         params={"max_results": 1}, auth=(ADMIN, "not-the-password"), timeout=30)
    assert wrong.status_code == 401
    ok = requests.get(f"{team_stack.uri}/api/2.0/mlflow/experiments/search",
                      params={"max_results": 1}, auth=(ADMIN, team_stack.admin_password),
                      timeout=30)
    assert ok.status_code == 200
    # the compose healthcheck and the SLURM setup line probe /health without credentials
    assert requests.get(f"{team_stack.uri}/health", timeout=30).status_code == 200


def test_a_remembered_password_is_forgotten_when_it_changes_or_its_user_goes(
        team_stack: TeamStack) -> None:
    """The server caches successful password checks for 60 s (docker/mlflow-server.sh): a
    password change or a deletion through the API must still refuse the old password at once."""
    user = f"cached-{uuid.uuid4().hex[:6]}"
    old = team_stack.create_user(user)
    search = f"{team_stack.uri}/api/2.0/mlflow/experiments/search"

    def status(password: str) -> int:
        return requests.get(search, params={"max_results": 1}, auth=(user, password),
                            timeout=30).status_code

    assert status(old) == status(old) == 200  # the second one is served from the cache
    new = "n" + uuid.uuid4().hex[:15]
    code, body = team_stack.api("PATCH", "/api/2.0/mlflow/users/update-password",
                                {"username": user, "password": new})
    assert code == 200, body
    assert (status(old), status(new)) == (401, 200)
    code, body = team_stack.api("DELETE", "/api/2.0/mlflow/users/delete", {"username": user})
    assert code == 200, body
    assert status(new) == 401


def test_a_user_without_permission_cannot_log_to_an_experiment(
        team_stack: TeamStack, monkeypatch: pytest.MonkeyPatch) -> None:
    owner, outsider = f"owner-{uuid.uuid4().hex[:6]}", f"outsider-{uuid.uuid4().hex[:6]}"
    owner_pw, outsider_pw = team_stack.create_user(owner), team_stack.create_user(outsider)
    signed_in(monkeypatch, owner, owner_pw)
    c = MlflowClient(team_stack.uri)
    exp_id = c.create_experiment(f"private-{uuid.uuid4().hex[:6]}")
    run_id = c.create_run(exp_id).info.run_id
    c.log_metric(run_id, "loss", 0.5)

    signed_in(monkeypatch, outsider, outsider_pw)
    # default permission READ: the outsider sees the team's results ...
    assert c.get_run(run_id).data.metrics["loss"] == 0.5
    # ... but cannot write to an experiment nobody granted them
    with pytest.raises(MlflowException, match="Permission denied"):
        c.create_run(exp_id)
    with pytest.raises(MlflowException, match="Permission denied"):
        c.log_metric(run_id, "loss", 9.9)
    signed_in(monkeypatch, owner, owner_pw)
    assert [m.value for m in c.get_metric_history(run_id, "loss")] == [0.5]

    # the owner (MANAGE on what they created) grants EDIT: now the outsider can log
    status, body = team_stack.api("POST", "/api/3.0/mlflow/users/permissions/grant",
                                  {"username": outsider, "resource_type": "experiment",
                                   "resource_id": exp_id, "permission": "EDIT"},
                                  auth=(owner, owner_pw))
    assert status == 200, body
    signed_in(monkeypatch, outsider, outsider_pw)
    c.log_metric(run_id, "loss", 0.25)
    assert [m.value for m in c.get_metric_history(run_id, "loss")] == [0.5, 0.25]


@pytest.mark.parametrize("who", ["wrong password", "no credentials"])
def test_a_refused_sign_in_ends_the_sweep_before_any_run(team_stack: TeamStack, tmp_path: Path,
                                                         who: str) -> None:
    user = f"bob-{uuid.uuid4().hex[:6]}"
    real = team_stack.create_user(user)
    env = team_stack.node_env(user, password="wrong-" + real) if who == "wrong password" else (
        team_stack.node_env(None))
    experiment = f"refused-{uuid.uuid4().hex[:6]}"
    done = sweep(env, tmp_path / "sweep", f"tracking.experiment={experiment}")
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    name = user if who == "wrong password" else "anonymous"
    assert errors[-1].startswith(f"error: authentication failed for {name} at {team_stack.uri}")
    assert len(errors) == 1, errors  # one line, no traceback
    assert "Traceback" not in done.stdout + done.stderr
    assert real not in done.stdout + done.stderr
    # nothing started: no job folder, no experiment, no run
    assert not [p for p in (tmp_path / "sweep").glob("*") if p.is_dir()]
    status, body = team_stack.api("GET", "/api/2.0/mlflow/experiments/get-by-name",
                                  {"experiment_name": experiment})
    assert status == 404, body


def test_credentials_in_the_uri_are_refused_unprinted(team_stack: TeamStack,
                                                      tmp_path: Path) -> None:
    """A URI is printed and recorded with every job: ``user:password@`` must never be in one."""
    env = team_stack.node_env(None)
    host = team_stack.uri.removeprefix("http://")
    done = sweep(env, tmp_path / "sweep", f"tracking.uri=http://{ADMIN}:"
                 f"{team_stack.admin_password}@{host}")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "must not carry credentials" in done.stderr
    assert "MLFLOW_TRACKING_USERNAME" in done.stderr
    assert team_stack.admin_password not in done.stdout + done.stderr


def test_the_pre_flight_names_the_user_and_passes_servers_without_auth(
        team_stack: TeamStack, mlflow_server, monkeypatch: pytest.MonkeyPatch) -> None:
    from stability.tracking.auth import AuthError, check_credentials

    signed_in(monkeypatch, ADMIN, team_stack.admin_password)
    check_credentials(team_stack.uri)  # accepted
    check_credentials(mlflow_server.uri)  # no auth app there (404): nothing to sign in to
    signed_in(monkeypatch, ADMIN, "wrong")
    with pytest.raises(AuthError) as err:
        check_credentials(team_stack.uri)
    assert str(err.value) == f"authentication failed for {ADMIN} at {team_stack.uri}"
