"""Scheduling a sweep: expected costs, longest first, a pool that starts jobs as cores free."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hydra._internal.callbacks import Callbacks
from hydra.core.utils import JobStatus
from hydra.types import HydraContext
from mlflow.entities import Metric, Param, Run, RunData, RunInfo
from omegaconf import OmegaConf

from stability.core.config import PrecisionConfig, RunConfig, TrainConfig
from stability.sweep.compose import CachedComposer
from stability.sweep.grid import make_point
from stability.sweep.pool import STOP_FILE, PoolLauncher
from stability.sweep.progress import Progress
from stability.sweep.schedule import observed_costs, order
from tests.helpers import pool_jobs
from tests.test_sweep import in_process_sweeper


def point(precision: str = "fp32", accum: int = 1, epochs: int = 18, seed: int = 0):
    cfg = RunConfig(seed=seed, precision=PrecisionConfig(name=precision),
                    train=TrainConfig(epochs=epochs, accum_steps=accum))
    return make_point((f"precision={precision}", f"seed={seed}"), cfg)


def test_cpu_order_is_fp16_bf16_fp32_and_ties_keep_grid_order() -> None:
    grid = [point(p, seed=s) for p in ("fp32", "bf16", "fp16") for s in (0, 1)]
    ordered = [(p.cfg.precision.name, p.cfg.seed) for p, _ in order(grid)]
    assert ordered == [("fp16", 0), ("fp16", 1), ("bf16", 0), ("bf16", 1), ("fp32", 0),
                       ("fp32", 1)]


def test_more_epochs_and_less_accumulation_cost_more() -> None:
    costs = dict((p.cfg.train.epochs * 10 + p.cfg.train.accum_steps, c) for p, c in order(
        [point(epochs=e, accum=a) for e in (9, 18) for a in (1, 8)]))
    assert costs[181] == pytest.approx(2 * costs[91])
    assert costs[181] > costs[188] > costs[91]


def test_on_a_gpu_precision_does_not_reorder() -> None:
    grid = [point(p) for p in ("fp32", "bf16", "fp16")]
    assert [p.cfg.precision.name for p, _ in order(grid, on_cpu=False)] == [
        "fp32", "bf16", "fp16"]


def mlflow_run(precision: str, accum: int, epochs: int, wall: float) -> Run:
    """A finished training run as ``search_runs`` returns it (real MLflow entities)."""
    info = RunInfo(run_id="r", experiment_id="1", user_id="u", status="FINISHED",
                   start_time=0, end_time=1, lifecycle_stage="active")
    params = [Param("task._target_", "stability.tasks.sign_sum.SignSumTask"),
              Param("precision.name", precision), Param("train.accum_steps", str(accum)),
              Param("train.epochs", str(epochs))]
    return Run(info, RunData(metrics=[Metric("wall_time_s", wall, 0, 0)], params=params))


def test_measured_durations_replace_the_model_when_they_cover_every_job() -> None:
    # Measured: bf16 slower than fp16 here (as on no CPU we know): the order must follow it.
    runs = [mlflow_run("fp16", 1, 18, 36.0), mlflow_run("fp16", 1, 18, 54.0),
            mlflow_run("bf16", 1, 9, 45.0), mlflow_run("fp32", 1, 18, math.nan)]
    observed = observed_costs(runs)
    assert observed[("stability.tasks.sign_sum.SignSumTask", "fp16", 1)] == pytest.approx(2.5)
    assert observed[("stability.tasks.sign_sum.SignSumTask", "bf16", 1)] == pytest.approx(5.0)
    costed = order([point("fp16"), point("bf16")], observed)
    assert [(p.cfg.precision.name, c) for p, c in costed] == [("bf16", 90.0), ("fp16", 45.0)]
    # One kind of job never measured: seconds and ratios do not mix, the model decides.
    costed = order([point("fp16"), point("bf16"), point("fp32", accum=2)], observed)
    assert [p.cfg.precision.name for p, _ in costed] == ["fp16", "bf16", "fp32"]


def test_eta_weighs_runs_by_their_expected_cost() -> None:
    now = [0.0]
    p = Progress(total=4, total_cost=20.0, clock=lambda: now[0])
    now[0] = 10.0
    p.update(1, cost=8.0)  # includes worker start-up: the pace is taken from here on
    now[0] = 16.0
    p.update(1, cost=6.0)  # 1 s per unit of cost
    assert p.eta() == pytest.approx(6.0)
    assert p.line() == "runs 2/4 done, 16s elapsed, ETA 6s"


def state(tmp_path: Path) -> Path:
    """The sweep's state folder (the sweeper makes one per sweep)."""
    folder = tmp_path / ".state"
    folder.mkdir(exist_ok=True)
    return folder


