"""``TrainStep``: one optimizer step over a window of micro-batches, readable top to bottom.

The order is the one AMP requires and every test pins:

    per micro-batch:  autocast forward -> scaler.scale(loss / n).backward()
    after the window: scaler.unscale_(opt) -> norms, clip, one host read of
                      [norms, every micro-batch loss, scale] -> skip or opt.step()
    always:           scaler.update()  (skipped or not; a no-op unless fp16)

The norms, the clip and the one host read are ``core.measure.measure``, which any other loop
can call the same way; ``StepMeter`` owns the step index and the cumulative skip count. That
read is the step's only one (a device sync on CUDA): the host must know the skip before the
optimizer and the scheduler step; everything logged rides along. The losses stay on the
device until then, so a window with a non-finite loss runs all its backwards before it is
skipped (gradients discarded; parameters, optimizer state, schedule untouched; fp16 backs off
once). The optimizer is stepped directly: ``scaler.step`` would read ``found_inf`` again.

The step never logs: it returns a ``StepLog``. Data-parallel training changes only the
forward/backward phase (every rank takes the same skip): ``_backward_distributed``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from stability.compat.torch import restart_growth_streak
from stability.core.config import ClipConfig, PrecisionConfig, RunConfig
from stability.core.measure import StepMeter, measure, unmeasured
from stability.core.precision import autocast, make_scaler
from stability.core.steplog import SkipReason, StepLog

MicroBatch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class StepHook(Protocol):
    """Something the run loop installs into the step, e.g. fault injection (``core.faults``)."""

    def on_micro_batch(self, step: int, x: torch.Tensor,
                       y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the micro-batch to train on (called before each forward)."""
        ...

    def on_gradients(self, step: int, params: Sequence[nn.Parameter]) -> None:
        """Called once per window after the last backward, before ``unscale_``."""
        ...


@dataclass(frozen=True)
class _Forward:
    """What the forward/backward phase of one window produced."""

    ok: bool  # every micro-batch loss was finite (on every rank): the gradients exist
    loss: torch.Tensor | float  # mean over the window; a float when it was agreed over ranks
    samples: int  # samples in the window (over all ranks once they agreed)
    # each micro-batch's loss, unread (local path: ``measure`` decides on them)
    losses: torch.Tensor | None = None


def _is_ddp(model: nn.Module) -> bool:
    return isinstance(model, nn.parallel.DistributedDataParallel)


