"""Overhead of our instrumentation and tracking per epoch, fixed cost per run, per precision.

Variants, all on the same ``RunConfig`` (one thread, clipping on):

- ``bare``: ``benchmarks.bare.BareLoop``, the plain PyTorch reference.
- ``instrumented``: ``stability.core.loop.train`` with tracking off: ``TrainStep`` (finiteness
  checks, pre/post-clip norms), the loop's per-step telemetry (diagnostics, skip-rate monitor)
  and ``steps.csv`` flushed per row; ``telemetry.per_layer`` off.
- ``instrumented_per_layer``: the same with ``telemetry.per_layer=true`` (one ``_foreach_norm``
  and one host read a step, ``layer_norms.csv`` at the end); its paired ratio to
  ``instrumented`` is the cost of the per-layer norms.
- ``tracked_server``: ``stability.sweep.job.train_tracked`` (what a sweep worker runs, so with
  the default ``telemetry.per_layer``) against a real ``mlflow server``: every per-step metric at
  full resolution, buffered in process and sent with ``log_batch`` off the training thread,
  plus params, artifacts and the checkpoint.
- ``tracked_sqlite``: the same against the embedded SQLite store (the default without a server).

Metrics per variant: ``epoch_s``, wall seconds per epoch (``EpochLog.seconds``: training pass
+ validation pass, the same span the bare loop times; warm-up epoch dropped);
``step_wall_s`` / ``step_cpu_s``, one steady-state turn of the loop (``timing.StepClock``);
``run_cpu_s``, this process's CPU seconds for the whole run, every thread (what a study on
saturated cores pays). CPU seconds are the robust figures on a shared machine. The fixed cost
of a tracked run is its wall time minus its epochs.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.bare import bare_epochs
from benchmarks.spec import BenchSpec
from benchmarks.store_write import store_write_part
from benchmarks.timing import (
    Samples,
    StepClock,
    Summary,
    interleave,
    paired_ratio,
    paired_ratios,
    pooled,
    ratio,
)
from stability.core.config import PRECISIONS, RunConfig, TelemetryConfig, TrackingConfig
from stability.core.loop import train

Progress = Callable[[str], None]
DEFAULT_PER_LAYER = TelemetryConfig().per_layer  # what a sweep worker runs


@dataclass
class Stores:
    """Where the tracked variants log: a real server and an embedded SQLite store."""

    server_uri: str
    sqlite_uri: str
    experiment: str


class RunDirs:
    """A fresh output directory per run under one root (runs never share files)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._n = itertools.count()

    def next(self, name: str) -> str:
        """A new, unused directory path for a run of ``name``."""
        return str(self.root / f"{name}-{next(self._n):04d}")


def _samples(spec: BenchSpec, epoch_seconds: list[float], clock: StepClock,
             run_cpu_s: float) -> Samples:
    return {"epoch_s": spec.kept(epoch_seconds), "step_wall_s": clock.wall,
            "step_cpu_s": clock.cpu, "run_cpu_s": [run_cpu_s]}


def _clock(spec: BenchSpec, cfg: RunConfig) -> StepClock:
    return StepClock(skip_epochs=1 if cfg.train.epochs > 1 else 0)


def bare_samples(spec: BenchSpec, cfg: RunConfig) -> Samples:
    """The bare loop: s/epoch (warm-up dropped) and steady-state step wall/CPU seconds."""
    clock = _clock(spec, cfg)
    cpu0 = time.process_time()
    epochs = bare_epochs(cfg, clock)
    return _samples(spec, epochs, clock, time.process_time() - cpu0)


def instrumented_samples(spec: BenchSpec, cfg: RunConfig) -> Samples:
    """``run.train`` with tracking off; the same samples as ``bare_samples``."""
    clock = _clock(spec, cfg)
    cpu0 = time.process_time()
    result = train(dataclasses.replace(cfg, tracking=TrackingConfig(enabled=False)),
                   sinks=[clock])
    return _samples(spec, [e.seconds for e in result.epochs], clock, time.process_time() - cpu0)


@dataclass(frozen=True)
class TrackedSample:
    """One tracked run: its epochs and its wall time (``fixed_s`` is everything else)."""

    epoch_seconds: list[float]
    wall_s: float
    cpu_s: float  # this process, every thread (not the server's)
    clock: StepClock

    @property
    def fixed_s(self) -> float:
        """Run creation, params, setup, checkpoints, artifact upload, teardown."""
        return self.wall_s - sum(self.epoch_seconds)


