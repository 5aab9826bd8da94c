"""Benchmarks: what stability telemetry and tracking cost, how a study scales, accumulation.

``experiments/benchmark.py`` is the entry point (``cli``); this package holds its parts.
Nothing under ``stability/`` imports it; results go to ``benchmarks/results/`` (git-ignored).


- ``spec``: the validated benchmark settings and the ``RunConfig`` every variant trains.
- ``bare``: the reference loop (plain PyTorch, written inline, no telemetry).
- ``timing``: interleaved repetitions and median statistics.
- ``overhead``: instrumented and tracked variants, fixed cost per run, per-precision speed.
- ``memory``: peak RSS of each variant, each in its own child process.
- ``accum``: the accumulation throughput curve (and DDP gradient syncs per step) and its plot.
- ``study``: the default study's wall time against its ideal on this machine's cores.
- ``store_write``: CPU a metric point costs on the embedded store, MLflow's route vs ours.
- ``scale`` (``simulate``: default-study runs without the training): what sizes a tracking
  server, through MLflow's public client only: its ingest rate and the report at 10x the study.
- ``machine``: what the numbers were measured on.
- ``writers``: JSON and Markdown output.
"""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # experiments/sweep.py, conf/ live here
