"""Upload run folders kept locally while the tracking server was away: ``stability sync``.

    python experiments/sync.py outputs/2026-12-01/10-00-00      # one run folder
    python experiments/sync.py multirun/                        # every pending run below it
    python experiments/sync.py --uri http://host:5000 DIR       # another server than the run's

Each pending folder (marked ``SYNC_PENDING``) is replayed into the same MLflow run, skipping
what the server already has; then RUNNING runs of those experiments without heartbeat are
ended as KILLED. Exit status 1 if any folder stays pending. See docs/TRACKING.md.
"""

from stability.cli import sync_main

if __name__ == "__main__":
    sync_main()
