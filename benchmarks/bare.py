"""The reference loop: plain PyTorch, written inline, nothing else.

Same data (``make_splits``), same model and initialisation (``SequenceClassifier`` after
``torch.manual_seed``), same AdamW, same shuffling generator and micro-batch windows as
``stability.core.loop.train``; per optimizer step only ``loss.backward()``, ``clip_grad_norm_``
and ``opt.step()`` (with the GradScaler calls AMP needs for fp16). No finiteness checks, no
norms read back, no records, no files. An epoch is the training pass plus the validation
pass, exactly what ``EpochLog.seconds`` covers in the run loop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.timing import StepClock
from stability.core.config import RunConfig
from stability.core.precision import AUTOCAST_DTYPES, Precision, resolve_device
from stability.tasks.sign_sum import SequenceClassifier, make_splits

EVAL_BATCH = 1024  # as stability.core.loop.evaluate


class BareLoop:
    """``cfg``'s training without any of the stability instrumentation.

    Args:
        cfg: the run configuration (data, model, optimiser, precision, clipping, seed).
    """

    def __init__(self, cfg: RunConfig) -> None:
        torch.set_num_threads(cfg.train.threads)
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.splits = make_splits(cfg.data)
        torch.manual_seed(cfg.seed)
        self.model = SequenceClassifier(cfg.model).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.train.lr,
                                     weight_decay=cfg.train.weight_decay)
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.shuffle = torch.Generator().manual_seed(cfg.seed)
        dtype = AUTOCAST_DTYPES[cfg.precision.name]
        self.autocast: Callable[[], contextlib.AbstractContextManager] = (
            (lambda: torch.autocast(self.device, dtype=dtype)) if dtype is not None
            else contextlib.nullcontext
        )
        self.scaler = torch.amp.GradScaler(
            self.device, init_scale=cfg.precision.init_scale,
            growth_interval=cfg.precision.growth_interval,
            enabled=Precision(cfg.precision.name).scaled,
        )
        self.last_val_loss = float("nan")

    def epoch(self, clock: StepClock | None = None) -> float:
        """One training pass and one validation pass; returns the seconds it took.

        Args:
            clock: ticked after every optimizer step (steady-state step timing).
        """
        t0 = time.perf_counter()
        train, bs, acc = self.splits.train, self.cfg.train.batch_size, self.cfg.train.accum_steps
        perm = torch.randperm(len(train), generator=self.shuffle)
        batches = [perm[i : i + bs] for i in range(0, len(train), bs)]
        for w in range(0, len(batches), acc):
            window = batches[w : w + acc]
            self.opt.zero_grad(set_to_none=True)
            for idx in window:
                x, y = train.x[idx].to(self.device), train.y[idx].to(self.device)
                with self.autocast():
                    loss = self.loss_fn(self.model(x), y)
                self.scaler.scale(loss / len(window)).backward()
            self.scaler.unscale_(self.opt)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip.max_norm)
            self.scaler.step(self.opt)
            self.scaler.update()
            if clock is not None:
                clock.tick()
        if clock is not None:
            clock.on_epoch(None)
        self.last_val_loss = self._validate()  # reads a float: waits for the device too
        return time.perf_counter() - t0

    @torch.no_grad()
    def _validate(self) -> float:
        val = self.splits.val
        self.model.eval()
        total = 0.0
        for i in range(0, len(val), EVAL_BATCH):
            x, y = val.x[i : i + EVAL_BATCH].to(self.device), val.y[i : i + EVAL_BATCH]
            with self.autocast():
                logits = self.model(x).float()
            total += float(nn.functional.binary_cross_entropy_with_logits(
                logits, y.to(self.device), reduction="sum"))
        self.model.train()
        return total / len(val)

    def run(self, epochs: int | None = None, clock: StepClock | None = None) -> list[float]:
        """``epochs`` (default ``cfg.train.epochs``) epochs; seconds per epoch."""
        return [self.epoch(clock) for _ in range(epochs or self.cfg.train.epochs)]


def bare_epochs(cfg: RunConfig, clock: StepClock | None = None) -> list[float]:
    """A fresh bare loop trained for ``cfg.train.epochs`` epochs; seconds per epoch."""
    return BareLoop(cfg).run(clock=clock)
