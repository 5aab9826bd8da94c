"""How a study scales: its wall time against the ideal on this machine's cores.

ideal = (sum over the sweep's training runs of epochs x bare-loop s/epoch) / cores, with the
bare loop's s/epoch measured here once per distinct (precision, accum_steps) (and data/model
shape, which the default study keeps fixed), one bare loop at a time.

A study keeps every core busy, and cores that share caches, memory bandwidth or a physical
core (a VM's vCPUs may be hyperthreads of one core) slow each other down. So the bare loop is
also timed with ``cores`` copies running at once (``bare_epoch_seconds_saturated``); their
ratio, ``core_contention``, is what the machine alone costs a study, and ``saturated_ideal_s``
is the ideal with it: what a perfect scheduler of bare loops would take on these busy cores.

The runs come from MLflow: the sweep's parent run
(tags ``stability.kind=sweep``, ``stability.sweep_id``) gives the sweep's start and end, and
its training runs (same ``stability.sweep_id``) give each run's config and epochs trained.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import PROJECT_ROOT
from benchmarks.bare import BareLoop
from benchmarks.spec import BenchSpec
from benchmarks.timing import Summary
from stability.core.config import (
    ClipConfig,
    ConfigError,
    PrecisionConfig,
    RunConfig,
    TrainConfig,
)
from stability.tasks.sign_sum import DataConfig, ModelConfig
from stability.tracking.queries import search_all
from stability.tracking.uri import client

BareKey = tuple[str, int, int, int, int, str, int]  # precision, accum, samples, len, batch, cell, h
BARE_EPOCHS = 4  # per distinct bare configuration: one warm-up, three timed


@dataclass(frozen=True)
class StudyRun:
    """One training run of the sweep, as far as its training time is concerned."""

    run_id: str
    key: BareKey
    epochs: int  # epochs actually trained (fewer than configured if it diverged or failed)
    outcome: str
    start_ms: int  # launch order: the sweeper starts runs batch after batch
    end_ms: int
    train_wall_s: float  # the run's own wall_time_s metric: run.train, start to end


@dataclass(frozen=True)
class Sweep:
    """A sweep's parent run and its training runs."""

    sweep_id: str
    parent_run_id: str
    start_ms: int
    end_ms: int | None
    runs: list[StudyRun]

    @property
    def wall_s(self) -> float | None:
        """Seconds from the parent run's start to its end (``None`` while it runs)."""
        return None if self.end_ms is None else (self.end_ms - self.start_ms) / 1e3


def _key(params: dict[str, str]) -> BareKey:
    return (params["precision.name"], int(params["train.accum_steps"]),
            int(params["data.num_samples"]), int(params["data.seq_len"]),
            int(params["train.batch_size"]), params["model.cell"],
            int(params["model.hidden_size"]))


def _search_all(c: Any, exp_id: str, filter_string: str) -> list[Any]:
    return search_all(c, exp_id, filter_string)


def load_sweep(uri: str, experiment: str, sweep_id: str | None = None) -> Sweep:
    """Read a sweep from MLflow: the latest one in ``experiment`` unless ``sweep_id`` is given.

    Raises:
        ConfigError: the experiment or the sweep does not exist (the message says which).
    """
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        raise ConfigError(f"--experiment={experiment!r} is invalid: no such experiment in {uri}")
    filt = "tags.`stability.kind` = 'sweep'"
    if sweep_id:
        filt += f" and tags.`stability.sweep_id` = '{sweep_id}'"
    parents = c.search_runs([exp.experiment_id], filter_string=filt, max_results=1,
                            order_by=["attributes.start_time DESC"])
    if not parents:
        raise ConfigError(f"--sweep-id={sweep_id!r} is invalid: no sweep parent run "
                          f"(tag stability.kind=sweep) in experiment {experiment!r} at {uri}")
    parent = parents[0]
    sid = parent.data.tags["stability.sweep_id"]
    runs = []
    for r in _search_all(c, exp.experiment_id, f"tags.`stability.sweep_id` = '{sid}' and "
                                               "tags.`stability.kind` = 'train'"):
        outcome = r.data.tags.get("stability.outcome", "unknown")
        if outcome == "finished":
            epochs = int(r.data.params["train.epochs"])
        else:  # diverged, failed, killed: count the epochs that really ran
            epochs = len(c.get_metric_history(r.info.run_id, "val_loss"))
        runs.append(StudyRun(r.info.run_id, _key(r.data.params), epochs, outcome,
                             r.info.start_time, r.info.end_time or r.info.start_time,
                             r.data.metrics.get("wall_time_s", math.nan)))
    return Sweep(sid, parent.info.run_id, parent.info.start_time, parent.info.end_time, runs)