def tracked_run(spec: BenchSpec, cfg: RunConfig, direct: bool = True) -> TrackedSample:
    """``job.train_tracked(cfg)``, what a sweep worker runs, timed end to end.

    ``direct=False``: on the SQLite store, metric points through MLflow's ``log_batch``
    (``TrackedRun.direct_sqlite``), the path runs took before ``DirectMetrics``.
    """
    from stability.sweep.job import train_tracked  # imports MLflow lazily, like the job does
    from stability.tracking.run import TrackedRun

    clock = _clock(spec, cfg)
    TrackedRun.direct_sqlite = direct
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        result = train_tracked(cfg, sinks=[clock])
    finally:
        TrackedRun.direct_sqlite = True
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return TrackedSample([e.seconds for e in result.epochs], wall, cpu, clock)


def prepare_experiment(uri: str, name: str, artifact_root: Path) -> None:
    """Create the experiment once, as the sweeper does before its workers start.

    On a SQLite store the artifacts go under ``artifact_root`` (not ``./mlruns``).
    """
    from stability.tracking.uri import client

    c = client(uri)
    if c.get_experiment_by_name(name) is None:
        # A SQLite store's artifacts live beside its database file: a store reads nothing
        # outside its own folder (tracking/origins.py), whatever root the caller offered.
        location = None if uri.startswith("http") else (
            Path(uri.removeprefix("sqlite:///")).parent / artifact_root.name).as_uri()
        c.create_experiment(name, artifact_location=location)


def check_full_resolution(uri: str, experiment: str) -> dict[str, Any]:
    """Every tracked run holds one ``loss`` point per optimizer step (nothing dropped)."""
    from stability.tracking.uri import client

    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    runs = c.search_runs([exp.experiment_id], max_results=1000) if exp else []
    complete = 0
    for r in runs:
        steps = int(r.data.metrics.get("optimizer_steps", -1))
        complete += len(c.get_metric_history(r.info.run_id, "loss")) == steps
    return {"runs": len(runs), "complete": complete, "all_complete": complete == len(runs) > 0}


def summarise(rounds: dict[str, list[Samples]], base: str) -> dict[str, Any]:
    """Per variant and metric: pooled median/quartiles, paired ratio and ratio of medians.

    ``ratio_vs_<base>`` is the paired ratio (``timing.paired_ratio``), the headline figure;
    ``median_ratio_vs_<base>`` divides the pooled medians.
    """
    out: dict[str, Any] = {}
    for name, variant_rounds in rounds.items():
        out[name] = {}
        for metric in variant_rounds[0]:
            stats = Summary.of(pooled(variant_rounds, metric))
            base_stats = Summary.of(pooled(rounds[base], metric))
            per_round = paired_ratios(variant_rounds, rounds[base], metric)
            out[name][metric] = stats.as_dict() | {
                f"ratio_vs_{base}": Summary.of(per_round).median,
                f"ratio_vs_{base}_per_round": per_round,
                f"median_ratio_vs_{base}": ratio(stats, base_stats),
            }
    return out


def versus(rounds: dict[str, list[Samples]], name: str, base: str) -> dict[str, Any]:
    """Per metric: the paired ratio of ``name`` to ``base`` (another variant than bare)."""
    return {metric: {"ratio": paired_ratio(rounds[name], rounds[base], metric),
                     "per_round": paired_ratios(rounds[name], rounds[base], metric)}
            for metric in rounds[name][0]}


