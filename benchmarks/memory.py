"""Peak memory of a run, per variant, each in a fresh child process.

Measured as the child's peak resident set size (``VmHWM`` in ``/proc/self/status``): it
counts everything the operating system has to hold for the run (the interpreter, torch's
libraries, Python objects, tensors from torch's CPU allocator, MLflow when imported), which
is what decides how many runs fit on a machine. ``tracemalloc`` would see Python objects only,
not tensor storage; torch's CPU allocator keeps no peak statistics (only CUDA does). A fresh
process per variant is needed because a peak can never go down: measured in one process, the
second variant would inherit the first one's. The RSS right after the imports is reported too,
so the run's own working set (peak minus that) is visible apart from the libraries.

How MLflow is imported is part of the variant: ``tracked`` imports it in full first (every
worker did before ``stability.tracking.lean``; a run on the embedded SQLite store still does),
``tracked-lean`` the way a worker that logs to a server now does (``import_mlflow``: no pandas,
pyarrow or scipy). ``tracked-skinny-full`` and ``tracked-skinny`` are the same two in a virtual
environment with ``mlflow-skinny`` instead of ``mlflow``, only when its interpreter is given.

Run as ``python -m benchmarks.memory VARIANT JSON`` (the parent does this).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import PROJECT_ROOT

VARIANTS = ("bare", "instrumented", "tracked", "tracked-lean")
# Run by the interpreter of an mlflow-skinny venv: name -> the child variant it runs there.
SKINNY = {"tracked-skinny-full": "tracked", "tracked-skinny": "tracked-lean"}
# Reported per child: which of the libraries a worker should not need ended up imported.
WATCHED = ("pandas", "pyarrow", "scipy", "sklearn", "matplotlib", "sqlalchemy", "alembic",
           "flask")


def _rss_now_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_rss_mib() -> float:
    # VmHWM, the high-water mark of this process image's RSS. Not ru_maxrss on Linux: across
    # fork+exec it keeps the parent's RSS at fork time (the benchmark's own ~500 MiB, torch
    # and MLflow loaded), which would hide every child's real peak.
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # macOS: bytes


def _child(variant: str, payload: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    # A sweep worker has MLflow loaded before training (its first run's client() imports it):
    # imported up front, so the RSS after the imports includes it.
    if variant == "tracked":
        import mlflow.tracking  # noqa: F401  (in full, as before stability.tracking.lean)
    elif variant.startswith("tracked-"):
        from stability.tracking.lean import import_mlflow

        import_mlflow(server=True)  # what client() does first for an http(s):// store
    from benchmarks.spec import BenchSpec
    from stability.core.config import TelemetryConfig, TrackingConfig

    tracked = variant.startswith("tracked")
    if variant == "bare":
        from benchmarks.bare import bare_epochs as run
    elif variant == "instrumented":
        from stability.core.loop import train as run
    else:
        from stability.sweep.job import train_tracked as run
    import_s = time.perf_counter() - t0
    rss_imports = _rss_now_mib()

    spec = BenchSpec(**payload["spec"])
    tracking = (TrackingConfig(uri=payload["uri"], experiment=payload["experiment"])
                if tracked else None)
    # tracked is what a sweep worker runs: the default telemetry.per_layer
    run(spec.run_config(payload["output_dir"], tracking=tracking,
                        per_layer=tracked and TelemetryConfig().per_layer))
    return {"variant": variant, "import_s": import_s, "rss_after_imports_mib": rss_imports,
            "peak_rss_mib": _peak_rss_mib(), "modules": len(sys.modules),
            "loaded": [m for m in WATCHED if sys.modules.get(m) is not None]}


def measure(variant: str, spec_fields: dict[str, Any], output_dir: str,
            uri: str | None = None, experiment: str | None = None,
            python: str | None = None) -> dict[str, Any]:
    """Run ``variant`` in a child process; its import time, RSS after imports and peak RSS.

    Args:
        variant: one of ``VARIANTS``.
        spec_fields: ``BenchSpec`` fields (plain values, sent as JSON).
        output_dir: the run's output directory.
        uri: tracking URI (``tracked*`` only).
        experiment: experiment name (``tracked*`` only).
        python: the child's interpreter (default: this one), e.g. an mlflow-skinny venv's.

    Raises:
        RuntimeError: the child failed (its stderr is quoted).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is invalid: allowed values are "
                         f"{' | '.join(VARIANTS)}")
    payload = {"spec": spec_fields, "output_dir": output_dir, "uri": uri,
               "experiment": experiment}
    # This checkout first: another venv's interpreter measures the same code.
    env = os.environ | {"PYTHONPATH": os.pathsep.join(
        p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run(
        [python or sys.executable, "-m", "benchmarks.memory", variant, json.dumps(payload)],
        capture_output=True, text=True, env=env, timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory child {variant} failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    # MLflow prints run links to stdout; the child's JSON is its last line starting with "{".
    line = next(ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{"))
    return json.loads(line)


def memory_part(spec_fields: dict[str, Any], workdir: Path, uri: str, experiment: str,
                reps: int = 2, skinny_python: str | None = None) -> dict[str, Any]:
    """Peak RSS of each variant (median of ``reps`` interleaved child runs) and its ratio.

    Args:
        spec_fields: ``BenchSpec`` fields.
        workdir: parent of the runs' output directories.
        uri: tracking URI of the tracked variants (an existing experiment on a server).
        experiment: its experiment name.
        reps: child runs per variant.
        skinny_python: interpreter of a venv with ``mlflow-skinny`` instead of ``mlflow``;
            adds the ``SKINNY`` variants (skipped without it).
    """
    runs = {v: (v, None) for v in VARIANTS}  # name: (child variant, interpreter)
    if skinny_python:
        runs |= {name: (child, skinny_python) for name, child in SKINNY.items()}
    names = list(runs)
    samples: dict[str, list[dict[str, Any]]] = {v: [] for v in names}
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            variant, python = runs[name]
            out = str(workdir / f"memory-{name}-{rep}")
            samples[name].append(measure(variant, spec_fields, out, uri, experiment, python))

    def med(name: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[name])

    bare_peak = med("bare", "peak_rss_mib")
    return {
        name: {
            "peak_rss_mib": med(name, "peak_rss_mib"),
            "rss_after_imports_mib": med(name, "rss_after_imports_mib"),
            "run_working_set_mib": med(name, "peak_rss_mib")
            - med(name, "rss_after_imports_mib"),
            "import_s": med(name, "import_s"),
            "ratio_vs_bare": med(name, "peak_rss_mib") / bare_peak,
            "modules": med(name, "modules"),
            "loaded": sorted({m for s in samples[name] for m in s["loaded"]}),
        }
        for name in names
    }


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], json.loads(sys.argv[2]))))