class TrainStep:
    """Owns the autocast context and the GradScaler; ``step(window)`` is one optimizer step.

    Args:
        model: the module (optionally wrapped in ``DistributedDataParallel``).
        optimizer: its optimizer.
        loss_fn: ``loss_fn(output, targets) -> scalar`` (mean over the micro-batch).
        precision: the validated precision section (fp16 alone enables the GradScaler).
        clip: the validated clipping section.
        accum_steps: the most micro-batches a window may hold.
        device: ``cpu`` or ``cuda`` (concrete, not ``auto``).
        underflow_every: sample the fp16 underflow share every N optimizer steps.
        scheduler: optional LR scheduler, advanced only on steps actually taken.
        hooks: installed by the run loop (fault injection); none in normal training.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        *,
        precision: PrecisionConfig,
        clip: ClipConfig,
        accum_steps: int = 1,
        device: str = "cpu",
        underflow_every: int = 25,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        hooks: Sequence[StepHook] = (),
    ) -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device={device!r} is invalid: allowed values are cpu | cuda")
        if not (isinstance(accum_steps, int) and accum_steps >= 1):
            raise ValueError(f"accum_steps={accum_steps!r} is invalid: allowed values are an "
                             "integer >= 1")
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.precision = precision
        self.clip = clip
        self.accum_steps = accum_steps
        self.device = device
        self.scheduler = scheduler
        self.hooks = tuple(hooks)
        self.scaler = make_scaler(precision, device)
        # scale() of a zero creates the scale tensor on the device now, so that even a skip
        # on the very first micro-batch can back the scale off.
        self.scaler.scale(torch.zeros((), device=device))
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        # The step index and the cumulative skips (StepLog.step, skips_cumulative) live here.
        self.meter = StepMeter(clip, self.scaler, underflow_every)
        self.grad_syncs = 0  # backward passes that all-reduce (outside no_sync)
        self._distributed = _is_ddp(model) and dist.is_available() and dist.is_initialized()

    @property
    def step_count(self) -> int:
        """Optimizer steps attempted so far (taken or skipped)."""
        return self.meter.step_count

    @property
    def skip_count(self) -> int:
        """Of which skipped."""
        return self.meter.skip_count

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of the step: scaler, scheduler and the counters."""
        return {
            "scaler": self.scaler.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "grad_syncs": self.grad_syncs,
            **self.meter.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict``: the next ``step`` is the one after it."""
        self.scaler.load_state_dict(state["scaler"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.grad_syncs = int(state["grad_syncs"])
        self.meter.load_state_dict(state)

    @classmethod
    def for_run(cls, cfg: RunConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                loss_fn: LossFn, device: str, hooks: Sequence[StepHook] = (),
                scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> TrainStep:
        """The step a run of ``cfg`` trains with, on a concrete ``device``."""
        return cls(model, optimizer, loss_fn, precision=cfg.precision, clip=cfg.clip,
                   accum_steps=cfg.train.accum_steps, device=device,
                   underflow_every=cfg.monitor.underflow_every, scheduler=scheduler,
                   hooks=hooks)

    def step(self, micro_batches: Sequence[MicroBatch]) -> StepLog:
        """Run one optimizer step over ``micro_batches`` (1..accum_steps of them).

        Returns:
            The ``StepLog`` of this step (``skipped`` with a reason if it was not taken).
        """
        n = len(micro_batches)
        if not 1 <= n <= self.accum_steps:
            raise ValueError(f"a window holds 1..{self.accum_steps} micro-batches, got {n}")
        step = self.meter.begin()
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.zero_grad(set_to_none=True)

        # 1. Forward/backward per micro-batch, no host read (DDP: one, to agree).
        if self._distributed:
            fwd = self._backward_distributed(micro_batches, step)
        else:
            fwd = self._backward_local(micro_batches, step)
        if not fwd.ok:  # DDP: the ranks agreed to skip before the all-reducing backward
            return self._skip_loss(step, lr, n, fwd.samples, float(fwd.loss),
                                   self.scaler.get_scale() if self.scaler.is_enabled() else 1.0)
        for hook in self.hooks:
            hook.on_gradients(step, self.params)

        # 2. Unscale once, then measure and clip (core.measure): the pre-clip norm on every run
        #    (clip on or off), one clip on finite gradients, one host read that decides.
        self.scaler.unscale_(self.optimizer)
        m = measure(self.params, self.clip, self.scaler, loss=fwd.loss, model=self.model,
                    sample_underflow=self.meter.samples_underflow(step), losses=fwd.losses)
        if not m.loss_finite:  # the window's gradients are discarded, as if never made
            return self._skip_loss(step, lr, n, fwd.samples, m.loss, m.scaler_scale)

        # 3. Step only on finite gradients, directly (scaler.step would read found_inf again:
        #    a second sync; it is 0 here). update() always runs: it halves on overflow.
        if m.finite:
            self.optimizer.step()
            if self.scheduler is not None:
                self.scheduler.step()
        self.scaler.update()
        return self.meter.log(
            step=step, lr=lr, skip=SkipReason.NONE if m.finite else SkipReason.NONFINITE_GRAD,
            micro_batches=n, samples=fwd.samples, measured=m,
        )

    def _forward(self, step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for hook in self.hooks:
            x, y = hook.on_micro_batch(step, x, y)
        with autocast(self.precision.name, self.device):
            return self.loss_fn(self.model(x), y)

    def _backward_local(self, window: Sequence[MicroBatch], step: int) -> _Forward:
        n = len(window)
        samples = sum(int(y.shape[0]) for _, y in window)
        loss_sum = torch.zeros((), device=self.device)
        losses = []
        for x, y in window:
            loss = self._forward(step, x, y)
            # No host read: ``measure`` reads the losses with the norms (and skips on inf/nan).
            value = loss.detach().float()
            loss_sum += value
            losses.append(value)
            # Divided by the number of micro-batches actually in this window, so a short last
            # window is a true mean too.
            self.scaler.scale(loss / n).backward()
        return _Forward(True, loss_sum / n, samples, torch.stack(losses))

    def _backward_distributed(self, window: Sequence[MicroBatch], step: int) -> _Forward:
        """The forward/backward phase under DDP: every rank takes the same skip decision.

        Every forward and the earlier, local backwards (``no_sync()``) run without a host read;
        before the backward that all-reduces, all ranks agree (``_agree``, one read): any
        non-finite loss skips the step everywhere. One gradient all-reduce per step.
        """
        n = len(window)
        samples = sum(int(y.shape[0]) for _, y in window)
        loss_sum = torch.zeros((), device=self.device)
        bad = torch.zeros((), dtype=torch.bool, device=self.device)
        agreed_loss = math.nan
        for i, (x, y) in enumerate(window):
            syncs = i == n - 1
            with self._sync_context(syncs):
                loss = self._forward(step, x, y)
                value = loss.detach().float()
                bad = bad | ~torch.isfinite(value)
                loss_sum += value
                if syncs:
                    ok, agreed_loss, samples = self._agree(bad, loss_sum / (i + 1), samples)
                    if not ok:
                        self._complete_armed_reduction()
                        return _Forward(False, agreed_loss, samples)
                self.scaler.scale(loss / n).backward()
                self.grad_syncs += int(syncs)
        return _Forward(True, agreed_loss, samples)

    def _sync_context(self, syncs: bool) -> contextlib.AbstractContextManager:
        # Only the window's last backward should all-reduce; earlier ones accumulate locally.
        return contextlib.nullcontext() if syncs else self.model.no_sync()

    def _agree(self, bad: torch.Tensor, local_loss: torch.Tensor,
               samples: int) -> tuple[bool, float, int]:
        """One small all-reduce before each syncing backward: every rank takes the same decision.

        Sums ``[non-finite flag, samples, mean loss]`` over ranks. Any rank's non-finite loss
        skips the step everywhere (one rank must not step alone, nor leave the others waiting
        in the gradient all-reduce), and every rank gets the step's loss and sample count
        over all ranks, which is what rank 0 logs.

        Returns:
            ``(all finite, mean loss over ranks, samples over ranks)``.
        """
        count = torch.full((), float(samples), dtype=torch.float64, device=self.device)
        t = torch.stack([bad.double(), count, local_loss.detach().double()])
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        bad, total_samples, loss_sum = t.tolist()
        return bad == 0, loss_sum / dist.get_world_size(), int(total_samples)

    def _complete_armed_reduction(self) -> None:
        # This micro-batch's forward ran outside no_sync(), which arms DDP's reducer for a
        # backward that the skip cancels. Left armed, the reducer would all-reduce on the next
        # window's first no_sync() backward: an extra all-reduce after every skipped window.
        # A zero backward through every parameter completes it now (all ranks agreed to skip,
        # so all of them take part), keeping one gradient all-reduce per optimizer step.
        params = [p for p in self.model.parameters() if p.requires_grad]
        (torch.stack([p.sum() for p in params]).sum() * 0).backward()
        self.grad_syncs += 1

    def _skip_loss(self, step: int, lr: float, n: int, samples: int, loss: float,
                   scale: float) -> StepLog:
        # A non-finite loss: its gradients are discarded, and unscale_ may have recorded no
        # overflow (a loss of inf + 0 * f(x) has finite gradients), or never ran (DDP: no
        # backward). Back off exactly as an overflow would: scale * backoff_factor and restart
        # the growth streak.
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler.is_enabled():
            self.scaler.update(self.scaler.get_scale() * self.scaler.get_backoff_factor())
            restart_growth_streak(self.scaler)  # no public API: compat.torch
        return self.meter.log(step=step, lr=lr, skip=SkipReason.NONFINITE_LOSS, micro_batches=n,
                              samples=samples, measured=unmeasured(loss, scale))
