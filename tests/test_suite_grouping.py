"""``make test`` runs on xdist workers; the tests of a shared service start it once.

``tests/conftest.py`` marks the tests that need the SLURM cluster as one ``xdist_group`` and the
other tests that need the team stack as another; ``--dist loadgroup`` sends each group to one
worker, and the two groups to different workers. Nothing fails when the
grouping silently stops (pytest 9.2 with xdist 3.8 ignores the marks, pytest-xdist#1386): the
services then start once per worker. This runs a tiny suite with our conftest's hook under
``-n 2 --dist loadgroup`` and checks where its tests ran.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a pytest run on two xdist workers of its own: it checks make test's grouping, not the inner loop
pytestmark = pytest.mark.slow

CONFTEST = '''
import pytest
from tests.conftest import pytest_collection_modifyitems  # the hook under test

@pytest.fixture(scope="session")
def team_stack():
    return "stack"

@pytest.fixture(scope="session")
def slurm_cluster():
    return "cluster"
'''
TESTS = '''
import pytest

@pytest.fixture(scope="module")
def swept(team_stack):
    return team_stack

def test_stack_1(team_stack): pass
def test_stack_2(swept): pass
def test_cluster_1(slurm_cluster, team_stack): pass
def test_cluster_2(slurm_cluster): pass
def test_cluster_3(team_stack, slurm_cluster): pass
'''
PLAIN = "\n".join(f"def test_plain_{i}(): pass" for i in range(8))


def test_the_shared_service_tests_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_services.py").write_text(TESTS)
    (tmp_path / "test_plain.py").write_text(PLAIN)
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup",
                           "-v", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED \S+::(test_\w+)", done.stdout)
    assert len(ran) == 13, done.stdout[-3000:]
    stack = {worker for worker, name in ran if name.startswith("test_stack")}
    cluster = {worker for worker, name in ran if name.startswith("test_cluster")}
    # each group on one worker (its services start once there), the two groups on two workers
    assert len(stack) == len(cluster) == 1 and stack != cluster, ran
    assert "@team_stack" in done.stdout and "@slurm" in done.stdout  # node id suffixes
