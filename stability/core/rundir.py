"""The files of one run's output folder: what training writes and tracking uploads.

The same relative paths are the run's MLflow artifact paths (``tracking.contract.Artifact``).
"""

from __future__ import annotations

CSV_NAME = "steps.csv"  # one row per optimizer step, flushed per row: the ground truth
CONFIG_NAME = "config.yaml"  # the resolved RunConfig
CHECKPOINT_NAME = "checkpoints/best.pt"  # state_dict at the best validation loss
LAYER_NORMS_NAME = "layer_norms.csv"  # telemetry.per_layer: step x parameter pre-clip norms
ARTIFACTS = (CSV_NAME, CONFIG_NAME, CHECKPOINT_NAME, LAYER_NORMS_NAME)
