"""Shared fixtures. Servers are real subprocesses on 127.0.0.1; nothing is mocked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stability.tracking.server import MlflowServer, start_server
from tests.helpers.slurm import SlurmCluster, missing_daemons, start_slurm
from tests.helpers.stack import TeamStack, start_team_stack

# Under ``pytest -n`` (``make test``), the tests that need a shared session fixture run on one
# xdist worker per group (``--dist loadgroup``), so each group starts its services once. Two
# groups, not one: the SLURM tests (which need the team stack too) and the team-stack-only tests
# start on different workers (xdist hands the largest groups out first, one per worker), so
# neither waits for the other's services and tests. The team stack then starts twice, once per
# group's worker: a start costs far less than the SLURM tests the other worker runs meanwhile.
SHARED_GROUPS = {"slurm_cluster": "slurm", "team_stack": "team_stack"}  # first match wins


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of each shared session fixture as one xdist group."""
    for item in items:
        needs = set(getattr(item, "fixturenames", ()))
        group = next((g for fixture, g in SHARED_GROUPS.items() if fixture in needs), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real ``mlflow server`` (SQLite + proxied artifact dir in a temp folder)."""
    server = start_server(tmp_path_factory.mktemp("mlflow-server"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def team_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TeamStack]:
    """docker-compose.yml's stack run natively: PostgreSQL, S3 (moto), MLflow with basic-auth."""
    stack = start_team_stack(tmp_path_factory.mktemp("team-stack"))
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A one-node SLURM cluster with accounting (munged, slurmdbd, slurmctld, slurmd)."""
    missing = missing_daemons()
    assert not missing, f"missing {missing}: make setup-dev (apt-get install slurm-wlm ...)"
    cluster = start_slurm()
    yield cluster
    cluster.stop()