def overhead_part(spec: BenchSpec, dirs: RunDirs, stores: Stores,
                  say: Progress) -> dict[str, Any]:
    """Interleave bare / instrumented / tracked (server, SQLite); medians and ratios.

    Returns:
        per variant and metric (``epoch_s``, ``step_wall_s``, ``step_cpu_s``) the median,
        quartiles and ratio to ``bare``; ``per_layer_vs_instrumented``, the paired ratios of
        the per-layer variant to ``instrumented``; ``fixed_cost_s`` per store; the
        full-resolution check of the tracked runs.
    """
    def cfg(name: str, uri: str | None = None, epochs: int | None = None,
            per_layer: bool = False) -> RunConfig:
        tracking = TrackingConfig(uri=uri, experiment=stores.experiment) if uri else None
        return spec.run_config(dirs.next(name), epochs=epochs, tracking=tracking,
                               per_layer=per_layer)

    fixed: dict[str, list[float]] = {"server": [], "sqlite": [], "sqlite_log_batch": []}

    def tracked(store: str, uri: str, direct: bool = True) -> Callable[[], Samples]:
        def go() -> Samples:
            sample = tracked_run(spec, cfg(f"tracked-{store}", uri, per_layer=DEFAULT_PER_LAYER),
                                 direct)
            fixed[store].append(sample.fixed_s)
            return _samples(spec, sample.epoch_seconds, sample.clock, sample.cpu_s)
        return go

    variants = {
        "bare": lambda: bare_samples(spec, cfg("bare")),
        "instrumented": lambda: instrumented_samples(spec, cfg("instrumented")),
        "instrumented_per_layer": lambda: instrumented_samples(
            spec, cfg("per-layer", per_layer=True)),
        "tracked_server": tracked("server", stores.server_uri),
        "tracked_sqlite": tracked("sqlite", stores.sqlite_uri),
        "tracked_sqlite_log_batch": tracked("sqlite_log_batch", stores.sqlite_uri, False),
    }
    # Warm-up, untimed: imports, the SQLite store's creation, the server's first requests.
    # A sweep worker is in this state from its second run on.
    say("overhead: warm-up")
    bare_samples(spec, cfg("warmup-bare", epochs=1))
    instrumented_samples(spec, cfg("warmup-instrumented", epochs=1))
    instrumented_samples(spec, cfg("warmup-per-layer", epochs=1, per_layer=True))
    for store, uri in (("server", stores.server_uri), ("sqlite", stores.sqlite_uri)):
        tracked_run(spec, cfg(f"warmup-{store}", uri, epochs=1, per_layer=DEFAULT_PER_LAYER))
    rounds = interleave(variants, spec.reps,
                        on_rep=lambda r: say(f"overhead: repetition {r + 1}/{spec.reps}"))
    say("overhead: writing metric points into SQLite, MLflow's log_batch vs DirectMetrics")
    written = store_write_part(dirs.root)
    return {
        "store_write": written,
        "variants": summarise(rounds, "bare"),
        "per_layer_vs_instrumented": versus(rounds, "instrumented_per_layer", "instrumented"),
        "sqlite_direct_vs_log_batch": versus(rounds, "tracked_sqlite", "tracked_sqlite_log_batch"),
        "fixed_cost_s": {store: Summary.of(v).as_dict() for store, v in fixed.items()},
        "full_resolution": {store: check_full_resolution(uri, stores.experiment)
                            for store, uri in (("server", stores.server_uri),
                                               ("sqlite", stores.sqlite_uri))},
    }


def precision_part(spec: BenchSpec, dirs: RunDirs, say: Progress) -> dict[str, Any]:
    """Bare and instrumented loop for fp32, bf16 and fp16: s/epoch and step wall/CPU.

    Runs ``spec.precision_epochs`` epochs (at most ``spec.epochs``) per repetition.
    """
    spec = spec.replace(epochs=min(spec.precision_epochs, spec.epochs))
    variants: dict[str, Callable[[], Samples]] = {}
    for prec in PRECISIONS:
        variants[f"bare_{prec}"] = lambda p=prec: bare_samples(
            spec, spec.run_config(dirs.next("bare"), precision=p))
        variants[f"instrumented_{prec}"] = lambda p=prec: instrumented_samples(
            spec, spec.run_config(dirs.next("instr"), precision=p))
    say("precision: warm-up")
    for prec in PRECISIONS:
        instrumented_samples(spec, spec.run_config(dirs.next("warmup"), precision=prec,
                                                   epochs=1))
    rounds = interleave(variants, spec.reps,
                        on_rep=lambda r: say(f"precision: repetition {r + 1}/{spec.reps}"))
    stats = summarise(rounds, "bare_fp32")
    out: dict[str, Any] = {}
    for prec in PRECISIONS:
        bare, instr = rounds[f"bare_{prec}"], rounds[f"instrumented_{prec}"]
        out[prec] = {
            "bare": stats[f"bare_{prec}"],
            "instrumented": stats[f"instrumented_{prec}"],
            "instrumented_ratio": paired_ratio(instr, bare, "epoch_s"),
            "instrumented_cpu_ratio": paired_ratio(instr, bare, "step_cpu_s"),
        }
    return out
