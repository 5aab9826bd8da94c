"""``TrainStep``: one optimizer step over a window of micro-batches, readable top to bottom.

The order is the one AMP requires and every test pins:

    per micro-batch:  autocast forward -> isfinite(loss) -> scaler.scale(loss / n).backward()
    after the window: scaler.unscale_(opt) -> finiteness check -> clip -> scaler.step(opt)
    always:           scaler.update()  (skipped or not; a no-op unless fp16)

The step never logs anything itself: it returns a ``StepLog`` and the run loop decides
where records go.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from stability.core.clipping import (
    clip_by_norm_,
    clip_by_value_,
    first_non_finite,
    grad_global_norm,
)
from stability.core.config import FaultConfig, StepConfig
from stability.core.precision import autocast, fp16_underflow_fraction, make_scaler
from stability.core.steplog import StepLog

MicroBatch = tuple[torch.Tensor, torch.Tensor]
LOSS_SPIKE_FACTOR = 1e8


def _is_ddp(model: nn.Module) -> bool:
    return isinstance(model, nn.parallel.DistributedDataParallel)


class TrainStep:
    """Owns the autocast context and the GradScaler; ``step(window)`` is one optimizer step.

    Args:
        model: the module (optionally wrapped in ``DistributedDataParallel``).
        optimizer: its optimizer.
        loss_fn: ``loss_fn(logits, targets) -> scalar`` (mean over the micro-batch).
        config: the validated ``StepConfig``.
        scheduler: optional LR scheduler, advanced only on steps actually taken.
        fault: optional fault injection (1-based optimizer-step indices).
        sync_every_micro_batch: under DDP, all-reduce after every micro-batch instead of only
            after the window's last one (no ``no_sync``); for measuring what no_sync saves.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        config: StepConfig,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        fault: FaultConfig | None = None,
        sync_every_micro_batch: bool = False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.config = config
        self.scheduler = scheduler
        self.fault = fault or FaultConfig()
        self.sync_every_micro_batch = sync_every_micro_batch
        self.scaler = make_scaler(config)
        # scale() of a zero creates the scale tensor on the device now, so that even a skip
        # on the very first micro-batch can back the scale off.
        self.scaler.scale(torch.zeros((), device=config.device))
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.step_count = 0  # optimizer steps attempted (taken or skipped)
        self.grad_syncs = 0  # backward passes that all-reduce (outside no_sync)
        self._distributed = _is_ddp(model) and dist.is_available() and dist.is_initialized()

    def _sync_context(self, syncs: bool) -> contextlib.AbstractContextManager:
        # Only the window's last backward should all-reduce; earlier ones accumulate locally.
        if _is_ddp(self.model) and not syncs:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def _agree(self, local_ok: bool, local_loss: torch.Tensor,
               samples: int) -> tuple[bool, float, int]:
        """One small all-reduce before each syncing backward: every rank takes the same decision.

        Sums ``[non-finite flag, samples, mean loss]`` over ranks. Any rank's non-finite loss
        skips the step everywhere (one rank must not step alone, nor leave the others waiting
        in the gradient all-reduce), and every rank gets the step's loss and sample count
        over all ranks, which is what rank 0 logs.

        Returns:
            ``(all finite, mean loss over ranks, samples over ranks)``.
        """
        head = torch.tensor([float(not local_ok), float(samples)], dtype=torch.float64,
                            device=self.config.device)
        t = torch.cat([head, local_loss.detach().double().reshape(1)])
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

    def _skip_without_backward(self) -> None:
        # A non-finite loss never reaches backward, so unscale_ has recorded no overflow and the
        # public update() would refuse to run. Back off exactly as an overflow would: scale *
        # backoff_factor and restart the growth streak.
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler.is_enabled():
            self.scaler.update(self.scaler.get_scale() * self.scaler.get_backoff_factor())
            self.scaler._growth_tracker.zero_()  # no public API for this; see docstring above

    def step(self, micro_batches: Sequence[MicroBatch]) -> StepLog:
        """Run one optimizer step over ``micro_batches`` (1..accum_steps of them).

        Returns:
            The ``StepLog`` of this step (``skipped`` with a reason if it was not taken).
        """
        n = len(micro_batches)
        if not 1 <= n <= self.config.accum_steps:
            raise ValueError(f"a window holds 1..{self.config.accum_steps} micro-batches, got {n}")
        self.step_count += 1
        step = self.step_count
        lr = float(self.optimizer.param_groups[0]["lr"])
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        spike = self.fault.loss_spike_at_step == step
        samples = sum(int(y.shape[0]) for _, y in micro_batches)
        self.optimizer.zero_grad(set_to_none=True)

        # 1. Forward/backward per micro-batch. Each loss is divided by the number of
        #    micro-batches actually in this window, so a short last window is a true mean too.
        #    Distributed, a rank whose loss is non-finite keeps running the forwards (no
        #    backward) so that every rank meets the same collectives, and all ranks agree on
        #    the skip before the backward that all-reduces.
        loss_sum = torch.zeros((), device=self.config.device)
        local_ok = True
        agreed_loss: float | None = None
        logged_samples = samples  # over all ranks once they have agreed
        for i, (x, y) in enumerate(micro_batches):
            if spike:
                y = y * LOSS_SPIKE_FACTOR
            syncs = i == n - 1 or self.sync_every_micro_batch
            with self._sync_context(syncs):
                with autocast(self.config):
                    loss = self.loss_fn(self.model(x), y)
                # One host read of the scalar (a sync on CUDA either way): ~0.5 us on CPU against
                # ~10 us for bool(torch.isfinite(...)), which dispatches an op and a conversion.
                local_ok = local_ok and math.isfinite(loss.item())
                loss_sum += loss.detach().float()
                if not self._distributed and not local_ok:
                    self._skip_without_backward()
                    return self._log(step, lr, math.nan, math.nan, float(loss.detach()), True,
                                     "nonfinite_loss", scale, False, n, samples)
                if self._distributed and syncs:
                    ok, agreed_loss, logged_samples = self._agree(local_ok, loss_sum / (i + 1),
                                                                  samples)
                    if not ok:
                        self._complete_armed_reduction()
                        self._skip_without_backward()
                        return self._log(step, lr, math.nan, math.nan, agreed_loss, True,
                                         "nonfinite_loss", scale, False, n, logged_samples)
                if local_ok:
                    self.scaler.scale(loss / n).backward()
                    self.grad_syncs += int(_is_ddp(self.model) and syncs)
        if self.fault.inf_grad_at_step == step:
            next(p for p in self.params if p.grad is not None).grad.view(-1)[0] = math.inf

        # 2. Unscale once, then measure: the pre-clip norm is computed on every run (clip on or
        #    off), and a non-finite norm is exactly "some gradient element is inf/nan".
        self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.params if p.grad is not None]
        pre = grad_global_norm(grads)
        finite = bool(torch.isfinite(pre))

        # The fp16 underflow share describes the raw unscaled gradients, so it is sampled
        # before clipping (clipped gradients are smaller and would inflate it).
        underflow = math.nan
        if finite and self.config.scaler_enabled and (
            step == 1 or step % self.config.underflow_every == 0
        ):
            underflow = fp16_underflow_fraction(grads)

        # 3. Clip once per window, only on finite gradients (clipping inf yields nan).
        post = pre
        if finite and self.config.clip_enabled:
            if self.config.clip_method == "norm":
                post = clip_by_norm_(grads, pre, self.config.max_norm)
            else:
                post = clip_by_value_(grads, self.config.clip_value)

        # 4. Step only on finite gradients; with fp16, scaler.step re-checks the same
        #    found_inf that unscale_ recorded. update() always runs: it halves on overflow.
        nonfinite_param = ""
        if finite:
            self.scaler.step(self.optimizer)
            if self.scheduler is not None:
                self.scheduler.step()
        else:
            named = getattr(self.model, "module", self.model).named_parameters()
            nonfinite_param = first_non_finite(named)
        self.scaler.update()

        pre_f, post_f, loss_f = torch.stack([pre, post, loss_sum / n]).tolist()
        if agreed_loss is not None:
            loss_f = agreed_loss  # the mean over all ranks, not just this one's
        clipped = finite and self.config.clip_enabled and post_f < pre_f
        return self._log(step, lr, pre_f, post_f, loss_f, not finite,
                         "" if finite else "nonfinite_grad", scale, clipped, n, logged_samples,
                         underflow, nonfinite_param)

    @staticmethod
    def _log(step: int, lr: float, pre: float, post: float, loss: float, skipped: bool,
             reason: str, scale: float, clipped: bool, n: int, samples: int,
             underflow: float = math.nan, nonfinite_param: str = "") -> StepLog:
        return StepLog(
            step=step, lr=lr, grad_l2_pre_clip=pre, grad_l2_post_clip=post, loss=loss,
            skipped=skipped, skip_reason=reason, scaler_scale=scale, clipped=clipped,
            micro_batches=n, samples=samples, underflow_frac=underflow,
            nonfinite_param=nonfinite_param,
        )
