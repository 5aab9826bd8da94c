"""Scheduling a sweep: expected costs, longest first, a pool that starts jobs as cores free."""

from __future__ import annotations

import heapq
import math
import random
from pathlib import Path

import pytest
from hydra._internal.callbacks import Callbacks
from hydra.core.utils import JobStatus
from hydra.types import HydraContext
from mlflow.entities import Metric, Param, Run, RunData, RunInfo
from omegaconf import OmegaConf

from stability.core.config import PrecisionConfig, RunConfig, TrainConfig
from stability.sweep.compose import CachedComposer
from stability.sweep.eta import Eta
from stability.sweep.grid import make_point
from stability.sweep.pool import STOP_FILE, PoolLauncher
from stability.sweep.schedule import cost_key, observed_costs, order, with_probes
from tests.helpers import pool_jobs
from tests.sweep.test_sweep import in_process_sweeper


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


def test_probes_put_one_job_of_each_kind_first_and_keep_the_rest_longest_first() -> None:
    grid = [point(p, a, seed=s) for p in ("fp32", "bf16", "fp16") for a in (1, 8)
            for s in (0, 1)]
    costed = with_probes(order(grid))
    kinds = [(p.cfg.precision.name, p.cfg.train.accum_steps, p.cfg.seed) for p, _ in costed]
    assert kinds[:6] == [("fp16", 1, 0), ("fp16", 8, 0), ("bf16", 1, 0), ("bf16", 8, 0),
                         ("fp32", 1, 0), ("fp32", 8, 0)]
    rest = [c for _, c in costed[6:]]
    assert rest == sorted(rest, reverse=True) and len(costed) == len(grid)


def test_eta_rate_comes_from_the_kind_else_its_precision_else_every_run() -> None:
    kinds = [("t", "fp16", 1), ("t", "fp16", 8), ("t", "fp32", 1), ("t", "fp16", 1),
             ("t", "bf16", 1)]
    eta = Eta(kinds, [6.0, 5.0, 1.0, 6.0, 2.0], workers=1)
    assert eta.remaining(0.0) is None  # nothing measured yet
    eta.start(0, 0.0)
    eta.end(0, 12.0)  # 2 s a unit, but the worker's first job (imports): a last resort
    assert eta.rate(("t", "fp16", 1)) == pytest.approx(2.0)
    eta.end(1, 20.0, duration=20.0)  # 4 s a unit
    eta.start(2, 20.0)
    eta.end(2, 23.0)  # 3 s a unit
    assert eta.rate(("t", "fp32", 1)) == pytest.approx(3.0)  # its own runs
    assert eta.rate(("t", "fp16", 1)) == pytest.approx(4.0)  # fp16's, not the warm-up job
    assert eta.rate(("t", "fp16", 2)) == pytest.approx(4.0)  # fp16's median
    assert eta.rate(("t", "bf16", 1)) == pytest.approx(3.5)  # everything's median
    # One worker: job 4 (2 units x 3.5 s) runs since t=30, then job 3 (6 units x 4 s).
    eta.start(4, 30.0)
    assert eta.remaining(31.0) == pytest.approx(6.0 + 24.0)


# A CPU that is not the one the model's factors were measured on: fp16 3x fp32 (model: 6x),
# bf16 2.2x (model: 2.7x), and accumulation saving more than modelled.
OTHER_CPU = {"fp32": 1.0, "bf16": 2.2, "fp16": 3.0}


def simulated_sweep(probes: bool, workers: int = 2) -> list[tuple[float, float, float]]:
    """The default study's 240 runs on a pool of ``workers``, in virtual time.

    Each run takes its OTHER_CPU time with +-10% noise (seeded) and the first run of each
    worker 3 s more (imports). Returns, at every run's end: (share of runs ended, the ETA,
    the real time left until the last run ends).
    """
    grid = [point(p, a, seed=s) for _ in ("off", 1, 5, 10) for a in (1, 2, 4, 8)
            for p in ("fp32", "fp16", "bf16") for s in range(5)]
    costed = order(grid)
    if probes:
        costed = with_probes(costed)
    rnd = random.Random(0)
    took = [18 * OTHER_CPU[p.cfg.precision.name] * (0.7 + 0.3 / p.cfg.train.accum_steps)
            * rnd.uniform(0.9, 1.1) for p, _ in costed]
    free = [(0.0, w) for w in range(workers)]
    starts, ends = [], []
    for seconds in took:  # the pool: each job to the first free worker, in launch order
        t, w = heapq.heappop(free)
        end = t + seconds + (3.0 if t == 0 else 0.0)
        starts.append(t)
        ends.append(end)
        heapq.heappush(free, (end, w))
    eta = Eta([cost_key(p) for p, _ in costed], [c for _, c in costed], workers)
    last, seen = max(ends), []
    events = sorted([(t, 0, i) for i, t in enumerate(starts)]
                    + [(t, 1, i) for i, t in enumerate(ends)])
    for t, is_end, i in events:
        if not is_end:
            eta.start(i, t)
            continue
        eta.end(i, t)
        left = eta.remaining(t)
        assert left is not None
        seen.append((sum(1 for e in ends if e <= t) / len(ends), left, last - t))
    return seen


def test_eta_is_within_20_percent_of_the_time_left_after_10_percent_of_the_runs() -> None:
    def worst(seen: list[tuple[float, float, float]]) -> float:
        return max(abs(eta - left) / left for done, eta, left in seen if 0.1 <= done <= 0.9)

    assert worst(simulated_sweep(probes=True)) <= 0.2
    # Longest first alone measures fp32 only after every fp16 and bf16 run: until then its
    # time is the model's guess scaled by the wrong precision factors.
    assert worst(simulated_sweep(probes=False)) > 0.2
    # The tail: within 5% of the whole sweep's time.
    seen = simulated_sweep(probes=True)
    total = seen[0][2]
    assert all(abs(eta - left) <= 0.05 * total for done, eta, left in seen if done > 0.9)


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
    with pytest.raises(KeyboardInterrupt):  # Hydra's JobReturn re-raises a failed job's error
        results[0].return_value  # noqa: B018
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
    with pytest.raises(Exception, match="worker process died"):
        by_job[0].return_value  # noqa: B018
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
