"""What stability telemetry and tracking cost, how a study scales, and the accumulation curve.

    python experiments/benchmark.py                       # overhead, memory, precision, accum
    python experiments/benchmark.py --part overhead --reps 11 --profile
    python experiments/benchmark.py --part study          # the latest finished sweep in MLflow
    python experiments/benchmark.py --part study --run-study   # run the default study, timed
    python experiments/benchmark.py --part scale          # ingest rate, report at 10x: ~10 min

Writes ``benchmarks/results/bench.json``, ``bench.md`` (its tables, generated from the JSON's
figures), ``accum-curve.json`` and ``accum-curve.png``, and prints the tables. See
docs/performance.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Before MLflow is imported anywhere: no run links on stdout between the tables.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

import torch  # noqa: E402

from benchmarks import accum, memory, overhead, study, writers  # noqa: E402
from benchmarks.machine import machine_info, usable_cores  # noqa: E402
from benchmarks.profiling import profile_call  # noqa: E402
from benchmarks.spec import DEFAULT_PARTS, PARTS, BenchSpec  # noqa: E402
from stability.core.config import ConfigError, TrackingConfig  # noqa: E402
from stability.core.precision import Precision

BENCH_EXPERIMENT = "bench"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", action="append", choices=(*PARTS, "all"),
                   help=f"what to run (repeatable); default: {' '.join(DEFAULT_PARTS)}")
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions per variant")
    p.add_argument("--epochs", type=int, default=18,
                   help="epochs per repetition (the first is a warm-up when >= 2); default: "
                        "a default run's")
    p.add_argument("--precision-epochs", type=int, default=3,
                   help="epochs per repetition of the precision part (at most --epochs)")
    p.add_argument("--accum-rounds", type=int, default=11,
                   help="rounds of the accumulation curve (one epoch per setting each)")
    p.add_argument("--num-samples", type=int, default=3000, help="sequences in the data set")
    p.add_argument("--precision", default=Precision.FP32.value, choices=list(Precision),
                   help="precision of the overhead and memory parts")
    p.add_argument("--accum-steps", type=int, default=4, help="accumulation (overhead, memory)")
    p.add_argument("--max-norm", type=float, default=1.0, help="clipping threshold")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output folder")
    p.add_argument("--tracking-uri", default=None,
                   help="an existing mlflow server for the tracked variants and the scale "
                        "part (default: start one in a temp folder)")
    p.add_argument("--memory-reps", type=int, default=2,
                   help="child processes per variant for peak memory")
    p.add_argument("--skinny-python", type=Path, default=None,
                   help="python of a venv with mlflow-skinny instead of mlflow (docs/cluster.md):"
                        " adds the tracked-skinny(-full) memory variants (skipped without it)")
    p.add_argument("--profile", action="store_true",
                   help="also cProfile one instrumented and one tracked run")
    g = p.add_argument_group("study")
    g.add_argument("--study-uri", default=None,
                   help="store holding the sweep (default: $MLFLOW_TRACKING_URI, else the "
                        "embedded mlflow.db; with --run-study: a fresh store under --out; "
                        "a given store keeps its FINISHED points, which the sweeper skips)")
    g.add_argument("--experiment", default="stability", help="the sweep's experiment")
    g.add_argument("--sweep-id", default=None, help="which sweep (default: the latest)")
    g.add_argument("--run-study", action="store_true",
                   help="run `python experiments/sweep.py -m` now and time it")
    g.add_argument("--study-runs", type=int, default=1,
                   help="with --run-study: run the study this many times, one after the "
                        "other, each on a fresh store (the bare loop is timed once, after)")
    g.add_argument("--study-overrides", default="",
                   help="extra overrides for --run-study, e.g. '+sweep=smoke'")
    g.add_argument("--cores", type=int, default=None,
                   help="cores of the ideal (default: the cores this process may use)")
    g = p.add_argument_group("scale (through MLflow's public client; --tracking-uri: that server)")
    g.add_argument("--scale-runs", type=int, default=2400,
                   help="runs of the reported sweep (2400: 10x the default study; tiny: 12)")
    g.add_argument("--scale-writers", type=int, default=8,
                   help="writer threads of the ingest window")
    g.add_argument("--scale-window", type=float, default=12.0,
                   help="seconds of the measured ingest window (after --scale-warm)")
    g.add_argument("--scale-warm", type=float, default=4.0,
                   help="seconds the writers run before the ingest window is measured")
    return p.parse_args(argv)


def scale_spec(args: argparse.Namespace) -> Any:
    """The validated ``ScaleSpec``; a bad value exits with status 2 naming the option."""
    from benchmarks.scale import ScaleSpec

    try:
        return ScaleSpec(runs=args.scale_runs, writers=args.scale_writers,
                         warm_s=args.scale_warm, window_s=args.scale_window)
    except ConfigError as err:
        _fail(str(err))


def spec_from(args: argparse.Namespace) -> BenchSpec:
    """The validated ``BenchSpec``; a bad value exits with status 2 naming the option."""
    try:
        return BenchSpec(reps=args.reps, epochs=args.epochs,
                         precision_epochs=args.precision_epochs,
                         accum_rounds=args.accum_rounds, num_samples=args.num_samples,
                         precision=args.precision, accum_steps=args.accum_steps,
                         max_norm=args.max_norm)
    except ConfigError as err:
        _fail(str(err))


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def run_study(args: argparse.Namespace, spec: BenchSpec, out: Path) -> dict[str, Any]:
    """The study part: read (or run and time) a sweep, measure the bare epochs, compare."""
    from stability.tracking.uri import resolve_tracking_uri

    cores = args.cores or usable_cores()
    if cores < 1:
        _fail(f"--cores={cores} is invalid: allowed values are an integer >= 1")
    if args.study_runs < 1 or (args.study_runs > 1 and not args.run_study):
        _fail(f"--study-runs={args.study_runs} is invalid: allowed values are an integer >= 1 "
              "(above 1 only with --run-study)")
    timed: list[tuple[str, float | None]] = []  # (store, timed command wall) per study run
    if args.run_study:
        for i in range(args.study_runs):
            folder = out / ("study" if i == 0 else f"study-{i + 1}")
            if args.study_uri is None:
                # A fresh store every time: the sweeper resumes, and would skip every point
                # that a previous benchmark's study already finished in the same store.
                shutil.rmtree(folder, ignore_errors=True)
            uri = args.study_uri or f"sqlite:///{(folder / 'mlflow.db').resolve()}"
            overhead.prepare_experiment(uri, args.experiment, (folder / "artifacts").resolve())
            _say(f"study {i + 1}/{args.study_runs}: running the sweep against {uri} "
                 f"(log: {folder / 'sweep.log'})")
            timed.append((uri, study.run_study_command(uri, shlex.split(args.study_overrides),
                                                       folder / "sweep.log")))
    else:
        timed.append((resolve_tracking_uri(args.study_uri), None))
    sweeps = [(study.load_sweep(uri, args.experiment, args.sweep_id), wall)
              for uri, wall in timed]
    keys = {r.key for sweep, _ in sweeps for r in sweep.runs}
    _say(f"study: {len(sweeps)} sweep(s), {sum(len(s.runs) for s, _ in sweeps)} runs; timing "
         f"{len(keys)} bare configurations")
    bare = study.bare_epoch_seconds(keys, spec)
    _say(f"study: timing the bare configurations again with {cores} copies at once")
    saturated = study.bare_epoch_seconds_saturated(keys, spec, cores)
    results = [study.study_part(sweep, bare, cores, wall, saturated) for sweep, wall in sweeps]
    # The target is judged on the slowest run; every run's figures are kept.
    worst = max(results, key=lambda r: r.get("command_ratio") or r["parent_ratio"] or 0)
    return worst | {"repeats": results} if len(results) > 1 else worst


def run_parts(args: argparse.Namespace, spec: BenchSpec, parts: list[str], out: Path,
              work: Path) -> dict[str, Any]:
    """Run the requested parts; their results by part name."""
    from stability.tracking.server import start_server

    result: dict[str, Any] = {}
    dirs = overhead.RunDirs(work / "runs")
    server = None
    if {"overhead", "memory"} & set(parts):
        if args.tracking_uri:
            server_uri = args.tracking_uri
        else:
            _say("starting mlflow server")
            server = start_server(work / "server", timeout_s=300)  # slow on a loaded machine
            server_uri = server.uri
        stores = overhead.Stores(server_uri, f"sqlite:///{work / 'mlflow.db'}",
                                 BENCH_EXPERIMENT)
        for uri in (stores.server_uri, stores.sqlite_uri):
            overhead.prepare_experiment(uri, stores.experiment, work / "sqlite-artifacts")
    try:
        if "overhead" in parts:
            result["overhead"] = overhead.overhead_part(spec, dirs, stores, _say)
            if args.profile:
                _say("profiling one instrumented and one tracked run")
                tracking = TrackingConfig(uri=stores.server_uri, experiment=stores.experiment)
                result["profile"] = {
                    "instrumented": profile_call(
                        lambda: overhead.instrumented_samples(spec,
                                                              spec.run_config(dirs.next("p"))),
                        out / "profile-instrumented.txt"),
                    "tracked_server": profile_call(
                        lambda: overhead.tracked_run(spec, spec.run_config(dirs.next("p"),
                                                                           tracking=tracking)),
                        out / "profile-tracked.txt"),
                }
        if "memory" in parts:
            _say("memory: one child process per variant and repetition")
            result["memory"] = memory.memory_part(
                dataclasses.asdict(spec), work, stores.server_uri, stores.experiment,
                reps=args.memory_reps,
                skinny_python=str(args.skinny_python) if args.skinny_python else None)
        if "precision" in parts:
            result["precision"] = overhead.precision_part(spec, dirs, _say)
        if "accum" in parts:
            curve = accum.throughput(spec, say=_say)
            _say("accum: counting gradient syncs on a world-size-1 DDP model")
            syncs = accum.grad_syncs(spec)
            result["accum"] = {"curve": curve, "grad_syncs": {str(k): v for k, v in syncs.items()},
                               "flattens_at": accum.flattens_at(curve)}
            writers.write_json(out / "accum-curve.json", result["accum"])
            accum.plot(curve, out / "accum-curve.png")
        if "study" in parts:
            result["study"] = run_study(args, spec, out)
        if "scale" in parts:
            from benchmarks.scale import run_scale

            result["scale"] = run_scale(scale_spec(args), work / "scale", _say,
                                        args.tracking_uri)
    finally:
        if server is not None:
            server.stop()
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; write JSON and Markdown into ``--out`` and print the tables."""
    args = parse_args(argv)
    spec = spec_from(args)
    if args.memory_reps < 1:
        _fail(f"--memory-reps={args.memory_reps} is invalid: allowed values are an integer >= 1")
    if args.skinny_python is not None and not os.access(args.skinny_python, os.X_OK):
        _fail(f"--skinny-python={args.skinny_python} is invalid: allowed values are the path of "
              "an executable python (e.g. /tmp/skinny-venv/bin/python)")
    parts = list(PARTS) if args.part and "all" in args.part else (args.part or
                                                                   list(DEFAULT_PARTS))
    if "scale" in parts:
        scale_spec(args)  # a bad --scale-* value fails before anything runs
    torch.set_num_threads(1)  # every variant: one intra-op thread, as in a sweep worker
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    result: dict[str, Any] = {
        "command": "python experiments/benchmark.py " + " ".join(sys.argv[1:] if argv is None
                                                                 else argv),
        "machine": machine_info(),
        "spec": dataclasses.asdict(spec),
        "parts": parts,
    }
    with tempfile.TemporaryDirectory(prefix="stability-bench-") as tmp:
        try:
            result |= run_parts(args, spec, parts, out, Path(tmp))
        except ConfigError as err:
            _fail(str(err))
    after = machine_info()
    before_cpu, after_cpu = result["machine"]["cpu_seconds"], after["cpu_seconds"]
    result["machine_after"] = {
        "load_avg_1_5_15": after["load_avg_1_5_15"],
        # machine-wide during the benchmark: how busy the cores were, and how much was stolen
        "cpu_seconds_during": {k: after_cpu[k] - before_cpu[k] for k in after_cpu},
    }
    result["seconds"] = time.time() - started
    result["finished"] = time.strftime("%Y-%m-%d %H:%M %Z")
    result["targets"] = writers.check_targets(result)
    writers.write_json(out / "bench.json", result)
    table = writers.markdown(result)
    (out / "bench.md").write_text(table)
    print(table)
    print(f"wrote {out / 'bench.json'} and {out / 'bench.md'} ({result['seconds']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
