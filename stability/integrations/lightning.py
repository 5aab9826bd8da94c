"""``StabilityCallback`` for PyTorch Lightning: our per-step telemetry, the user's training.

Lightning 2.6's order for one optimizer step (automatic optimization; line numbers of 2.6.6
in docs/integrations.md)::

    per micro-batch: training_step -> loss / accumulate_grad_batches -> scaler.scale -> backward
                     -> on_train_batch_end (no step yet while accumulating)
    last micro-batch: closure (as above) -> scaler.unscale_ (fp16)
                     -> on_before_optimizer_step      <- before_step: scale, lr (and the
                                                         pre-clip norm unless Lightning's
                                                         norm clip takes it)
                     -> clip (gradient_clip_val): get_total_norm <- _took_norm, then the
                        clip with that norm -> scaler.step -> scaler.update
                     -> lr scheduler step (interval "step"; also on a skipped fp16 step)
                     -> on_train_batch_end            <- finish_step, emit: post-clip norm,
                                                         skip, loss, scheduler stepped?
    epoch end:       validation -> on_train_epoch_end <- end_epoch: val_loss/val_acc

The callback never changes training: it measures with clipping off (Lightning clips); with
Lightning's standard norm clip it runs that clip's two torch calls itself (on this trainer's
precision plugin, for the fit) so that one norm serves the clip and the record. The
post-clip norm of Lightning's standard norm clip is derived from the pre-clip one as our loop
derives its own (``step_recorder``); a module overriding ``configure_gradient_clipping``, or value
clipping, gets it measured on the gradients Lightning left (``zero_grad`` runs at the next
step's first closure).
A step counts as skipped when the GradScaler skipped it (its scale dropped across the step, or
the unscaled norm is non-finite, which is the same event). Without a scaler (32-true,
bf16-mixed) Lightning applies even a non-finite update: the row then has ``skipped=0`` and a
non-finite ``grad_l2_pre_clip`` (``nonfinite_param`` names the parameter).

Usage::

    cb = StabilityCallback("runs/my_run", per_layer=True)
    Trainer(callbacks=[cb], gradient_clip_val=1.0, accumulate_grad_batches=2).fit(module, dm)

With ``sinks=[tracked.sink]`` of a ``stability.tracking.run.TrackedRun`` the run also goes to
MLflow (``tracked.finish(cb.summary(), "finished")``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from stability.core.config import ClipConfig, PrecisionConfig
from stability.core.precision import Precision
from stability.core.sinks import StepSink
from stability.integrations.trainer_callback import (
    RecordingCallback,
    batch_samples,
    optimizer_params,
    schedule_params,
)


def clip_of(trainer: pl.Trainer) -> ClipConfig:
    """The ``ClipConfig`` equivalent to the trainer's ``gradient_clip_val``/``_algorithm``."""
    value = trainer.gradient_clip_val
    if not value:
        return ClipConfig(enabled=False)
    if str(trainer.gradient_clip_algorithm or "norm") == "value":
        return ClipConfig(enabled=True, method="value", clip_value=float(value))
    return ClipConfig(enabled=True, method="norm", max_norm=float(value))


def trainer_settings(clip: ClipConfig, precision: PrecisionConfig, accum_steps: int,
                     device: str) -> dict[str, Any]:
    """A study point's settings as ``lightning.pytorch.Trainer`` keyword arguments.

    fp16 comes as a ``MixedPrecision`` plugin with our GradScaler settings: Lightning 2.6
    turns ``precision="16-mixed"`` on CPU into bf16-mixed (its accelerator connector does),
    while the plugin trains fp16 with loss scaling there as our loop does.

    Args:
        clip: the clip setting (``gradient_clip_val`` / ``gradient_clip_algorithm``).
        precision: the precision section (``fp32`` | ``bf16`` | ``fp16``).
        accum_steps: ``accumulate_grad_batches``.
        device: ``cpu`` or ``cuda``.
    """
    from lightning.pytorch.plugins import MixedPrecision

    settings: dict[str, Any] = {"accumulate_grad_batches": accum_steps,
                                "accelerator": "gpu" if device == "cuda" else "cpu"}
    if clip.enabled:
        settings["gradient_clip_val"] = clip.max_norm if clip.method == "norm" else clip.clip_value
        settings["gradient_clip_algorithm"] = clip.method
    name = Precision(precision.name)
    if name is Precision.FP16:
        scaler = torch.amp.GradScaler(device, init_scale=precision.init_scale,
                                      growth_interval=precision.growth_interval)
        settings["plugins"] = [MixedPrecision("16-mixed", device, scaler=scaler)]
    else:
        settings["precision"] = "bf16-mixed" if name is Precision.BF16 else "32-true"
    return settings


