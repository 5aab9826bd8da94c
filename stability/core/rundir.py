"""The files of one run's output folder: what training writes and tracking uploads.

The same relative paths are the run's MLflow artifact paths (``tracking.contract.Artifact``).
"""

from __future__ import annotations

CSV_NAME = "steps.csv"  # one row per optimizer step, flushed per row: the ground truth
CONFIG_NAME = "config.yaml"  # the resolved RunConfig
CHECKPOINT_NAME = "checkpoints/best.pt"  # state_dict at the best validation loss
LAYER_NORMS_NAME = "layer_norms.csv"  # telemetry.per_layer: step x parameter pre-clip norms
LAYER_UPDATES_NAME = "layer_updates.csv"  # telemetry.update_ratio: step x ||dtheta||/||theta||
ARTIFACTS = (CSV_NAME, CONFIG_NAME, CHECKPOINT_NAME, LAYER_NORMS_NAME,
             LAYER_UPDATES_NAME)  # uploaded when present
# Not uploaded: local bookkeeping of durability and resume (docs/TRACKING.md).
JOURNAL_NAME = "tracking.jsonl"  # append-only record of what the run sends to MLflow
PENDING_NAME = "SYNC_PENDING"  # present while MLflow lacks part of the run: `sync` uploads it
RESUME_NAME = "checkpoints/last.pt"  # state after the last whole epoch; removed when a run ends
