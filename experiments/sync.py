"""Upload run folders kept locally while the tracking server was away.

    python experiments/sync.py outputs/2026-12-01/10-00-00      # one run folder
    python experiments/sync.py multirun/                        # every pending run below it
    python experiments/sync.py --uri http://host:5000 DIR       # another server than the run's

Each pending folder (marked ``SYNC_PENDING``) is replayed into the same MLflow run, skipping
what the server already has; then RUNNING runs of those experiments without heartbeat are
ended as KILLED. Exit status 1 if any folder stays pending. See docs/TRACKING.md.
"""

from __future__ import annotations

import argparse
import logging
import sys

from stability.tracking.sync import pending_folders, sync_paths
from stability.tracking.uri import configure_http

REQUEST_TIMEOUT_S = 30  # one HTTP request (MLflow's own retries off: every call is retried)


def main(argv: list[str] | None = None) -> int:
    """Sync the paths given (default: the current folder); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=["."], help="run folders or folders above")
    parser.add_argument("--uri", default=None, help="tracking URI (default: each run's own)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    configure_http(REQUEST_TIMEOUT_S)
    wanted = pending_folders(args.paths)
    results = sync_paths(args.paths, args.uri)
    for r in results:
        print(r.line())
    left = len(wanted) - len(results)
    print(f"synced {len(results)} of {len(wanted)} pending runs" + (f"; {left} stay pending"
                                                                     if left else ""))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
