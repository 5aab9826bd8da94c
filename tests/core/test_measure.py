"""``core.measure`` outside our loop, and the host reads of a step, counted by the profiler.

A plain PyTorch loop that calls ``StepMeter`` between ``unscale_`` and ``scaler.step`` gets
the ``StepLog`` values ``TrainStep`` gets on the same model, data and seed, field by field,
including a step skipped for an injected inf gradient.

Host reads (``aten::_local_scalar_dense``: ``.item()``, ``bool()``, ``float()`` of a tensor,
a device sync on CUDA) are counted with ``torch.profiler`` over several steps and pinned, so a
change cannot add one silently. Per optimizer step of ``TrainStep`` without the per-layer
table, outside the optimizer's own ``step``:

- one ``loss.item()`` per micro-batch (a non-finite loss skips the step before its backward,
  so it must be known on the host before that backward);
- one ``.tolist()`` of ``[pre, post, loss]``: whether the step is taken, and everything logged
  (counted through a torch-function mode: on CPU it runs no aten op the profiler could see);
- with fp16 only: ``scaler.get_scale()`` (the logged scale) and the ``found_inf`` read inside
  ``GradScaler.step``.

Not counted here: the fp16 underflow share's two reads per gradient tensor on the steps that
sample it (step 1 and every ``underflow_every``, pinned separately), and PyTorch's AdamW on
CPU, which reads each parameter's step count inside its own ``step``.
"""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

import stability.core.measure as measure_module
from stability.core.config import ClipConfig, FaultConfig, PrecisionConfig
from stability.core.faults import FaultInjector
from stability.core.measure import StepMeter, measure
from stability.core.precision import make_scaler
from stability.core.step import TrainStep
from stability.core.steplog import StepLog

DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        x = torch.randn(32, 6, generator=g) * 3
        out.append((x, (x.sum(dim=1, keepdim=True) > 0).float()))
    return out


def _plain_loop(precision: str, clip: ClipConfig, batches: list,
                inf_at: int) -> tuple[list[StepLog], nn.Module]:
    """Ten lines of plain PyTorch (plus the injected fault) around ``StepMeter``."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    loss_fn = nn.BCEWithLogitsLoss()
    meter = StepMeter(clip, scaler)
    logs = []
    for i, (x, y) in enumerate(batches, start=1):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=DTYPES[precision] or torch.float32,
                            enabled=precision != "fp32"):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        if i == inf_at:  # the fault TrainStep's FaultInjector writes
            next(model.parameters()).grad.view(-1)[0] = math.inf
        scaler.unscale_(opt)
        log = meter.step(model, loss, lr=opt.param_groups[0]["lr"], samples=len(y))
        if not log.skipped:
            scaler.step(opt)
        scaler.update()
        logs.append(log)
    return logs, model


def _train_step(precision: str, clip: ClipConfig, inf_at: int | None = None,
                accum: int = 1, underflow_every: int = 25) -> TrainStep:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    hooks = [FaultInjector(FaultConfig(inf_grad_at_step=inf_at))] if inf_at else []
    return TrainStep(model, opt, nn.BCEWithLogitsLoss(), precision=PrecisionConfig(precision),
                     clip=clip, accum_steps=accum, underflow_every=underflow_every, hooks=hooks)


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("clip", [ClipConfig(enabled=True, max_norm=0.05),
                                  ClipConfig(enabled=True, method="value", clip_value=0.01),
                                  ClipConfig(enabled=False)], ids=["norm", "value", "off"])
def test_plain_loop_gets_train_steps_step_logs(precision: str, clip: ClipConfig) -> None:
    """Same model, data and seed: every StepLog field equal, the skipped step included."""
    batches = _batches(6)
    plain, model = _plain_loop(precision, clip, batches, inf_at=3)
    ts = _train_step(precision, clip, inf_at=3)
    ours = [ts.step([b]) for b in batches]

    assert [s.skipped for s in ours] == [False, False, True, False, False, False]
    assert ours[2].skip_reason == "nonfinite_grad" and ours[2].nonfinite_param == "0.weight"
    assert any(s.clipped for s in ours) == clip.enabled  # the clip really acted
    for a, b in zip(plain, ours, strict=True):
        diff = [f.name for f in fields(StepLog)
                if not _same(getattr(a, f.name), getattr(b, f.name))]
        assert not diff, (a.step, diff, a, b)
    # ... and the two loops trained the same weights, bit for bit.
    for p, q in zip(model.parameters(), ts.model.parameters(), strict=True):
        assert torch.equal(p, q)



class _ToList(TorchFunctionMode):
    """Counts ``Tensor.tolist`` calls: on CPU a ``.tolist()`` reads memory without an aten op,
    so the profiler cannot see it; a torch-function mode sees every call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.calls += func is torch.Tensor.tolist
        return func(*args, **(kwargs or {}))


def _host_reads(run: object, steps: int) -> int:
    """Host reads of ``run()`` outside any ``Optimizer.step``: ``aten::_local_scalar_dense``
    events (``.item()``, ``bool()``, ``float()``) plus ``.tolist()`` calls."""
    with profile(activities=[ProfilerActivity.CPU]) as prof, _ToList() as tolist:
        for _ in range(steps):
            run()  # type: ignore[operator]

    def in_optimizer(e: object) -> bool:
        while e is not None:
            if e.name.startswith("Optimizer.step#"):  # type: ignore[attr-defined]
                return True
            e = e.cpu_parent  # type: ignore[attr-defined]
        return False

    return tolist.calls + sum(1 for e in prof.events()
                              if e.name == "aten::_local_scalar_dense" and not in_optimizer(e))


