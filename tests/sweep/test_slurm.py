"""Sweeps on a real one-node SLURM cluster (``hydra/launcher=slurm``) against the team stack.

    .venv/bin/pytest tests/sweep/test_slurm.py      # as root, after make setup-dev

``slurm_cluster`` (tests/conftest.py, tests/helpers/slurm.py) runs munged, slurmdbd (on
MariaDB), slurmctld and slurmd from a temp folder; ``team_stack`` is the authenticated MLflow
server on PostgreSQL and S3. The sweep goes through submitit's ``sbatch`` job array, polls
``sacct`` and the training runs log from the SLURM tasks with only ``MLFLOW_TRACKING_URI`` and
an MLflow user in their environment.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from stability.tracking.contract import SCHEDULER_STEPS_ON_SKIP, Kind, Tag
from tests.helpers.load import busy_cores
from tests.helpers.slurm import SlurmCluster
from tests.helpers.stack import TeamStack

pytestmark = [pytest.mark.server, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]
LAUNCHER = ["hydra/launcher=slurm", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=10"]
TINY = ["data.num_samples=200", "device=cpu", "clip.enabled=false", "clip.max_norm=1.0",
        "train.accum_steps=1", "precision=fp32"]
USER = "slurm-user"


def sweep_cmd(experiment: str, sweep_dir: Path, *args: str) -> list[str]:
    """``python experiments/sweep.py -m hydra/launcher=slurm ...``."""
    return [sys.executable, "experiments/sweep.py", "-m", *LAUNCHER, *TINY, *args,
            f"tracking.experiment={experiment}", f"hydra.sweep.dir={sweep_dir}"]


@pytest.fixture(scope="module")
def env(team_stack: TeamStack, slurm_cluster: SlurmCluster) -> dict[str, str]:
    """A login node's shell: SLURM_CONF, the tracking URI and an MLflow user, no S3 setting."""
    if USER not in team_stack.users:
        team_stack.create_user(USER)
    return team_stack.node_env(USER) | {"SLURM_CONF": slurm_cluster.env["SLURM_CONF"]}


@pytest.fixture
def client(team_stack: TeamStack, monkeypatch: pytest.MonkeyPatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", team_stack.users.get(USER, ""))
    return MlflowClient(team_stack.uri)


def runs(client: MlflowClient, experiment: str, kind: Kind) -> list:
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment}"
    return client.search_runs([exp.experiment_id], f"tags.`{Tag.KIND}` = '{kind}'")


def array_job_ids(sweep_dir: Path) -> set[str]:
    """SLURM job ids of the sweep's arrays (submitit's folders are named ``<job>_<task>``)."""
    return {p.name.split("_")[0] for p in (sweep_dir / ".submitit").iterdir()
            if p.is_dir() and p.name.split("_")[0].isdigit() and "_" in p.name}


def test_a_slurm_sweep_runs_every_point_through_sbatch(env, client, slurm_cluster,
                                                       tmp_path: Path) -> None:
    experiment = f"slurm-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(sweep_cmd(experiment, tmp_path, "train.epochs=2", "seed=0,1,2"),
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=400)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:] + slurm_cluster.log()
    assert "[sweep] finished" in done.stdout
    assert "Bypassing sacct error" not in out  # status polling is clean: accounting works
    (parent,) = runs(client, experiment, Kind.SWEEP)
    train = runs(client, experiment, Kind.TRAIN)
    assert len(train) == 3
    assert {r.info.status for r in train} == {"FINISHED"}
    assert {r.data.tags["mlflow.parentRunId"] for r in train} == {parent.info.run_id}
    (job,) = array_job_ids(tmp_path)
    states = slurm_cluster.run("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", job)
    tasks = dict(line.split("|") for line in states.splitlines() if line)
    assert sorted(tasks) == [f"{job}_{i}" for i in range(3)]
    assert set(tasks.values()) == {"COMPLETED"}
    # the password reached the tasks through the environment only: not in the sbatch script,
    # submitit's pickles, the job logs or the run folders
    password = env["MLFLOW_TRACKING_PASSWORD"]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name.endswith("_submission.sh") for p in files)
    assert [str(p) for p in files if password.encode() in p.read_bytes()] == []
    print(f"{slurm_cluster.version()}: array {job} {tasks}")


@pytest.mark.parametrize(("trainer", "module", "example", "task"), [
    ("lightning", "lightning.pytorch", "lightning_task", "spirals.SpiralTask"),
    ("hf", "transformers", "hf_task", "gpt2_task.GPT2Task")])
