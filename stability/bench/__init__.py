"""Benchmarks: what stability telemetry and tracking cost, how a study scales, accumulation.

``experiments/benchmark.py`` is the entry point; this package holds its parts:

- ``spec``: the validated benchmark settings and the ``RunConfig`` every variant trains.
- ``bare``: the reference loop (plain PyTorch, written inline, no telemetry).
- ``timing``: interleaved repetitions and median statistics.
- ``overhead``: instrumented and tracked variants, fixed cost per run, per-precision speed.
- ``memory``: peak RSS of each variant, each in its own child process.
- ``accum``: the accumulation throughput curve (and DDP gradient syncs per step) and its plot.
- ``study``: the default study's wall time against its ideal on this machine's cores.
- ``machine``: what the numbers were measured on.
- ``writers``: JSON and Markdown output.
"""
