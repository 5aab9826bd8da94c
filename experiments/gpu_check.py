"""The CUDA checks of issue 48 in one go (about 5 minutes on one GPU): paste its output into
docs/performance.md ("Host reads per optimizer step").

    PYTHONPATH=. python experiments/gpu_check.py            # needs a CUDA device
    PYTHONPATH=. python experiments/gpu_check.py --epochs 4 --skip-tests

1. ``pytest tests/core/test_host_reads.py -k cuda``: each precision x accumulation (1, 4) of our
   loop under ``torch.cuda.set_sync_debug_mode("error")`` (any device sync but the counted
   read raises), one read of a CUDA tensor per step.
2. Host reads of CUDA tensors per steady-state optimizer step (``benchmarks.host_reads``), by
   origin, for the default task with clip on, per precision and accumulation.
3. Instrumented (``stability.core.loop.train``, tracking off) against the bare loop
   (``benchmarks/bare.py``) per precision: the median epoch's seconds (training + validation,
   the first epoch dropped), interleaved bare / instrumented per precision.

Prints one markdown table per part.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ is not installed

import torch  # noqa: E402

from benchmarks.bare import BareLoop  # noqa: E402
from benchmarks.host_reads import ORIGINS, counted  # noqa: E402
from stability.core.config import ClipConfig, PrecisionConfig, RunConfig  # noqa: E402
from stability.core.loop import train  # noqa: E402

PRECISIONS = ("fp32", "fp16", "bf16")


def _cfg(out: str, precision: str, accum: int, epochs: int) -> RunConfig:
    base = RunConfig(seed=0, device="cuda", output_dir=out,
                     precision=PrecisionConfig(precision), clip=ClipConfig(enabled=True))
    return replace(base, train=replace(base.train, epochs=epochs, accum_steps=accum))


def reads_table(epochs: int) -> list[str]:
    """Reads of CUDA tensors per steady-state step, by origin, per precision x accumulation."""
    rows = ["| precision | accum | steps counted | " + " | ".join(ORIGINS) + " |",
            "|---|---:|---:|" + "---:|" * len(ORIGINS)]
    for precision in PRECISIONS:
        for accum in (1, 4):
            with tempfile.TemporaryDirectory() as out, counted(device="cuda") as steps:
                train(_cfg(out, precision, accum, epochs), sinks=[steps])
            table = steps.table()
            rows.append(f"| {precision} | {accum} | {len(steps.steps)} | "
                        + " | ".join(f"{table[o]:.2f}" for o in ORIGINS) + " |")
    return rows


def timing_table(epochs: int) -> list[str]:
    """Median epoch seconds, bare and instrumented, per precision (accum 1, clip on)."""
    rows = ["| precision | bare s/epoch | instrumented s/epoch | instrumented / bare |",
            "|---|---:|---:|---:|"]
    for precision in PRECISIONS:
        bare, ours = [], []
        for _ in range(2):  # interleaved: bare, ours, bare, ours
            with tempfile.TemporaryDirectory() as out:
                cfg = _cfg(out, precision, 1, epochs)
                bare += BareLoop(cfg).run()[1:]
                ours += [e.seconds for e in train(cfg).epochs[1:]]
        b, o = statistics.median(bare), statistics.median(ours)
        rows.append(f"| {precision} | {b:.3f} | {o:.3f} | {o / b:.3f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the checks; 1 when no CUDA device is there or the sync tests fail."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=6, help="epochs per run (default 6)")
    parser.add_argument("--skip-tests", action="store_true", help="skip the pytest part")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check here (tests/core/test_host_reads.py counts on CPU)")
        return 1
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    failed = 0
    if not args.skip_tests:
        failed = subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                  "-q", "tests/core/test_host_reads.py", "-k", "cuda"], cwd=ROOT)
        print(f"\nsync-debug tests: {'passed' if failed == 0 else 'FAILED'}\n")
    print("Host reads of CUDA tensors per steady-state optimizer step (clip on):\n")
    print("\n".join(reads_table(args.epochs)))
    print("\nEpoch seconds (training + validation, first epoch dropped, 2 runs each):\n")
    print("\n".join(timing_table(args.epochs)))
    return int(failed != 0)


if __name__ == "__main__":
    sys.exit(main())
