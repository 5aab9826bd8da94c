"""``StabilityCallback`` for the Hugging Face Trainer: our telemetry on every optimizer step.

transformers 5.24's order for one optimizer step (``Trainer._inner_training_loop``; line
numbers in docs/integrations.md)::

    per micro-batch: on_step_begin (first only) -> training_step (loss / window length,
                     backward through accelerator.backward: scaled under fp16)
                     -> on_substep_end (all but the last)
    last micro-batch: accelerator.clip_grad_norm_(params, max_grad_norm or inf)
                        = unscale_gradients()      <- before_step: scale, lr
                          + _clip_grad_norm_dtensor_aware: get_total_norm <- _took_norm
                            (the record's pre-clip norm, read before the clip), clip,
                            returns the pre-clip norm (HF's ``grad_norm``)
                     -> on_pre_optimizer_step      (the post-clip norm, were it measured:
                                                    the standard norm clip's is derived)
                     -> optimizer.step()  (AcceleratedOptimizer: skipped on inf/nan in fp16)
                     -> on_optimizer_step          <- finish_step: skip, loss, the post-clip
                                                    norm (derived), per-layer norms
                     -> lr_scheduler.step() unless accelerator.optimizer_step_was_skipped
                     -> model.zero_grad() -> on_step_end   <- emit: scheduler stepped?
    epoch end:       on_epoch_end -> evaluate -> on_evaluate  <- end_epoch: eval_loss

No hook runs between the last backward and the clip, and the callbacks get neither the
accelerator nor ``grad_norm``: ``attach(trainer)`` adds the callback and wraps three bound
methods on that trainer's instances (nothing global is patched): ``accelerator.unscale_gradients``
(right after it: the unscaled, not yet clipped gradients), the accelerator's
``_clip_grad_norm_dtensor_aware`` (run as accelerate composes it, its norm handed to the
record before the clip: the gradients are normed once a step) and ``training_step`` (each
micro-batch's loss as the Trainer computed it, and its samples). FSDP, DeepSpeed and XLA clip
by other paths: not supported.

Usage::

    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val)
    cb = StabilityCallback("runs/my_run", per_layer=True).attach(trainer)
    trainer.train()
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from stability.compat.transformers import wrap_clip_norm, wrap_measuring_points
from stability.core.clipping import grad_global_norm
from stability.core.config import ClipConfig, PrecisionConfig
from stability.core.precision import Precision
from stability.core.sinks import StepSink
from stability.core.validation import ConfigError
from stability.integrations.trainer_callback import (
    RecordingCallback,
    optimizer_params,
    schedule_params,
)


def clip_of(trainer: Trainer) -> ClipConfig:
    """The ``ClipConfig`` equivalent to the trainer's ``max_grad_norm`` (0: clipping off)."""
    value = trainer.args.max_grad_norm
    if value is None or value <= 0:
        return ClipConfig(enabled=False)
    return ClipConfig(enabled=True, method="norm", max_norm=float(value))


def training_arguments(clip: ClipConfig, precision: PrecisionConfig, accum_steps: int,
                       device: str) -> dict[str, Any]:
    """A study point's settings as ``TrainingArguments`` keyword arguments.

    Args:
        clip: the clip setting (``max_grad_norm``; 0 turns clipping off).
        precision: the precision section (``fp32`` | ``bf16`` | ``fp16``).
        accum_steps: ``gradient_accumulation_steps``.
        device: ``cpu`` or ``cuda``.

    Raises:
        ConfigError: a setting the Trainer cannot honour: value clipping (it clips by norm
            only) and fp16 on CPU (accelerate 1.15 then trains in fp32 without autocast or
            loss scaling, and says nothing).
    """
    if clip.enabled and clip.method != "norm":
        raise ConfigError(f"clip.method={clip.method!r} is invalid for the HF Trainer: it clips "
                          "by norm only (allowed values: norm)")
    name = Precision(precision.name)
    if name is Precision.FP16 and device == "cpu":
        raise ConfigError("precision=fp16 is invalid for the HF Trainer on cpu: accelerate "
                          "trains it in fp32 without loss scaling (allowed values here: "
                          "fp32 | bf16)")
    return {"max_grad_norm": clip.max_norm if clip.enabled else 0.0,
            "gradient_accumulation_steps": accum_steps, "fp16": name is Precision.FP16,
            "bf16": name is Precision.BF16, "use_cpu": device == "cpu"}


def ran_params(trainer: Trainer, max_steps: int) -> dict[str, str]:
    """What the train trains with, as params: the optimizer's class and hyperparameters, the
    LR scheduler's class, name and warmup, the batch size and accelerate's mixed precision."""
    args = trainer.args
    kind = args.lr_scheduler_type
    return (optimizer_params(trainer.optimizer) | schedule_params(trainer.lr_scheduler) | {
        "schedule.name": str(getattr(kind, "value", kind)),
        "schedule.warmup_steps": str(args.get_warmup_steps(max_steps)),
        "train.batch_size": str(args.train_batch_size),
        "precision.plugin": f"accelerate({trainer.accelerator.mixed_precision})"})


