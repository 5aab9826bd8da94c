"""Shared fixtures. Servers are real subprocesses on 127.0.0.1; nothing is mocked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stability.tracking.server import MlflowServer, start_server
from tests.helpers.stack import TeamStack, start_team_stack


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