def job_dirs(tmp_path: Path) -> list[int]:
    return sorted(int(d.name) for d in tmp_path.iterdir() if d.name.isdigit())


def pool(tmp_path: Path, n_jobs: int = 2) -> PoolLauncher:
    sweeper = in_process_sweeper([f"hydra.sweep.dir={tmp_path}"])
    assert sweeper.config is not None and sweeper.hydra_context is not None
    context = HydraContext(config_loader=sweeper.hydra_context.config_loader,
                           callbacks=Callbacks(sweeper.config))
    launcher = PoolLauncher(n_jobs=n_jobs)
    launcher.setup(hydra_context=context, task_function=pool_jobs.sleep_for_seed,
                   config=sweeper.config)
    return launcher


@pytest.mark.slow
def test_pool_yields_jobs_as_they_end_and_a_short_job_never_waits_for_a_long_one(
        tmp_path: Path) -> None:
    jobs = [["seed=50"], ["seed=0"], ["seed=1"]]  # 5 s, then two short ones
    results = list(pool(tmp_path).stream(jobs, 10, state(tmp_path)))
    order_seen = [i for i, _ in results]
    assert sorted(order_seen) == [0, 1, 2]
    assert order_seen[-1] == 0  # the short jobs ran on the other worker meanwhile
    assert {i: r.return_value for i, r in results} == {0: 50, 1: 0, 2: 1}
    assert job_dirs(tmp_path) == [10, 11, 12]


@pytest.mark.slow
def test_pool_stop_file_and_an_interrupted_job(tmp_path: Path) -> None:
    """Queued jobs see the stop file and never start; an interrupted job is a result."""
    jobs = [["seed=99"], ["seed=1"]]
    results = dict(pool(tmp_path).stream(jobs, 0, state(tmp_path)))
    assert results[0].status == JobStatus.FAILED
    assert isinstance(results[0]._return_value, KeyboardInterrupt)
    assert results[1].return_value == 1  # the other job was not taken down with it
    (state(tmp_path) / STOP_FILE).touch()
    stopped = list(pool(tmp_path).stream([["seed=1"]] * 4, 2, state(tmp_path)))
    assert sorted(stopped, key=lambda r: r[0]) == [(0, None), (1, None), (2, None), (3, None)]
    assert job_dirs(tmp_path) == [0, 1]


@pytest.mark.slow
def test_a_dead_worker_costs_its_running_jobs_never_the_rest(tmp_path: Path) -> None:
    """SIGKILL of a worker breaks joblib's pool: the jobs not started yet run in a new one."""
    # The first job kills its worker at once; the other worker is inside a 2 s job then (the
    # pool takes it down too), so the last three jobs cannot have started: they must complete.
    jobs = [["seed=98"], ["seed=20"], ["seed=2"], ["seed=3"], ["seed=4"]]
    results = list(pool(tmp_path).stream(jobs, 0, state(tmp_path)))
    assert sorted(i for i, _ in results) == [0, 1, 2, 3, 4]  # each job answered once
    by_job = dict(results)
    assert by_job[0].status == JobStatus.FAILED
    assert "worker process died" in str(by_job[0]._return_value)
    assert {i: by_job[i].return_value for i in (2, 3, 4)} == {2: 2, 3: 3, 4: 4}


@pytest.mark.parametrize("overrides", [
    ["clip.enabled=true", "clip.max_norm=5.0", "train.accum_steps=2", "precision=fp16",
     "seed=3"],
    ["+study=adding", "precision=bf16", "seed=1", "tracking.uri='http://127.0.0.1:5/a=b'",
     "tracking.sweep_id=x", "output_dir='/tmp/some folder/3'"],
    ["task=char_lm", "precision=fp32", "+fault.extra=1"],
    ["precision=fp16", "hydra.job.chdir=false"],  # a hydra override: Hydra's own path
])
def test_cached_composition_equals_hydras_hydra_node_included(overrides: list[str]) -> None:
    sweeper = in_process_sweeper(["hydra.sweep.dir=/tmp/compose-test"])
    assert sweeper.config is not None and sweeper.hydra_context is not None
    composer = CachedComposer(sweeper.hydra_context, sweeper.config)
    composer.job_config(["precision=fp16", "seed=0"])  # a cached base in play
    ours = composer.job_config(overrides)
    hydras = sweeper.hydra_context.config_loader.load_sweep_config(sweeper.config, overrides)
    assert OmegaConf.to_container(ours) == OmegaConf.to_container(hydras)
    assert ours.hydra.overrides.task == overrides[:-1] + (
        [] if overrides[-1].startswith("hydra.") else overrides[-1:])