@pytest.mark.parametrize(("precision", "accum", "per_step"), [
    ("fp32", 1, 1), ("fp32", 4, 1), ("bf16", 1, 1), ("bf16", 4, 1), ("fp16", 1, 1), ("fp16", 4, 1),
])
def test_train_step_host_reads_are_pinned(precision: str, accum: int, per_step: int) -> None:
    """Per step: the one ``.tolist()`` (norms, every micro-batch loss, fp16's scale), whatever
    the accumulation; GradScaler's own ``found_inf`` read is not made (the optimizer is
    stepped directly). Before issue 48: 1 per micro-batch + 1, fp16 + 2."""
    ts = _train_step(precision, ClipConfig(enabled=True, max_norm=0.05), accum=accum,
                     underflow_every=10**6)
    window = _batches(accum)
    ts.step(window)  # step 1 samples the fp16 underflow share: measured separately below
    steps = 5
    assert _host_reads(lambda: ts.step(window), steps) == steps * per_step
    assert ts.skip_count == 0  # every counted step was taken (no skip path in the figure)


def test_underflow_sample_rides_in_the_one_read() -> None:
    """The fp16 underflow share (sampled steps only) adds no read: its two counts are read
    with the norms (before issue 48: two per gradient tensor)."""
    ts = _train_step("fp16", ClipConfig(enabled=False), underflow_every=1)
    window = _batches(1)
    ts.step(window)
    assert _host_reads(lambda: ts.step(window), 1) == 1
    assert 0 <= ts.step(window).underflow_frac <= 1


@pytest.mark.parametrize(("precision", "reads"), [("fp32", 1), ("bf16", 1), ("fp16", 1)])
def test_measure_reads_once_with_the_scale(precision: str, reads: int) -> None:
    """``measure`` alone: one read, the scale of an enabled scaler in it."""
    model = _model()
    scaler = make_scaler(PrecisionConfig(precision), "cpu")
    x, y = _batches(1)[0]
    scaler.scale(nn.functional.binary_cross_entropy_with_logits(model(x), y)).backward()
    opt = torch.optim.AdamW(model.parameters())
    scaler.unscale_(opt)
    loss = torch.tensor(0.5)
    got = []
    assert _host_reads(lambda: got.append(
        measure(model.parameters(), ClipConfig(enabled=True, max_norm=1e-3), scaler,
                loss=loss)), 1) == reads
    m = got[0]
    assert m.finite and m.clipped and m.loss == 0.5
    assert m.grad_l2_post_clip == pytest.approx(1e-3, rel=1e-4)
    assert m.grad_l2_pre_clip > 1e-2


@pytest.mark.parametrize("clip", [ClipConfig(enabled=True, max_norm=1e-3),
                                  ClipConfig(enabled=True, method="value", clip_value=1e-3),
                                  ClipConfig(enabled=False)], ids=["norm", "value", "off"])
def test_a_non_finite_gradient_is_reported_unclipped_and_named(clip: ClipConfig) -> None:
    """A skipped step logs the pre-clip norm as post (nothing counted as clipped), names the
    first bad parameter, and leaves every gradient unclipped for whoever looks next."""
    def with_grads(*bad: str) -> nn.Module:
        model = _model()
        x, y = _batches(1)[0]
        nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
        named = dict(model.named_parameters())
        for name, value in zip(bad, (math.inf, math.nan), strict=False):
            named[name].grad.view(-1)[0] = value
        return model

    model = with_grads("2.bias", "0.weight")  # 0.weight comes first in the model's order
    m = measure(model.parameters(), clip, None, model=model)
    assert not m.finite and not m.clipped and m.nonfinite_param == "0.weight"
    assert math.isnan(m.grad_l2_pre_clip) and math.isnan(m.grad_l2_post_clip)
    assert math.isnan(m.loss) and m.scaler_scale == 1.0
    assert math.isnan(float(model[0].weight.grad.view(-1)[0]))  # left as they were
    model = with_grads("2.bias")
    m = measure(model.parameters(), clip, None, model=model)
    assert m.nonfinite_param == "2.bias"
    assert m.grad_l2_pre_clip == math.inf == m.grad_l2_post_clip
    assert math.isinf(float(model[2].bias.grad.view(-1)[0]))
    assert torch.isfinite(model[0].weight.grad).all()  # and no finite one was scaled to nan


def test_the_documented_plain_loop_runs_and_matches_train_step() -> None:
    """The loop quoted in ``core.measure``'s docstring, run as written: TrainStep's last log."""
    block = measure_module.__doc__.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    code = "\n".join(line[4:] for line in block.splitlines())
    model = _model()
    batches = _batches(4)
    space = {"torch": torch, "StepMeter": StepMeter, "ClipConfig": ClipConfig,
             "model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-2),
             "scaler": torch.amp.GradScaler("cpu", enabled=False),
             "loss_fn": nn.BCEWithLogitsLoss(), "batches": batches}
    exec(code, space)  # noqa: S102 - the documentation's own example
    ts = _train_step("bf16", ClipConfig(enabled=True, max_norm=1.0))
    ours = [ts.step([b]) for b in batches][-1]
    assert space["meter"].step_count == 4 and space["log"] == ours
