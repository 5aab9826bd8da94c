"""The trainer-neutral half of an integration: measure a step, hand it to the run's sinks.

A trainer callback calls ``before_step`` where the trainer holds the unscaled, not yet clipped
gradients of an optimizer step, ``finish_step`` once the trainer has stepped (or skipped) and
the gradients are still there, ``emit`` once it has had its chance to advance its LR
scheduler, and ``end_epoch`` after validation. The records are our
loop's: a ``StepLog`` (as ``TrainerStepLog``, one more field) through the same sinks, in our
loop's order: ``layers`` (optional), ``diagnostics``, ``csv``, the caller's (e.g. a
``TrackedRun``'s ``sink``); the epochs, best epoch, state and summary are our loop's
``core.assembly.RunAssembly``.

Only ``steps.csv`` of a trainer run has the column ``scheduler_stepped`` (1 when the trainer
advanced an LR scheduler during the step): our own loop never steps a scheduler on a skipped
step, so its ``steps.csv`` keeps its columns (and bytes). A skipped step with
``scheduler_stepped=1`` is the "scheduler advanced on a skipped step" case (Lightning #5558).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stability.core.assembly import RunAssembly, standard_sinks
from stability.core.clipping import CLIP_EPS, grad_global_norm, grad_norms
from stability.core.config import ClipConfig
from stability.core.cost import CostMeter
from stability.core.layers import LayerNormRecorder
from stability.core.measure import Measurement, StepMeter, _first_non_finite, measure
from stability.core.monitor import Diagnostics
from stability.core.precision import fp16_underflow_fraction
from stability.core.rundir import CSV_NAME, LAYER_NORMS_NAME
from stability.core.sinks import ParamSink, StepSink
from stability.core.steplog import (
    CSV_COLUMNS,
    CsvStepWriter,
    EpochLog,
    SkipReason,
    StepLog,
    extend,
)
from stability.tracking.contract import SCHEDULER_STEPPED, SCHEDULER_STEPS_ON_SKIP

# steps.csv of a trainer run: our columns, then the trainer's own.
TRAINER_CSV_COLUMNS = (*CSV_COLUMNS, SCHEDULER_STEPPED)


@dataclass(frozen=True)
class TrainerStepLog(StepLog):
    """A ``StepLog`` of a trainer we do not own: did the trainer advance its LR scheduler."""

    scheduler_stepped: int = 0


assert SCHEDULER_STEPPED in {f.name for f in fields(TrainerStepLog)}
MEASURE_ONLY = ClipConfig(enabled=False)  # the trainer clips; the recorder only measures


@dataclass(slots=True)
class _Pending:
    """What ``before_step`` measured, waiting for the trainer to step (``m`` is None until
    ``took_norm`` hands in the norm the trainer's own clip took). Mutable, with slots: one a
    step, completed in place (a frozen dataclass sets each field through
    ``object.__setattr__``, on every optimizer step)."""

    step: int
    lr: float
    m: Measurement | None
    params: list[nn.Parameter]  # what was measured: a measured post-clip norm reads them again
    scale: float = 1.0  # the loss scale of the step's backward (a deferred norm's record)
    underflow: float = math.nan  # sampled before the clip (a deferred norm's record)


def _with_scheduler_stepped(log: StepLog, stepped: int) -> TrainerStepLog:
    """``log`` as a ``TrainerStepLog`` with ``scheduler_stepped`` (``steplog.extend``)."""
    return extend(log, TrainerStepLog, scheduler_stepped=stepped)


class StepRecorder:
    """Measures each optimizer step of a foreign trainer and feeds the run's step sinks.

    Args:
        folder: the run folder (``steps.csv``, ``layer_norms.csv``).
        clip: the trainer's clip setting (for ``clipped`` and the per-layer rescaling);
            the trainer clips, this never does.
        model: the module (per-layer names, the first non-finite parameter).
        per_layer: also write ``layer_norms.csv``.
        sinks: more step sinks after the CSV (e.g. ``TrackedRun.sink``).
        underflow_every: sample the fp16 underflow share on step 1 and every N steps.
        derive_norm_clip: the trainer clips by norm the standard way, so the post-clip norm
            is derived from the pre-clip one (False: measured on the clipped gradients).
    """

    def __init__(self, folder: str | Path, clip: ClipConfig, model: nn.Module, *,
                 per_layer: bool = False, sinks: Sequence[StepSink] = (),
                 underflow_every: int = 25, derive_norm_clip: bool = True) -> None:
        self.folder = Path(folder)
        self.derive_norm_clip = derive_norm_clip
        self.folder.mkdir(parents=True, exist_ok=True)
        self.clip = clip
        self.model = model
        self.meter = StepMeter(clip, None, underflow_every)
        self.diagnostics = Diagnostics()
        self.csv = CsvStepWriter(self.folder / CSV_NAME, columns=TRAINER_CSV_COLUMNS)
        self.layers = (LayerNormRecorder(model, clip.enabled and clip.method == "norm",
                                         self.folder / LAYER_NORMS_NAME) if per_layer else None)
        # The cost metrics, measured as our loop measures them (core.cost): the wall time
        # from the step's first micro-batch (its batch already fetched) to its record.
        first = next(iter(model.parameters()), None)
        self.cost = CostMeter(first.device if first is not None else "cpu")
        # Our loop's assembly (core.assembly): the named sinks, epochs, best epoch, summary.
        self.run = RunAssembly(
            standard_sinks(self.diagnostics, layers=self.layers, csv=self.csv, extras=sinks),
            self.diagnostics, self.cost)
        # The per-layer table sees each step in finish_step (it reads .grad, which a trainer
        # may zero before it steps its scheduler), the rest in emit; every sink sees the epoch.
        self.sinks: list[StepSink] = [s for name, s in self.run.sinks.items() if name != "layers"]
        self.scheduler_steps_on_skip = 0
        self._pending: _Pending | None = None
        self._finished: StepLog | None = None
        self.effective_batch = math.nan  # the trainer's batch x accumulation (set_batch)
        self._scaler: torch.amp.GradScaler | None = None
        self._window_t0: float | None = None

    def set_batch(self, batch_size: int | None, accum_steps: int) -> None:
        """The trainer's batch size and accumulation: ``effective_batch`` (NaN when unknown)."""
        self.effective_batch = (batch_size * accum_steps if batch_size else math.nan)

    def log_params(self, params: Mapping[str, object]) -> None:
        """What the trainer built (``optimizer_params``, ``schedule_params``...) to every sink
        that takes params (``core.sinks.ParamSink``: the MLflow run's buffer)."""
        text = {k: str(v) for k, v in params.items()}
        for sink in self.sinks:
            if isinstance(sink, ParamSink):
                sink.on_params(text)

    def window_started(self) -> None:
        """A micro-batch begins: the first of an optimizer step starts the step's clock."""
        if self._window_t0 is None:
            self._window_t0 = time.perf_counter()

    def before_step(self, params: Iterable[nn.Parameter], lr: float,
                    scaler: torch.amp.GradScaler | None, *, norm_later: bool = False) -> None:
        """The unscaled gradients, before the trainer clips them: pre-clip norm, finiteness,
        the loss scale of this step's backward (and the fp16 underflow share when sampled).

        Args:
            params: the optimizer's parameters.
            lr: the step's learning rate.
            scaler: the trainer's GradScaler, or None.
            norm_later: the trainer's own clip will take the pre-clip norm and ``took_norm``
                hands it in: no norm is taken here (the scale and the sampled underflow share
                are, on the same unclipped gradients).
        """
        step = self.meter.begin()
        self._scaler = scaler
        params = list(params)
        sample = self.meter.samples_underflow(step)
        if not norm_later:
            m = measure(params, MEASURE_ONLY, scaler, model=self.model, sample_underflow=sample)
            self._pending = _Pending(step=step, lr=float(lr), m=m, params=params)
            return
        scaling = scaler is not None and scaler.is_enabled()
        underflow = math.nan
        if scaling and sample:
            underflow = fp16_underflow_fraction([p.grad for p in params if p.grad is not None])
        self._pending = _Pending(step=step, lr=float(lr), m=None, params=params,
                                 scale=scaler.get_scale() if scaling else 1.0, underflow=underflow)

    @property
    def awaits_norm(self) -> bool:
        """Whether ``before_step(norm_later=True)`` waits for ``took_norm``."""
        return self._pending is not None and self._pending.m is None

    def took_norm(self, pre: torch.Tensor) -> None:
        """The pre-clip global norm the trainer's clip took (``torch.nn.utils.get_total_norm``
        of the unscaled gradients ``before_step`` saw, before it scales them): the step's
        measurement, as ``measure`` would have made it, from one host read; on a non-finite
        norm the first non-finite parameter is named from the still unclipped gradients."""
        assert self._pending is not None and self._pending.m is None, "took_norm twice"
        p = self._pending
        pre_f = float(pre)
        finite = math.isfinite(pre_f)
        name = ""
        if not finite:  # the skip path only: per-tensor norms say which gradient went bad
            with_grad = [q for q in p.params if q.grad is not None]
            per_tensor = grad_norms([q.grad for q in with_grad])[0]
            name = _first_non_finite(self.model, with_grad, per_tensor)
        p.m = Measurement(grad_l2_pre_clip=pre_f, grad_l2_post_clip=pre_f, loss=math.nan,
                          finite=finite, clipped=False, scaler_scale=p.scale,
                          underflow_frac=p.underflow if finite else math.nan, nonfinite_param=name)

    @property
    def stepping(self) -> bool:
        """Whether ``before_step`` ran and ``finish_step`` has not yet."""
        return self._pending is not None

    @property
    def derives_post_clip(self) -> bool:
        """Whether the post-clip norm is arithmetic on the pre-clip one (clipping off, or the
        standard norm clip): then ``finish_step`` takes it, and no earlier call needs to."""
        c = self.clip
        return not c.enabled or (c.method == "norm" and self.derive_norm_clip)

    def post_clip_norm(self) -> float:
        """The global norm of the gradients as the trainer clipped them (call after its clip,
        between ``before_step`` and ``finish_step``; of the parameters ``before_step``
        measured: the same optimizer step)."""
        assert self._pending is not None, "post_clip_norm without before_step"
        self._ensure_measured()
        assert self._pending.m is not None
        return self._post_clip_norm(self._pending.m, self._pending.params)

    def _ensure_measured(self) -> None:
        # A deferred norm that never came (the trainer skipped its clip call): measured now,
        # on the gradients as they are, rather than leaving the step unrecorded.
        if self._pending is not None and self._pending.m is None:
            self.took_norm(grad_global_norm([q.grad for q in self._pending.params
                                             if q.grad is not None]))

    def _post_clip_norm(self, m: Measurement, params: list[nn.Parameter]) -> float:
        # A standard norm clip (torch.nn.utils.clip_grad_norm_, which both trainers call)
        # scales every gradient by coef = max_norm / (norm + 1e-6) clamped to 1: the post-clip
        # norm is pre * coef, derived as our own loop derives it (clipping.clip_by_norm_), not
        # taken again (a second norm pass cost ~3% of a small model's step). A clip the
        # recorder cannot know (value clipping, a user's own clipping hook) is measured.
        c = self.clip
        if not c.enabled:
            return m.grad_l2_pre_clip
        if c.method == "norm" and self.derive_norm_clip:
            return m.grad_l2_pre_clip * min(1.0, c.max_norm / (m.grad_l2_pre_clip + CLIP_EPS))
        grads = [q.grad for q in params if q.grad is not None]
        return float(grad_global_norm(grads)) if grads else 0.0

    def finish_step(self, *, loss: float, skipped: bool, micro_batches: int, samples: int,
                    post: float | None = None) -> StepLog:
        """The trainer stepped (or skipped): the post-clip norm, the step's ``StepLog``.

        Call while ``.grad`` still holds this step's gradients: the per-layer table reads
        them here. ``emit`` hands the record to the other sinks (once the trainer has had its
        chance to advance its LR scheduler).

        Args:
            loss: the step's loss (the mean over its micro-batches, as the trainer defines it).
            skipped: the trainer did not apply the update (the GradScaler found inf/nan).
            micro_batches: micro-batches accumulated into the step.
            samples: samples in them.
            post: the post-clip global norm when measured earlier (None: now, from the
                parameters ``before_step`` measured).
        """
        assert self._pending is not None, "finish_step without before_step"
        self._ensure_measured()
        p, self._pending = self._pending, None
        m = p.m
        assert m is not None
        if not m.finite or skipped:
            post = m.grad_l2_pre_clip
        elif post is None:
            post = self._post_clip_norm(p.m, p.params)
        reason = SkipReason.NONE
        if skipped:
            reason = (SkipReason.NONFINITE_LOSS if not math.isfinite(loss)
                      else SkipReason.NONFINITE_GRAD)
        clipped = (self.clip.enabled and m.finite and not skipped
                   and post < m.grad_l2_pre_clip)
        log = self.meter.log(step=p.step, lr=p.lr, skip=reason, micro_batches=micro_batches,
                             samples=samples, measured=m, loss=loss, grad_l2_post_clip=post,
                             clipped=clipped)
        if self.layers is not None:
            self.layers.on_step(log)
        self._finished = log
        return log

    def emit(self, *, scheduler_stepped: bool, epoch: int) -> TrainerStepLog:
        """The finished step's record, with ``scheduler_stepped``, to every other sink.

        Args:
            scheduler_stepped: the trainer advanced an LR scheduler during this step.
            epoch: the 1-based epoch.
        """
        assert self._finished is not None, "emit without finish_step"
        log = _with_scheduler_stepped(self._finished, int(scheduler_stepped))
        self._finished = None
        self.scheduler_steps_on_skip += int(log.skipped and scheduler_stepped)
        if self._window_t0 is not None:
            self.cost.on_step(time.perf_counter() - self._window_t0)
            self._window_t0 = None
        for sink in self.sinks:
            sink.on_step(log, epoch)
        return log

    @property
    def epochs(self) -> list[EpochLog]:
        """The epochs' records so far."""
        return self.run.epochs

    @property
    def best_val_loss(self) -> float:
        """The best validation loss so far (inf before the first epoch)."""
        return self.run.best[0]

    @property
    def best_epoch(self) -> int:
        """Its epoch (0 before the first)."""
        return self.run.best[1]

    def end_epoch(self, epoch: int, val_loss: float, val_acc: float,
                  seconds: float) -> EpochLog:
        """The epoch's record (after validation) to every sink; the best epoch so far."""
        return self.run.epoch(epoch, val_loss, val_acc, seconds)

    def state_dict(self) -> dict[str, Any]:
        """The counters, the best epoch and every sink's state (plain containers), for the
        trainer's checkpoint: ``load_state_dict`` continues the files from there."""
        return {"meter": self.meter.state_dict(), **self.run.state_dict(),
                "scheduler_steps_on_skip": self.scheduler_steps_on_skip}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict``: ``steps.csv`` (and ``layer_norms.csv``) are cut back to
        the checkpoint's step and continued."""
        self.meter.load_state_dict(state["meter"])
        self.run.load_state_dict(state)
        self.scheduler_steps_on_skip = int(state["scheduler_steps_on_skip"])

    def close(self) -> None:
        """Close ``steps.csv`` and write the per-layer rows still held (idempotent)."""
        self.run.close()

    def summary(self) -> dict[str, Any]:
        """The run's summary (``TrackedRun.finish``): our loop's (``RunAssembly.finish``: one
        gradient sync per optimizer step in one process), plus ``scheduler_steps_on_skip``."""
        steps = self.meter.step_count
        return self.run.summary(self._scaler, self.effective_batch, steps, steps) | {
            SCHEDULER_STEPS_ON_SKIP: self.scheduler_steps_on_skip}
