"""Peak memory of a run, per variant, each in a fresh child process.

Measured as the child's peak resident set size (``VmHWM`` in ``/proc/self/status``): it
counts everything the operating system has to hold for the run (the interpreter, torch's
libraries, Python objects, tensors from torch's CPU allocator, MLflow when imported), which
is what decides how many runs fit on a machine. ``tracemalloc`` would see Python objects only,
not tensor storage; torch's CPU allocator keeps no peak statistics (only CUDA does). A fresh
process per variant is needed because a peak can never go down: measured in one process, the
second variant would inherit the first one's. The RSS right after the imports is reported too,
so the run's own working set (peak minus that) is visible apart from the libraries.

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

VARIANTS = ("bare", "instrumented", "tracked")


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
    if variant == "tracked":
        import mlflow.tracking  # noqa: F401  (a sweep worker has MLflow loaded before training)
    from benchmarks.spec import BenchSpec
    from stability.core.config import TelemetryConfig, TrackingConfig

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
                if variant == "tracked" else None)
    # tracked is what a sweep worker runs: the default telemetry.per_layer
    run(spec.run_config(payload["output_dir"], tracking=tracking,
                        per_layer=variant == "tracked" and TelemetryConfig().per_layer))
    return {"variant": variant, "import_s": import_s, "rss_after_imports_mib": rss_imports,
            "peak_rss_mib": _peak_rss_mib()}


def measure(variant: str, spec_fields: dict[str, Any], output_dir: str,
            uri: str | None = None, experiment: str | None = None) -> dict[str, Any]:
    """Run ``variant`` in a child process; its import time, RSS after imports and peak RSS.

    Args:
        variant: ``bare``, ``instrumented`` or ``tracked``.
        spec_fields: ``BenchSpec`` fields (plain values, sent as JSON).
        output_dir: the run's output directory.
        uri: tracking URI (``tracked`` only).
        experiment: experiment name (``tracked`` only).

    Raises:
        RuntimeError: the child failed (its stderr is quoted).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is invalid: allowed values are "
                         f"{' | '.join(VARIANTS)}")
    payload = {"spec": spec_fields, "output_dir": output_dir, "uri": uri,
               "experiment": experiment}
    env = os.environ | {"PYTHONPATH": os.pathsep.join(
        p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", variant, json.dumps(payload)],
        capture_output=True, text=True, env=env, timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory child {variant} failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    # MLflow prints run links to stdout; the child's JSON is its last line starting with "{".
    line = next(ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{"))
    return json.loads(line)


def memory_part(spec_fields: dict[str, Any], workdir: Path, uri: str, experiment: str,
                reps: int = 2) -> dict[str, Any]:
    """Peak RSS of each variant (median of ``reps`` interleaved child runs) and its ratio.

    Args:
        spec_fields: ``BenchSpec`` fields.
        workdir: parent of the runs' output directories.
        uri: tracking URI of the ``tracked`` variant (an existing experiment).
        experiment: its experiment name.
        reps: child runs per variant.
    """
    samples: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for rep in range(reps):
        for variant in VARIANTS if rep % 2 == 0 else VARIANTS[::-1]:
            out = str(workdir / f"memory-{variant}-{rep}")
            samples[variant].append(measure(variant, spec_fields, out, uri, experiment))

    def med(variant: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[variant])

    bare_peak = med("bare", "peak_rss_mib")
    return {
        variant: {
            "peak_rss_mib": med(variant, "peak_rss_mib"),
            "rss_after_imports_mib": med(variant, "rss_after_imports_mib"),
            "run_working_set_mib": med(variant, "peak_rss_mib")
            - med(variant, "rss_after_imports_mib"),
            "import_s": med(variant, "import_s"),
            "ratio_vs_bare": med(variant, "peak_rss_mib") / bare_peak,
        }
        for variant in VARIANTS
    }


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], json.loads(sys.argv[2]))))