def scheduler_position(trainer: pl.Trainer) -> int:
    """How many times the trainer's LR schedulers have stepped, all together."""
    return sum(int(getattr(c.scheduler, "last_epoch", 0)) for c in trainer.lr_scheduler_configs)


class StabilityCallback(RecordingCallback, pl.Callback):
    """Records ``steps.csv`` (+ ``layer_norms.csv``) of a Lightning fit, per optimizer step.

    Arguments as ``trainer_callback.RecordingCallback``'s; ``val_loss_key`` / ``val_acc_key`` name
    metrics the module logs (``self.log(...)``).
    """

    def __init__(self, folder: str | Path, *, per_layer: bool = False,
                 sinks: Sequence[StepSink] = (), val_loss_key: str = "val_loss",
                 val_acc_key: str = "val_acc", underflow_every: int = 25) -> None:
        RecordingCallback.__init__(self, folder, per_layer=per_layer, sinks=sinks,
                                   val_loss_key=val_loss_key, val_acc_key=val_acc_key,
                                   underflow_every=underflow_every)
        self._scaler: torch.amp.GradScaler | None = None
        self._scale_before = 1.0
        # The losses of the window's micro-batches, unread: one host read per step, not one
        # per micro-batch (a device sync each on CUDA).
        self._losses: list[torch.Tensor | None] = []
        self._restored: dict[str, Any] | None = None  # from the trainer's checkpoint
        self._norm_later = False  # the trainer's norm clip hands its norm in (on_fit_start)
        self._plugin: Any = None  # the precision plugin whose clip is wrapped
        self._schedulers: list[Any] = []  # the fit's LR schedulers (on_train_start)

    # -- lifecycle ---------------------------------------------------------------------------
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Build the recorder from the trainer's clip setting."""
        # A module overriding configure_gradient_clipping clips its own way: measure the
        # post-clip norm instead of deriving it.
        standard = (type(pl_module).configure_gradient_clipping
                    is pl.LightningModule.configure_gradient_clipping)
        clip = clip_of(trainer)
        self.start_recorder(clip, pl_module, derive_norm_clip=standard)
        # the plugin (and its scaler) is the fit's: read once, not through the trainer each step
        self._scaler = getattr(trainer.precision_plugin, "scaler", None)
        self._losses = []
        # Lightning's standard norm clip takes the pre-clip norm anyway: take it there once,
        # for the clip and for the record (``_share_the_clip_norm``).
        self._norm_later = (standard and pl_module.automatic_optimization and clip.enabled
                            and clip.method == "norm")
        if self._norm_later:
            self._share_the_clip_norm(trainer.precision_plugin)
        # Lightning restores callbacks before on_fit_start
        if self._restored and self.recorder is not None:
            self.recorder.load_state_dict(self._restored)

    def _share_the_clip_norm(self, plugin: Any) -> None:
        """Wrap this trainer's precision plugin's ``clip_grad_by_norm`` (its instance only):
        ``torch.nn.utils.clip_grad_norm_(main_params, clip_val)`` as torch composes it
        (``get_total_norm``, then ``clip_grads_with_norm_`` with that norm), handing the norm
        to ``_took_norm`` between the two, while the gradients are still unclipped."""
        clip_by_norm = plugin.clip_grad_by_norm
        self._plugin = plugin

        def clip_grad_by_norm(optimizer: torch.optim.Optimizer, clip_val: float) -> None:
            if self.recorder is None or not self.recorder.awaits_norm:
                return clip_by_norm(optimizer, clip_val)
            params = list(plugin.main_params(optimizer))
            total = torch.nn.utils.get_total_norm([p.grad for p in params
                                                   if p.grad is not None], 2.0)
            self._took_norm(total)
            torch.nn.utils.clip_grads_with_norm_(params, clip_val, total)
            return None

        plugin.clip_grad_by_norm = clip_grad_by_norm

    def _unshare(self) -> None:
        """The plugin as it was (the fit is over: nothing of the callback stays in it)."""
        if self._plugin is not None:
            vars(self._plugin).pop("clip_grad_by_norm", None)
            self._plugin = None

    def _took_norm(self, total: torch.Tensor) -> None:
        """The clip's pre-clip norm to the recorder (one host read)."""
        assert self.recorder is not None
        self.recorder.took_norm(total)

    def state_dict(self) -> dict[str, Any]:
        """Saved in Lightning's checkpoint: a fit resumed from it continues the records."""
        return self.recorder.state_dict() if self.recorder is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Kept until ``on_fit_start`` builds the recorder."""
        self._restored = dict(state_dict)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Close the files."""
        self._unshare()
        if self.recorder is not None:
            self.recorder.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        """Keep what was recorded (the CSV is complete up to the last step)."""
        self._unshare()
        if self.recorder is not None:
            self.recorder.close()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The loaders and optimizers exist: the effective batch (the loader's batch x
        accumulation) and what the trainer built as the run's params (``ran_params``)."""
        self._schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
        if self.recorder is not None:
            self.recorder.set_batch(loader_batch_size(trainer.train_dataloader),
                                    trainer.accumulate_grad_batches)
            self.recorder.log_params(ran_params(trainer))

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        """The step's clock starts at its first micro-batch (the batch already fetched)."""
        if self.recorder is not None:
            self.recorder.window_started()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Time the epoch."""
        self._epoch_t0 = time.perf_counter()

    # -- one optimizer step ------------------------------------------------------------------
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        """Unscaled, not yet clipped gradients: the pre-clip norm, the scale, the lr."""
        assert self.recorder is not None
        scaler = self._scaler
        self.recorder.before_step(_params(optimizer), optimizer.param_groups[0]["lr"], scaler,
                                  norm_later=self._norm_later)
        self._sched_before = self._scheduler_position()
        self._scale_before = scaler.get_scale() if scaler is not None else 1.0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        """Add the micro-batch's loss; after a step, its record (the scheduler has stepped)."""
        assert self.recorder is not None
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        # Automatic optimization hands over a detached copy already (ClosureResult.loss)
        self._losses.append((loss.detach() if loss.requires_grad else loss)
                            if isinstance(loss, torch.Tensor) else None)
        self._samples += batch_samples(batch)
        if not self.recorder.stepping:
            return
        scaler = self._scaler
        skipped = scaler is not None and scaler.get_scale() < self._scale_before
        total, micro = self._take_losses(trainer.accumulate_grad_batches)
        samples, self._samples = self._samples, 0
        # the measured params are before_step's (the same optimizer step)
        self.recorder.finish_step(loss=total / micro,
                                  skipped=skipped, micro_batches=micro, samples=samples)
        self.recorder.emit(scheduler_stepped=self._scheduler_position() > self._sched_before,
                           epoch=trainer.current_epoch + 1)

    def _scheduler_position(self) -> int:
        """``scheduler_position`` of the schedulers the fit started with (Lightning builds
        them once, before ``on_train_start``: read there, not through the trainer each step)."""
        return sum(int(getattr(s, "last_epoch", 0)) for s in self._schedulers)

    def _take_losses(self, accum: int) -> tuple[float, int]:
        """The window's summed loss (each micro-batch's times ``accumulate_grad_batches``:
        Lightning divided it, the record holds the mean) and its micro-batches, read from the
        device at once; the next window starts empty."""
        losses, self._losses = self._losses, []
        if len(losses) == 1 and losses[0] is not None:
            # no accumulation: one read, no stack; 0.0 + as the sum below forms it (bit for bit)
            return 0.0 + float(losses[0]) * accum, 1
        tensors = [t for t in losses if t is not None]
        if len(tensors) == 1:
            values = iter([float(tensors[0])])
        else:
            values = iter(torch.stack(tensors).tolist() if tensors else [])
        total = 0.0  # summed in the order, and with the arithmetic, of one read per batch
        for t in losses:
            total = total + (next(values) * accum if t is not None else 0.0)
        return total, len(losses)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After validation: the epoch's record with the logged validation metrics."""
        assert self.recorder is not None
        metrics = trainer.callback_metrics
        self.recorder.end_epoch(trainer.current_epoch + 1, _metric(metrics, self.val_loss_key),
                                _metric(metrics, self.val_acc_key),
                                time.perf_counter() - self._epoch_t0)



def ran_params(trainer: pl.Trainer) -> dict[str, str]:
    """What the fit trains with, as params: its (first) optimizer's class and hyperparameters,
    its LR scheduler's class and interval, the loader's batch size and the precision plugin."""
    configs = trainer.lr_scheduler_configs
    plugin = trainer.precision_plugin
    params = (optimizer_params(trainer.optimizers[0]) if trainer.optimizers else {})
    params |= schedule_params(configs[0].scheduler if configs else None)
    if configs:
        params["schedule.interval"] = str(configs[0].interval)
    params["train.batch_size"] = str(loader_batch_size(trainer.train_dataloader))
    params["precision.plugin"] = f"{type(plugin).__name__}({plugin.precision})"
    return params


def loader_batch_size(loader: Any) -> int | None:
    """A training loader's batch size (its ``batch_sampler``'s when it has one), None when it
    does not say."""
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return int(size) if isinstance(size, int) else None


def _params(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for g in optimizer.param_groups for p in g["params"]]


def _metric(metrics: dict[str, Any], key: str) -> float:
    value = metrics.get(key)
    return float(value) if value is not None else math.nan
