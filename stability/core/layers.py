"""Per-layer gradient norms (``telemetry.per_layer=true``): a step x parameter table.

Written as the artifact ``layer_norms.csv``, not as MLflow metrics: one metric key per
parameter would put thousands of keys on a run, which slows the MLflow UI (mlflow issues
#11927, #9779).

The recorder runs after ``TrainStep.step`` returned, when ``p.grad`` holds the unscaled
gradients of that step (``zero_grad`` happens at the start of the next step). With norm
clipping those are already clipped, by one factor for every parameter; the pre-clip norms are
the post-clip ones times ``grad_l2_pre_clip / grad_l2_post_clip`` of the same step. With
``clip.method=value`` no such factor exists, and the table holds the norms after clipping.
A skipped step keeps its non-finite values, so the first non-finite parameter is visible.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stability.core.steplog import EpochLog, StepLog


class LayerNormRecorder:
    """One ``torch._foreach_norm`` and one host read per step; rows appended once an epoch.

    A step sink (``core.sinks.StepSink``). The table grows on disk at every epoch end
    (``on_epoch``), before that epoch's resume checkpoint, so a run killed (even by SIGKILL)
    and resumed from its checkpoint (``load_state_dict``) keeps the rows up to its resume point
    and ends with the same table as a run never interrupted.

    Args:
        model: the unwrapped module (parameter names without DDP's ``module.`` prefix).
        rescale_to_pre_clip: norm clipping is on, so post-clip norms are rescaled.
        path: the table (``layer_norms.csv`` in the run folder).
    """

    def __init__(self, model: nn.Module, rescale_to_pre_clip: bool, path: Path) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.rescale = rescale_to_pre_clip
        self.path = path
        self.rows: list[list[float]] = []  # not yet on disk
        self._zeros = [torch.zeros((), device=p.device) for p in self.params]
        self._fresh = True  # the first flush starts the table (unless resume() kept one)
        self.last_step = 0  # the last step recorded

    def state_dict(self) -> dict[str, Any]:
        """The last step recorded (on disk once ``on_epoch`` flushed it)."""
        return {"step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Cut the table on disk back to the rows of ``state_dict`` and continue it."""
        self.resume(int(state["step"]))

    def resume(self, last_step: int) -> None:
        """Keep the rows of steps ``<= last_step`` of an earlier attempt (the resume point)."""
        self.rows = []
        kept: list[list[str]] = []
        if self.path.exists():
            with self.path.open(newline="") as f:
                reader = csv.reader(f)
                header = next(reader, None)
                if header == ["step", *self.names]:  # else another model's table: start over
                    kept = [row for row in reader if row and int(row[0]) <= last_step]
        with self.path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", *self.names])
            w.writerows(kept)
        self._fresh = False
        self.last_step = last_step

    def on_step(self, log: StepLog, epoch: int = 0) -> None:
        """Record this step's per-parameter norms (a parameter without gradient reads 0)."""
        grads = [p.grad if p.grad is not None else z for p, z in zip(self.params, self._zeros,
                                                                     strict=True)]
        norms = torch.stack(torch._foreach_norm(grads)).float()
        factor = 1.0
        if self.rescale and log.clipped and log.grad_l2_post_clip > 0:
            factor = log.grad_l2_pre_clip / log.grad_l2_post_clip
        values = norms.tolist()
        if factor != 1.0:
            values = [v * factor for v in values]
        self.rows.append([log.step, *values])
        self.last_step = log.step

    def on_epoch(self, log: EpochLog) -> None:
        """``StepSink``: the epoch's rows go to disk (before its resume checkpoint)."""
        self.flush()

    def flush(self) -> None:
        """Append the rows recorded since the last flush (every epoch end, and at the end)."""
        self._write_rows(self.rows, mode="w" if self._fresh else "a")
        self.rows, self._fresh = [], False

    def _write_rows(self, rows: list[list[float]], mode: str) -> None:
        """``step`` then one column per parameter name; non-finite values as ``inf``/``nan``."""
        with self.path.open(mode, newline="") as f:
            w = csv.writer(f)
            if mode == "w":
                w.writerow(["step", *self.names])
            for step, *values in rows:
                w.writerow([int(step), *(v if math.isfinite(v) else str(v) for v in values)])