STATE_NAME = "stability_callback.pt"  # the recorder's state in each Trainer checkpoint


def checkpoint_folder(args: Any, state: Any) -> Path:
    """The Trainer's checkpoint of ``state.global_step`` (``<output_dir>/checkpoint-<step>``,
    the Trainer's own naming, ``PREFIX_CHECKPOINT_DIR``)."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    return Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"


def load_state(path: Path) -> dict[str, Any]:
    """The recorder's state saved beside a Trainer checkpoint, loaded as data only.

    ``weights_only=True``: tensors, numbers, strings and plain containers, never a pickled
    object (a checkpoint folder may come from someone else; unpickling runs their code).

    Raises:
        ValueError: one line, when the file is anything else (the Trainer has restored its
            own state by now, so continuing without ours would corrupt ``steps.csv``).
    """
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # UnpicklingError (a pickled object), a torn or foreign file
        # torch's own message invites loading it unsafely: name the failure only
        raise ValueError(f"refusing {path}: not plain data (torch.load with "
                         f"weights_only=True failed: {type(err).__name__})") from None
    if not isinstance(state, dict):
        raise ValueError(f"refusing {path}: not plain data (a {type(state).__name__}, "
                         "not the recorder's state)")
    return state


def _detached_float(loss: torch.Tensor) -> torch.Tensor:
    """``loss.detach().float()``, without the two calls when the Trainer's ``training_step``
    returned it detached and in float32 already (its usual return): the same tensor values."""
    if loss.requires_grad or loss.dtype != torch.float32:
        return loss.detach().float()
    return loss


def scheduler_position(trainer: Trainer) -> int:
    """How many times the trainer's LR scheduler has stepped (0 before it exists)."""
    return int(getattr(trainer.lr_scheduler, "last_epoch", 0) or 0)


