"""Per-layer gradient norms and update-to-weight ratios (``telemetry.*``): step x parameter.

Written as the artifacts ``layer_norms.csv`` and ``layer_updates.csv``, not as MLflow metrics:
one metric key per parameter would put thousands of keys on a run, which slows the MLflow UI
(mlflow issues #11927, #9779).

The recorder runs after ``TrainStep.step`` returned, when ``p.grad`` holds the unscaled
gradients of that step (``zero_grad`` happens at the start of the next step). With norm
clipping those are already clipped, by one factor for every parameter; the pre-clip norms are
the post-clip ones times ``grad_l2_pre_clip / grad_l2_post_clip`` of the same step. With
``clip.method=value`` no such factor exists, and the table holds the norms after clipping.
A skipped step keeps its non-finite values, so the first non-finite parameter is visible.

With ``telemetry.update_ratio`` the recorder is also a step hook: it copies the parameters
when the gradients are ready (``on_gradients``, before the optimizer step) and, after the
step, records ``||delta theta|| / ||theta||`` (theta after the step) per parameter and
globally (``global``, the norms over every parameter) in ``layer_updates.csv``; a skipped
step moved nothing (0). The
usual reading is about 1e-3 a step (Karpathy's rule of thumb; Composer logs the same ratio).
Both tables share one host read, made when the rows are written (every epoch end): each
step's norms stay on the device until then (on CUDA: copied into pinned host memory without
blocking, ``non_blocking=True``), so the recorder adds no device sync to a step. ``summary()``
gives the run's median and maximum global ratio over the steps taken (``update_ratio_p50``,
``update_ratio_max``).
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stability.core.steplog import EpochLog, StepLog

# Steps whose norms wait on the device at most (one host read per this many steps in an
# epoch longer than that; at every epoch end otherwise).
READ_EVERY = 512


class _StepTable:
    """A CSV of ``step`` + columns, appended at each flush; cut back to a step on resume."""

    def __init__(self, path: Path, header: list[str]) -> None:
        self.path = path
        self.header = header
        self.rows: list[list[float]] = []  # not yet on disk
        self.fresh = True  # the first flush starts the table (unless resume() kept one)

    def resume(self, last_step: int) -> None:
        self.rows = []
        kept: list[list[str]] = []
        if self.path.exists():
            with self.path.open(newline="") as f:
                reader = csv.reader(f)
                if next(reader, None) == self.header:  # else another model's table: start over
                    kept = [row for row in reader if row and int(row[0]) <= last_step]
        with self.path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(self.header)
            w.writerows(kept)
        self.fresh = False

    def flush(self) -> None:
        """``step`` then the values; non-finite values as ``inf``/``nan``."""
        with self.path.open("w" if self.fresh else "a", newline="") as f:
            w = csv.writer(f)
            if self.fresh:
                w.writerow(self.header)
            for step, *values in self.rows:
                w.writerow([int(step), *(v if math.isfinite(v) else str(v) for v in values)])
        self.rows, self.fresh = [], False


class LayerNormRecorder:
    """One ``torch._foreach_norm`` (three with update ratios) per step, read at the flush.

    A step sink (``core.sinks.StepSink``) and, with ``updates_path``, a step hook
    (``core.step.StepHook``). The tables grow on disk at every epoch end (``on_epoch``),
    before that epoch's resume checkpoint, so a run killed (even by SIGKILL) and resumed from
    its checkpoint (``load_state_dict``) keeps the rows up to its resume point and ends with
    the same tables as a run never interrupted.

    Args:
        model: the unwrapped module (parameter names without DDP's ``module.`` prefix).
        rescale_to_pre_clip: norm clipping is on, so post-clip norms are rescaled.
        path: the gradient-norm table (``layer_norms.csv`` in the run folder).
        updates_path: the update-ratio table (``layer_updates.csv``); None: not measured.
    """

    def __init__(self, model: nn.Module, rescale_to_pre_clip: bool, path: Path,
                 updates_path: Path | None = None) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.rescale = rescale_to_pre_clip
        self.path = path
        self.norms = _StepTable(path, ["step", *self.names])
        self.updates = (_StepTable(updates_path, ["step", "global", *self.names])
                        if updates_path is not None else None)
        self._zeros = [torch.zeros((), device=p.device) for p in self.params]
        # The parameters before the step: one buffer each, copied into (no allocation a step).
        self._before = ([torch.empty_like(p) for p in self.params]
                        if self.updates is not None else [])
        self._copied = False  # on_gradients ran for this step (a skipped loss never gets there)
        self.ratios: list[float] = []  # global ratio of every step taken (the summary)
        self.last_step = 0  # the last step recorded
        # Steps recorded but not yet read from the device: (log, norms vector, measured).
        self._pending: list[tuple[StepLog, torch.Tensor, bool]] = []

    @property
    def rows(self) -> list[list[float]]:
        """Gradient-norm rows not yet on disk."""
        self._read()
        return self.norms.rows

    def state_dict(self) -> dict[str, Any]:
        """The last step recorded (on disk once ``on_epoch`` flushed it) and the ratios."""
        self._read()
        return {"step": self.last_step, "ratios": list(self.ratios)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Cut the tables on disk back to the rows of ``state_dict`` and continue them."""
        self.resume(int(state["step"]))
        self.ratios = [float(r) for r in state.get("ratios", [])][: self.last_step]

    def resume(self, last_step: int) -> None:
        """Keep the rows of steps ``<= last_step`` of an earlier attempt (the resume point)."""
        self._pending = []
        for table in (self.norms, self.updates):
            if table is not None:
                table.resume(last_step)
        self.last_step = last_step

    def on_micro_batch(self, step: int, x: torch.Tensor,
                       y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``StepHook``: the micro-batch as it is."""
        return x, y

    def on_gradients(self, step: int, params: object) -> None:
        """``StepHook``: the gradients exist and the optimizer has not stepped: copy theta."""
        if self.updates is not None:
            with torch.no_grad():  # on leaf parameters autograd's checks triple the cost
                torch._foreach_copy_(self._before, self.params)
            self._copied = True

    def on_step(self, log: StepLog, epoch: int = 0) -> None:
        """Record this step's per-parameter norms (a parameter without gradient reads 0)."""
        grads = [p.grad if p.grad is not None else z for p, z in zip(self.params, self._zeros,
                                                                     strict=True)]
        measured = self.updates is not None and self._copied and not log.skipped
        # The step's norms in the fewest ops (read later, with other steps'): on a small model
        # each op's dispatch, not its arithmetic, is the cost (benchmarks/update_ratio.py);
        # no_grad, or ops on the leaf parameters pay autograd's bookkeeping.
        with torch.no_grad():
            if measured:  # gradients, -(delta theta) (in the buffer) and theta: one norm call
                torch._foreach_sub_(self._before, self.params)
                tensors = grads + self._before + self.params
            else:
                tensors = grads
            values = torch.stack(torch._foreach_norm(tensors)).float()
            if values.is_cuda:  # on its way to the host now, read at the flush: no sync
                host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
                values = host.copy_(values, non_blocking=True)
        self._copied = False
        self._pending.append((log, values, measured))
        self.last_step = log.step
        if len(self._pending) >= READ_EVERY:  # a long epoch holds at most this many
            self._read()

    def _read(self) -> None:
        """The pending steps' norms, read from the device at once, into the tables' rows."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if pending[0][1].device.type == "cpu" and torch.cuda.is_available():
            torch.cuda.synchronize()  # the non-blocking copies into pinned memory are done
        flat = torch.cat([v for _, v, _ in pending]).tolist()
        at = 0
        for log, vector, measured in pending:
            values = flat[at: at + vector.numel()]
            at += vector.numel()
            self._row(log, values, measured)

    def _row(self, log: StepLog, values: list[float], measured: bool) -> None:
        n = len(self.params)
        norms = values[:n]
        factor = 1.0
        if self.rescale and log.clipped and log.grad_l2_post_clip > 0:
            factor = log.grad_l2_pre_clip / log.grad_l2_post_clip
        if factor != 1.0:
            norms = [v * factor for v in norms]
        self.norms.rows.append([log.step, *norms])
        if self.updates is not None:
            if measured:
                delta, weight = values[n:2 * n], values[2 * n:]
                whole = math.sqrt(sum(w * w for w in weight))
                total = math.sqrt(sum(d * d for d in delta)) / whole if whole > 0 else math.nan
                per = [d / w if w > 0 else math.nan for d, w in zip(delta, weight, strict=True)]
                self.ratios.append(total)
            else:  # skipped: the parameters did not move
                total, per = 0.0, [0.0] * n
            self.updates.rows.append([log.step, total, *per])

    def on_epoch(self, log: EpochLog) -> None:
        """``StepSink``: the epoch's rows go to disk (before its resume checkpoint)."""
        self.flush()

    def flush(self) -> None:
        """Append the rows recorded since the last flush (every epoch end, and at the end)."""
        self._read()
        for table in (self.norms, self.updates):
            if table is not None:
                table.flush()

    def summary(self) -> dict[str, float]:
        """The global update-to-weight ratio over the steps taken: median and maximum."""
        self._read()
        if self.updates is None:
            return {}
        finite = [r for r in self.ratios if math.isfinite(r)]
        if not finite:
            return {"update_ratio_p50": math.nan, "update_ratio_max": math.nan}
        return {"update_ratio_p50": statistics.median(finite), "update_ratio_max": max(finite)}