def bare_config(key: BareKey, epochs: int) -> RunConfig:
    """The bare loop's config for one (precision, accum_steps, shape) of the study."""
    precision, accum, samples, seq_len, batch, cell, hidden = key
    return RunConfig(
        device="auto",
        data=DataConfig(num_samples=samples, seq_len=seq_len),
        model=ModelConfig(cell=cell, hidden_size=hidden),
        precision=PrecisionConfig(name=precision),
        clip=ClipConfig(enabled=True, max_norm=1.0),
        train=TrainConfig(epochs=epochs, batch_size=batch, accum_steps=accum, threads=1),
    )


def bare_epoch_seconds(keys: set[BareKey], spec: BenchSpec) -> dict[BareKey, float]:
    """Median bare-loop s/epoch per key: a warm-up epoch, then ``BARE_EPOCHS - 1`` timed.

    At most ``spec.epochs`` epochs (the smoke test uses fewer).
    """
    epochs = min(BARE_EPOCHS, spec.epochs)
    return {key: Summary.of(spec.kept(BareLoop(bare_config(key, epochs)).run())).median
            for key in sorted(keys)}


def _bare_epochs(key: BareKey, epochs: int) -> list[float]:
    return BareLoop(bare_config(key, epochs)).run()


def bare_epoch_seconds_saturated(keys: set[BareKey], spec: BenchSpec,
                                 cores: int) -> dict[BareKey, float]:
    """Median bare-loop s/epoch per key with ``cores`` copies running at once.

    Each copy is its own process (spawned, one torch thread), all started together; the
    warm-up epoch of each is dropped and the median is over every copy's timed epochs.
    """
    epochs = min(BARE_EPOCHS, spec.epochs)
    out = {}
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(cores) as pool:
        for key in sorted(keys):
            copies = pool.starmap(_bare_epochs, [(key, epochs)] * cores)
            out[key] = Summary.of([s for c in copies for s in spec.kept(c)]).median
    return out


def run_study_command(uri: str, overrides: list[str], log_path: Path) -> float:
    """Run ``python experiments/sweep.py -m OVERRIDES`` against ``uri``; its wall seconds.

    The store is passed as ``MLFLOW_TRACKING_URI`` (the sweeper sets ``tracking.uri`` on its
    jobs itself); the sweep's output goes to ``log_path``.

    Raises:
        RuntimeError: the sweep command failed (the end of its log is quoted).
    """
    cmd = [sys.executable, str(PROJECT_ROOT / "experiments" / "sweep.py"), "-m",
           f"hydra.sweep.dir={log_path.parent / 'multirun'}", *overrides]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log_path.open("w") as log:
        rc = subprocess.run(cmd, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env=os.environ | {"MLFLOW_TRACKING_URI": uri}).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"the sweep command failed ({rc}): {' '.join(cmd)}\n"
                           f"{log_path.read_text()[-3000:]}")
    return wall


def study_part(sweep: Sweep, bare: dict[BareKey, float], cores: int,
               command_wall_s: float | None = None,
               saturated: dict[BareKey, float] | None = None) -> dict[str, Any]:
    """Ideal and actual wall time of ``sweep`` and their ratio.

    Args:
        sweep: the finished sweep.
        bare: bare-loop s/epoch per key (``bare_epoch_seconds``).
        cores: cores the study ran on.
        command_wall_s: the timed sweep command, when this benchmark ran it.
        saturated: bare-loop s/epoch per key with every core busy
            (``bare_epoch_seconds_saturated``); adds the saturated ideal and its ratios.

    Raises:
        ConfigError: the sweep has not finished (its parent run has no end time yet).
    """
    if sweep.wall_s is None:
        raise ConfigError(f"--sweep-id={sweep.sweep_id} is invalid: that sweep is still "
                          "running (its parent run has no end time); wait for it to finish")
    bare_total = sum(r.epochs * bare[r.key] for r in sweep.runs)
    ideal = bare_total / cores
    # What the launch order alone costs, with bare-loop runs: batches of `cores` that wait for
    # their slowest (plain hydra/launcher=joblib) vs a pool that starts the next run whenever a
    # core frees (the default local launcher), each in the order the sweep started its runs.
    ordered = sorted(sweep.runs, key=lambda r: r.start_ms)
    durations = [r.epochs * bare[r.key] for r in ordered]
    batched = sum(max(durations[i : i + cores]) for i in range(0, len(ordered), cores))
    pooled = list_schedule(durations, cores)
    out: dict[str, Any] = {
        "sweep_id": sweep.sweep_id,
        "parent_run_id": sweep.parent_run_id,
        "runs": len(sweep.runs),
        "outcomes": dict(Counter(r.outcome for r in sweep.runs)),
        "epochs_total": sum(r.epochs for r in sweep.runs),
        "bare_s_per_epoch": {"/".join(str(v) for v in k): s for k, s in bare.items()},
        "bare_training_s": bare_total,
        "cores": cores,
        "ideal_s": ideal,
        "batched_ideal_s": batched,
        "pooled_ideal_s": pooled,
        "parent_wall_s": sweep.wall_s,
        "parent_ratio": sweep.wall_s / ideal if ideal else None,
        "parent_ratio_vs_batched": sweep.wall_s / batched if batched else None,
        "parent_ratio_vs_pooled": sweep.wall_s / pooled if pooled else None,
    }
    out["breakdown"] = breakdown(sweep, ordered, bare_total, cores)
    if command_wall_s is not None:
        out["command_wall_s"] = command_wall_s
        out["command_ratio"] = command_wall_s / ideal if ideal else None
        out["command_ratio_vs_batched"] = command_wall_s / batched if batched else None
    if saturated:
        sat_total = sum(r.epochs * saturated[r.key] for r in sweep.runs)
        out["saturated_s_per_epoch"] = {"/".join(str(v) for v in k): s
                                        for k, s in saturated.items()}
        out["core_contention"] = sat_total / bare_total if bare_total else None
        out["saturated_ideal_s"] = sat_total / cores
        out["parent_ratio_saturated"] = sweep.wall_s * cores / sat_total if sat_total else None
        out["train_inflation_saturated"] = (out["breakdown"]["train_wall_s_sum"] / sat_total
                                            if sat_total else None)
        if command_wall_s is not None and sat_total:
            out["command_ratio_saturated"] = command_wall_s * cores / sat_total
    return out