def test_a_trainer_task_sweeps_through_slurm_like_any_other(env, client, slurm_cluster,
                                                           tmp_path: Path, trainer: str,
                                                           module: str, example: str,
                                                           task: str) -> None:
    """The Lightning and HF examples (``trainer = "lightning"`` / ``"hf"``) through the same
    sbatch job array: every point trained by the trainer in its SLURM task, FINISHED in MLflow
    under the parent, with the trainer's own telemetry (``scheduler_stepped`` in its summary)."""
    pytest.importorskip(module)
    experiment = f"slurm-{trainer}-{uuid.uuid4().hex[:8]}"
    folder = PROJECT / "examples" / example
    # the example's module is imported by the tasks: on their PYTHONPATH
    node = env | {"PYTHONPATH": f"{PROJECT}:{folder}"}
    name = task.split(".")[0].removesuffix("_task")  # spirals | gpt2: task/<name>.yaml
    cmd = sweep_cmd(experiment, tmp_path, f"task={name}", "train.epochs=1", "seed=0,1")
    cmd[2:2] = ["--config-dir", str(folder)]  # an option before the overrides (argparse)
    cmd = [a for a in cmd if not a.startswith("data.")]  # the example has its own data
    done = subprocess.run(cmd, cwd=PROJECT, env=node, capture_output=True, text=True,
                          timeout=400)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:] + slurm_cluster.log()
    assert "[sweep] finished" in done.stdout
    (parent,) = runs(client, experiment, Kind.SWEEP)
    train = runs(client, experiment, Kind.TRAIN)
    assert len(train) == 2, out[-4000:]
    assert {r.info.status for r in train} == {"FINISHED"}, out[-4000:]
    assert {r.data.tags["mlflow.parentRunId"] for r in train} == {parent.info.run_id}
    assert {r.data.params["task._target_"] for r in train} == {task}
    assert all(SCHEDULER_STEPS_ON_SKIP in r.data.metrics for r in train)
    assert all(r.data.metrics["optimizer_steps"] > 0 for r in train)
    (job,) = array_job_ids(tmp_path)
    states = slurm_cluster.run("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", job)
    tasks = dict(line.split("|") for line in states.splitlines() if line)
    assert set(tasks.values()) == {"COMPLETED"}, tasks


def test_scancel_of_one_task_ends_its_run_killed_and_the_others_finish(
        env, client, slurm_cluster, tmp_path: Path) -> None:
    """Under load: the run's own KILLED close and the sweep's orphan close must agree.

    Both cores are busy (``busy_cores``) from the submission until the cancelled run is
    closed, by itself or by the sweep: the window in which the two writers race. The sweep
    then collects its tasks unloaded.
    """
    experiment = f"scancel-{uuid.uuid4().hex[:8]}"
    said = tmp_path / "command.out"
    # the 400-epoch run trains long enough to be cancelled; the other two are quick
    with busy_cores(2), said.open("w") as stdout:
        proc = subprocess.Popen(sweep_cmd(experiment, tmp_path, "train.epochs=2,400,3", "seed=0"),
                                cwd=PROJECT, env=env, stdout=stdout,
                                stderr=subprocess.STDOUT, text=True)
        try:
            deadline, victim = time.monotonic() + 300, None
            while victim is None and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(1)
                exp = client.get_experiment_by_name(experiment)
                if exp is None:
                    continue
                long = client.search_runs([exp.experiment_id], "params.`train.epochs` = '400' "
                                          "and attributes.status = 'RUNNING'")
                if long and (tmp_path / ".submitit").exists():
                    victim = long[0]
            assert victim is not None, "the long run never started\n" + said.read_text()[-3000:]
            (job,) = array_job_ids(tmp_path)
            # the sweeper launches longest first, so find the long run's array task: its job
            # folder <sweep dir>/<job number> is its index in the array
            task = int(Path(victim.data.tags[Tag.OUTPUT_DIR]).name)
            slurm_cluster.run("scancel", f"{job}_{task}")
            deadline = time.monotonic() + 300  # whoever closes it, the asserts below judge it
            while (proc.poll() is None and time.monotonic() < deadline
                   and client.get_run(victim.info.run_id).info.status == "RUNNING"):
                time.sleep(0.5)
        except BaseException:
            proc.kill()
            raise
    try:
        proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = said.read_text()
    train = {r.data.params["train.epochs"]: r for r in runs(client, experiment, Kind.TRAIN)}
    assert sorted(train) == ["2", "3", "400"], out[-3000:]
    assert train["400"].info.run_id == victim.info.run_id
    assert train["400"].info.status == "KILLED", out[-3000:]
    assert train["400"].data.tags["stability.outcome"] == "killed"
    assert train["2"].info.status == train["3"].info.status == "FINISHED", out[-5000:]
    assert "Bypassing sacct error" not in out
    # the sweep waited for every task, counted the cancelled one and closed its parent
    assert proc.returncode == 0, out[-3000:]
    assert "not_finished=1" in out and f"SLURM task {job}_{task} ended CANCELLED" in out, (
        out[-3000:])
    (parent,) = runs(client, experiment, Kind.SWEEP)
    assert parent.info.status == "FINISHED"
    states = slurm_cluster.run("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", job)
    tasks = dict(line.split("|") for line in states.splitlines() if line)
    assert tasks[f"{job}_{task}"].startswith("CANCELLED"), tasks
    assert [tasks[f"{job}_{i}"] for i in range(3) if i != task] == ["COMPLETED"] * 2, tasks


def test_a_task_that_cannot_reach_the_server_fails_at_once_readably(
        env, team_stack, slurm_cluster, tmp_path: Path) -> None:
    """The submitting host reaches the server (``tracking.uri``), the tasks get a URI they
    cannot reach (``MLFLOW_TRACKING_URI``, exported by the launcher's setup lines)."""
    from stability.tracking.server import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(sweep_cmd(f"unreach-{uuid.uuid4().hex[:6]}", tmp_path,
                                    "train.epochs=2", "seed=0", f"tracking.uri={team_stack.uri}"),
                          cwd=PROJECT, env=env | {"MLFLOW_TRACKING_URI": dead},
                          capture_output=True, text=True, timeout=300)
    logs = "".join(p.read_text() for p in (tmp_path / ".submitit").rglob("*.out"))
    assert f"MLflow server {dead} unreachable from {slurm_cluster.node}" in logs, (
        done.stdout[-2000:] + done.stderr[-2000:])
    assert "Traceback" not in logs  # the setup line stopped it before Python started