class StabilityCallback(RecordingCallback, TrainerCallback):
    """Records ``steps.csv`` (+ ``layer_norms.csv``) of a ``Trainer.train``, every step.

    Arguments as ``trainer_callback.RecordingCallback``'s; ``val_loss_key`` / ``val_acc_key`` name
    evaluation metrics (``eval_loss``, ``eval_accuracy``).
    """

    def __init__(self, folder: str | Path, *, per_layer: bool = False,
                 sinks: Sequence[StepSink] = (), val_loss_key: str = "eval_loss",
                 val_acc_key: str = "eval_accuracy", underflow_every: int = 25) -> None:
        RecordingCallback.__init__(self, folder, per_layer=per_layer, sinks=sinks,
                                   val_loss_key=val_loss_key, val_acc_key=val_acc_key,
                                   underflow_every=underflow_every)
        self.trainer: Trainer | None = None
        self._post: float | None = None
        self._epoch = 0
        self._norm_later = False  # the clip's norm is handed in (wrap_clip_norm wrapped it)
        self._measure_post = False  # the post-clip norm is measured, not derived (on_train_begin)

    def attach(self, trainer: Trainer) -> StabilityCallback:
        """Add this callback to ``trainer`` and wrap its two measuring points (see module).

        Returns:
            self, so that ``cb = StabilityCallback(folder).attach(trainer)`` reads in one line.

        Raises:
            RuntimeError: already attached to a trainer.
        """
        if self.trainer is not None:
            raise RuntimeError("this StabilityCallback is attached already: one per trainer")
        self.trainer = trainer
        trainer.add_callback(self)
        # Summed on the device: the step's one host read is in finish_step.
        wrap_measuring_points(trainer, self._before_clip, lambda loss, inputs:
                              self.add_micro_batch(_detached_float(loss), inputs))
        self._norm_later = wrap_clip_norm(trainer, self._shared_clip_norm)
        return self

    def _shared_clip_norm(self, clip: Any) -> Any:
        """``accelerator._clip_grad_norm_dtensor_aware`` (what ``clip_grad_norm_`` calls right
        after ``unscale_gradients``) composed
        as accelerate composes it for plain tensors (``get_total_norm``, its one-element
        ``vector_norm``, ``clip_grads_with_norm_`` unless the threshold is inf), handing the
        norm to ``_took_norm`` before the clip: the Trainer's norm is the record's, taken
        once. Anything else (DTensor gradients, another norm type) goes to accelerate's."""

        def clip_norm(parameters: Any, max_norm: float, norm_type: float = 2,
                      foreach: bool | None = None) -> torch.Tensor:
            params = [p for p in parameters if p.grad is not None]
            if self.recorder is None or not self.recorder.awaits_norm:
                return clip(params, max_norm, norm_type=norm_type, foreach=foreach)
            if (norm_type != 2 or not params
                    or any(type(p.grad) is not torch.Tensor for p in params)):
                # not the plain-tensor path: the record's own norm, before accelerate clips
                self._took_norm(grad_global_norm([p.grad for p in params]))
                return clip(params, max_norm, norm_type=norm_type, foreach=foreach)
            inner = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type,
                                                  foreach=foreach)
            self._took_norm(inner)
            total = torch.linalg.vector_norm(torch.stack([inner]), norm_type)
            if max_norm != float("inf"):
                torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach)
            return total

        return clip_norm

    def _took_norm(self, total: torch.Tensor) -> None:
        """The clip's pre-clip norm to the recorder (one host read)."""
        assert self.recorder is not None
        self.recorder.took_norm(total)

    def _params(self) -> list[torch.nn.Parameter]:
        assert self.trainer is not None
        return [p for g in self.trainer.optimizer.param_groups for p in g["params"]]

    def _before_clip(self) -> None:
        """Inside ``clip_grad_norm_``, after unscaling: the pre-clip measurement."""
        if self.recorder is None or self.recorder.stepping or self.trainer is None:
            return  # not training, or a second unscale call within one step
        opt = self.trainer.optimizer
        self.recorder.before_step(self._params(), opt.param_groups[0]["lr"],
                                  self.trainer.accelerator.scaler,
                                  norm_later=self._norm_later)
        self._sched_before = scheduler_position(self.trainer)

    # -- TrainerCallback events --------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Build the recorder (the model's names, the trainer's clip setting)."""
        if self.trainer is None:
            raise RuntimeError("StabilityCallback needs the trainer: "
                               "use StabilityCallback(folder).attach(trainer)")
        recorder = self.start_recorder(clip_of(self.trainer), kwargs["model"])
        self._measure_post = not recorder.derives_post_clip
        recorder.set_batch(args.train_batch_size, args.gradient_accumulation_steps)
        recorder.log_params(ran_params(self.trainer, state.max_steps))
        if state.global_step > 0:  # resumed from a checkpoint: continue its records
            saved = checkpoint_folder(args, state) / STATE_NAME
            if saved.exists():
                recorder.load_state_dict(load_state(saved))
            # Whole epochs done; on_epoch_begin counts the one the Trainer resumes in.
            self._epoch = math.floor(float(state.epoch or 0) + 1e-6)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The Trainer saved a checkpoint: the recorder's state beside it (``STATE_NAME``),
        so that ``train(resume_from_checkpoint=...)`` cuts the files back and continues."""
        folder = checkpoint_folder(args, state)
        if self.recorder is not None and folder.is_dir():
            torch.save(self.recorder.state_dict(), folder / STATE_NAME)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Count and time the epoch."""
        self._epoch += 1
        self._epoch_t0 = time.perf_counter()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The step's first micro-batch: its clock starts (the batch already fetched)."""
        if self.recorder is not None:
            self.recorder.window_started()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The gradients are clipped: the post-clip norm (``StepRecorder.post_clip_norm``, of
        the parameters ``_before_clip`` measured: the same optimizer step) when it is measured;
        a derived one (the standard norm clip) is arithmetic that ``finish_step`` does."""
        if self._measure_post and self.recorder is not None and self.recorder.stepping:
            self._post = self.recorder.post_clip_norm()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Stepped or skipped; the gradients are still there (per-layer norms)."""
        if self.recorder is None or not self.recorder.stepping:
            return
        assert self.trainer is not None
        skipped = bool(self.trainer.accelerator.optimizer_step_was_skipped)
        total, micro, samples = self.take_window()
        self.recorder.finish_step(loss=float(total) if micro else math.nan,
                                  skipped=skipped, micro_batches=micro, samples=samples,
                                  post=self._post)
        self._post = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After the scheduler's turn: the step's record to every sink."""
        if self.recorder is None or self.trainer is None:
            return
        self.recorder.emit(
            scheduler_stepped=scheduler_position(self.trainer) > self._sched_before,
            epoch=self._epoch)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Without per-epoch evaluation, the epoch's record now (no validation metrics)."""
        if self.recorder is not None and args.eval_strategy != "epoch":
            self.recorder.end_epoch(self._epoch, math.nan, math.nan,
                                    time.perf_counter() - self._epoch_t0)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float],
                    **kwargs: Any) -> None:
        """Per-epoch evaluation: the epoch's record with its validation metrics."""
        if self.recorder is not None and args.eval_strategy == "epoch":
            self.recorder.end_epoch(self._epoch, float(metrics.get(self.val_loss_key, math.nan)),
                                    float(metrics.get(self.val_acc_key, math.nan)),
                                    time.perf_counter() - self._epoch_t0)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close the files."""
        if self.recorder is not None:
            self.recorder.close()