def list_schedule(durations: list[float], cores: int) -> float:
    """Makespan of ``durations`` started in order, each on the first core to free up."""
    free = [0.0] * cores
    for d in durations:
        i = min(range(cores), key=free.__getitem__)
        free[i] += d
    return max(free, default=0.0)


def breakdown(sweep: Sweep, ordered: list[StudyRun], bare_total: float,
              cores: int) -> dict[str, float]:
    """Where the sweep's wall time went, from its runs' own records in MLflow.

    - ``train_inflation``: sum of the runs' ``run.train`` wall time over their bare-loop time
      (our instrumentation and tracking sends, plus any CPU contention on the machine).
    - ``tracking_outside_train_s_per_run``: MLflow run span minus ``run.train`` (run creation,
      params, final flush, artifacts, teardown).
    - ``startup_s``: parent run start to the first training run (workers starting, imports).
    - ``between_batches_s``: summed gaps from a batch's last run end to the next batch's first
      run start (launcher dispatch, Hydra job setup), batches of ``cores`` in launch order.
    - ``start_skew_s``: summed spread of start times within each batch.
    - ``teardown_s``: last run end to the parent run's end.
    - ``busy_core_share``: the runs' MLflow spans summed over ``cores`` x the sweep's wall time
      (1.0: every core held a run all the time).
    - ``job_gap_s_per_run``: mean time from a run's end to the next run's start on the same
      worker slot (Hydra job setup, the worker taking the next job), runs assigned to slots in
      start order.
    """
    train = sum(r.train_wall_s for r in ordered)
    batches = [ordered[i : i + cores] for i in range(0, len(ordered), cores)]
    gaps = [min(r.start_ms for r in b2) - max(r.end_ms for r in b1)
            for b1, b2 in zip(batches, batches[1:], strict=False)]
    return {
        "train_wall_s_sum": train,
        "train_inflation": train / bare_total if bare_total else math.nan,
        "tracking_outside_train_s_per_run": (
            sum((r.end_ms - r.start_ms) / 1e3 - r.train_wall_s for r in ordered) / len(ordered)
            if ordered else math.nan),
        "startup_s": (ordered[0].start_ms - sweep.start_ms) / 1e3 if ordered else math.nan,
        "between_batches_s": sum(max(g, 0) for g in gaps) / 1e3,
        "start_skew_s": sum(max(r.start_ms for r in b) - min(r.start_ms for r in b)
                            for b in batches) / 1e3,
        "teardown_s": ((sweep.end_ms or 0) - max(r.end_ms for r in ordered)) / 1e3
        if ordered else math.nan,
        "busy_core_share": (sum(r.end_ms - r.start_ms for r in ordered) / 1e3
                            / (cores * sweep.wall_s) if ordered and sweep.wall_s else math.nan),
        "job_gap_s_per_run": _slot_gaps(ordered, cores),
    }


def _slot_gaps(ordered: list[StudyRun], cores: int) -> float:
    """Mean idle time between consecutive runs of a worker slot (runs in start order)."""
    ends = [r.end_ms for r in ordered[:cores]]
    gaps = []
    for r in ordered[cores:]:
        i = min(range(len(ends)), key=ends.__getitem__)  # the slot that freed first
        gaps.append(max(r.start_ms - ends[i], 0) / 1e3)
        ends[i] = r.end_ms
    return sum(gaps) / len(gaps) if gaps else math.nan
