"""What stability telemetry and tracking cost: ``python experiments/benchmark.py --help``.

A thin entry point: the benchmarks are not library code and live in ``benchmarks/``
(see ``benchmarks/cli.py`` and docs/performance.md).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed

from benchmarks.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
