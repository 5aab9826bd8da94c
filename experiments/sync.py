"""Upload run folders kept locally while the tracking server was away.

    python experiments/sync.py outputs/2026-12-01/10-00-00      # one run folder
    python experiments/sync.py multirun/                        # every pending run below it
    python experiments/sync.py --uri http://host:5000 DIR       # another server than the run's

Each pending folder (marked ``SYNC_PENDING``) is replayed into the same MLflow run, skipping
what the server already has; then RUNNING runs of those experiments without heartbeat are
ended as KILLED. Exit status 1 if any folder stays pending. See docs/TRACKING.md.
"""

from __future__ import annotations

import sys

from stability.tracking.sync import main

if __name__ == "__main__":
    sys.exit(main())
