"""Shared fixtures. Servers are real subprocesses on 127.0.0.1; nothing is mocked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stability.tracking.server import MlflowServer, start_server
from tests.helpers.slurm import SlurmCluster, missing_daemons, start_slurm
from tests.helpers.stack import TeamStack, start_team_stack

# Under ``pytest -n`` (``make test``), the tests that need one of these session fixtures run
# on one xdist worker (``--dist loadgroup``, one group: the SLURM tests need the team stack
# too), so each cluster or stack starts once, not once per worker.
SHARED_FIXTURES = ("slurm_cluster", "team_stack")
SHARED_GROUP = "shared_services"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of the shared session fixtures as one xdist group."""
    for item in items:
        if set(SHARED_FIXTURES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(SHARED_GROUP))


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
