"""``TrainStep``: AMP call order, the skip paths, clip-off measurement and the LR scheduler."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from stability.core.clipping import grad_global_norm
from stability.core.config import ClipConfig, FaultConfig, PrecisionConfig
from stability.core.faults import FaultInjector
from stability.core.step import TrainStep
from stability.tasks.sign_sum import ModelConfig, SequenceClassifier

SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


def _batch(n: int = 16, seed: int = 0, seq_len: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch of the sign-of-sum task."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, seq_len, 1, generator=g)
    return x, (x.sum(dim=(1, 2)) > 0).float()


def _make(
    precision: str = "fp32",
    *,
    accum: int = 1,
    clip: bool = False,
    max_norm: float = 1.0,
    fault: FaultConfig | None = None,
    scheduler: SchedulerFactory | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    growth_interval: int = 2000,
    seed: int = 0,
) -> TrainStep:
    """A real TrainStep over a small SequenceClassifier and AdamW."""
    torch.manual_seed(seed)
    model = SequenceClassifier(ModelConfig(hidden_size=8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
    return TrainStep(model, opt, loss_fn or nn.BCEWithLogitsLoss(),
                     precision=PrecisionConfig(name=precision, growth_interval=growth_interval),
                     clip=ClipConfig(enabled=clip, max_norm=max_norm), accum_steps=accum,
                     scheduler=scheduler(opt) if scheduler else None,
                     hooks=[FaultInjector(fault)] if fault else [])


def _norm(ts: TrainStep) -> float:
    return float(grad_global_norm([p.grad for p in ts.params if p.grad is not None]))


def _instrument(ts: TrainStep) -> tuple[list[str], dict]:
    """Wrap the real scaler/optimizer calls of ``ts`` with recorders (no behaviour change).

    Returns the event list and a dict of gradient norms seen at unscale_ and the optimizer step.
    """
    events: list[str] = []
    seen: dict[str, float] = {}

    def record(name: str, fn: Callable[..., Any], before: Callable[[], None] | None = None,
               after: Callable[[], None] | None = None):
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            events.append(name)
            if before is not None:
                before()
            out = fn(*args, **kwargs)
            if after is not None:
                after()
            return out
        return wrapper

    ts.scaler.scale = record("scale", ts.scaler.scale)
    ts.scaler.unscale_ = record("unscale_", ts.scaler.unscale_,
                                lambda: seen.__setitem__("at_unscale", _norm(ts)),
                                lambda: seen.__setitem__("after_unscale", _norm(ts)))
    ts.scaler.step = record("scaler.step", ts.scaler.step,
                            lambda: seen.__setitem__("at_step", _norm(ts)))
    ts.scaler.update = record("update", ts.scaler.update)
    def stepping(*_: object) -> None:  # a pre-hook returning a value replaces step's args
        events.append("optimizer.step")
        seen["at_step"] = _norm(ts)

    ts.optimizer.register_step_pre_hook(stepping)
    ts.model.head.weight.register_post_accumulate_grad_hook(lambda _: events.append("backward"))
    return events, seen


def test_fp16_amp_call_order_with_accumulation() -> None:
    """scale+backward per micro-batch, then unscale_ -> clip -> optimizer.step -> update, once.

    The clip is seen in the gradients themselves: unclipped right after ``unscale_``, clipped
    when the optimizer steps. ``scaler.step`` is not called: the step decided on the one host
    read already, and ``scaler.step`` would read its ``found_inf`` again.
    """
    ts = _make("fp16", accum=4, clip=True, max_norm=1e-3)
    events, seen = _instrument(ts)
    scale = ts.scaler.get_scale()

    log = ts.step([_batch(seed=i) for i in range(4)])

    assert events == ["scale", "backward"] * 4 + ["unscale_", "optimizer.step", "update"]
    assert not log.skipped and log.clipped
    # backward ran on the scaled loss; unscale_ came before the norm and the clip.
    assert seen["at_unscale"] == pytest.approx(scale * log.grad_l2_pre_clip, rel=1e-3)
    assert seen["after_unscale"] == pytest.approx(log.grad_l2_pre_clip, rel=1e-6)
    assert log.grad_l2_pre_clip > 10 * 1e-3  # so the clip below really changed them
    assert seen["at_step"] == pytest.approx(1e-3, rel=1e-4)
    assert log.grad_l2_post_clip == pytest.approx(1e-3, rel=1e-4)


def test_fp16_update_runs_on_skipped_step_without_optimizer_step() -> None:
    """An inf gradient: unscale_ then update (scale halved); the optimizer never steps."""
    ts = _make("fp16", fault=FaultConfig(inf_grad_at_step=1))
    events, _ = _instrument(ts)
    scale = ts.scaler.get_scale()

    log = ts.step([_batch()])

    assert events == ["scale", "backward", "unscale_", "update"]
    assert log.skipped and log.skip_reason == "nonfinite_grad"
    assert log.scaler_scale == scale
    assert ts.scaler.get_scale() == scale / 2


def test_update_runs_on_every_step() -> None:
    """Over taken and skipped steps alike, update() is called exactly once per step."""
    ts = _make("fp16", fault=FaultConfig(inf_grad_at_step=2))
    events, _ = _instrument(ts)
    logs = [ts.step([_batch(seed=i)]) for i in range(4)]
    assert [s.skipped for s in logs] == [False, True, False, False]
    assert events.count("update") == 4
    assert events.count("optimizer.step") == 3


class _PoisonLoss:
    """BCE loss that returns ``poison`` (inf/nan) instead on selected calls."""

    def __init__(self, poison_calls: set[int], poison: float) -> None:
        self.calls = 0
        self.poison_calls = poison_calls
        self.poison = poison

    def __call__(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = F.binary_cross_entropy_with_logits(logits.float(), y)
        if self.calls in self.poison_calls:
            return loss * 0 + self.poison
        return loss


@pytest.mark.parametrize("poison", [math.inf, -math.inf, math.nan])
def test_nonfinite_loss_skips_the_step(poison: float) -> None:
    """A non-finite loss is caught in the step's one host read, after the window's backward
    (its gradients are discarded); fp16 scale is halved once, update still runs, the
    optimizer never steps. ``-inf`` here has finite gradients (``loss * 0 + poison``): the
    loss itself decides, not the norm."""
    ts = _make("fp16", loss_fn=_PoisonLoss({1}, poison))
    events, _ = _instrument(ts)
    scale = ts.scaler.get_scale()

    log = ts.step([_batch()])

    assert log.skipped and log.skip_reason == "nonfinite_loss"
    assert events == ["scale", "backward", "unscale_", "update"]
    assert log.loss == poison or (math.isnan(poison) and math.isnan(log.loss))
    assert all(p.grad is None for p in ts.params)
    assert ts.scaler.get_scale() == scale / 2
    assert math.isnan(log.grad_l2_pre_clip)


def test_nonfinite_loss_mid_window_discards_the_window() -> None:
    """A non-finite third micro-batch: the window's backwards ran (no read decides before the
    last), then the whole window is discarded: no optimizer step, grads cleared."""
    ts = _make("fp32", accum=4, loss_fn=_PoisonLoss({3}, math.inf))
    events, _ = _instrument(ts)

    log = ts.step([_batch(seed=i) for i in range(4)])

    assert log.skipped and log.skip_reason == "nonfinite_loss"
    assert log.loss == math.inf and math.isnan(log.grad_l2_pre_clip)
    assert events.count("backward") == 4
    assert "optimizer.step" not in events
    assert all(p.grad is None for p in ts.params)


def _snapshot(ts: TrainStep) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    params = [p.detach().clone() for p in ts.params]
    states = [{k: v.clone() for k, v in ts.optimizer.state[p].items()} for p in ts.params]
    return params, states


def _step_lr(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def _lambda_lr(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0 / (1 + e))


@pytest.mark.parametrize("scheduler", [_step_lr, _lambda_lr], ids=["StepLR", "LambdaLR"])
@pytest.mark.parametrize("reason", ["nonfinite_grad", "nonfinite_loss"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_skipped_step_changes_nothing(
    precision: str, reason: str, scheduler: SchedulerFactory,
) -> None:
    """A skip leaves params, AdamW state and the LR schedule bit-identical; fp16 halves."""
    poison = _PoisonLoss({2} if reason == "nonfinite_loss" else set(), math.nan)
    fault = FaultConfig(inf_grad_at_step=2) if reason == "nonfinite_grad" else None
    ts = _make(precision, fault=fault, scheduler=scheduler, loss_fn=poison)
    assert ts.scheduler is not None

    first = ts.step([_batch(seed=0)])
    assert not first.skipped
    params, states = _snapshot(ts)
    assert int(states[0]["step"]) == 1
    last_epoch, lr = ts.scheduler.last_epoch, ts.optimizer.param_groups[0]["lr"]
    scale = ts.scaler.get_scale()

    log = ts.step([_batch(seed=1)])

    assert log.skipped and log.skip_reason == reason
    for p, before in zip(ts.params, params, strict=True):
        assert torch.equal(p, before)
    for p, before in zip(ts.params, states, strict=True):
        after = ts.optimizer.state[p]
        assert after.keys() == before.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key in before:
            assert torch.equal(after[key], before[key]), key
    assert ts.scheduler.last_epoch == last_epoch
    assert ts.optimizer.param_groups[0]["lr"] == lr
    if precision == "fp16":
        assert ts.scaler.get_scale() == scale / 2
    else:
        assert not ts.scaler.is_enabled()

    third = ts.step([_batch(seed=2)])
    assert not third.skipped
    assert third.lr == lr
    assert ts.scheduler.last_epoch == last_epoch + 1
    assert int(ts.optimizer.state[ts.params[0]]["step"]) == 2


def test_logged_lr_is_the_lr_used_by_the_step() -> None:
    """The row's lr is the one the optimizer applied; the scheduler advances after the step."""
    ts = _make(scheduler=_step_lr)
    logs = [ts.step([_batch(seed=i)]) for i in range(3)]
    assert [s.lr for s in logs] == pytest.approx([1e-2, 5e-3, 2.5e-3])


def _reference_grads(ts: TrainStep, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Plain fp32 forward/backward on an identically initialised model."""
    torch.manual_seed(0)
    ref = SequenceClassifier(ModelConfig(hidden_size=8))
    ref.load_state_dict(ts.model.state_dict())
    nn.BCEWithLogitsLoss()(ref(x), y).backward()
    return [p.grad for p in ref.parameters()]


@pytest.mark.parametrize(("clip", "max_norm"), [(False, 1e-6), (True, 1e6)])
def test_unclipped_step_measures_norm_and_leaves_gradients(clip: bool, max_norm: float) -> None:
    """Clip off (even with a tiny max_norm) or below threshold: post == pre, grads untouched."""
    ts = _make(clip=clip, max_norm=max_norm)
    x, y = _batch()
    expected = _reference_grads(ts, x, y)

    log = ts.step([(x, y)])

    grads = [p.grad for p in ts.model.parameters()]
    for g, e in zip(grads, expected, strict=True):
        assert torch.equal(g, e)
    assert log.grad_l2_pre_clip == pytest.approx(float(grad_global_norm(expected)), rel=1e-6)
    assert log.grad_l2_post_clip == log.grad_l2_pre_clip
    assert log.grad_l2_pre_clip > 1e-6
    assert not log.clipped


def test_clipped_step_scales_gradients_to_max_norm() -> None:
    """Clip on and above threshold: gradients the optimizer saw have norm max_norm."""
    ts = _make(clip=True, max_norm=1e-3)
    x, y = _batch()
    expected = _reference_grads(ts, x, y)
    pre = float(grad_global_norm(expected))

    log = ts.step([(x, y)])

    assert log.clipped
    assert log.grad_l2_pre_clip == pytest.approx(pre, rel=1e-6)
    assert log.grad_l2_post_clip == pytest.approx(1e-3, rel=1e-5)
    assert _norm(ts) == pytest.approx(1e-3, rel=1e-5)
    for p, e in zip(ts.model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.grad, e * (1e-3 / pre), rtol=1e-4, atol=1e-12)


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)],
)
def test_step_runs_the_rnn_in_the_precision_dtype(precision: str, dtype: torch.dtype) -> None:
    """On CPU too, fp16 autocast really computes nn.RNN in float16 (bf16 in bfloat16)."""
    ts = _make(precision)
    seen: list[torch.dtype] = []
    ts.model.rnn.register_forward_hook(lambda _m, _i, out: seen.append(out[0].dtype))
    ts.step([_batch()])
    assert seen == [dtype]
    assert ts.scaler.is_enabled() == (precision == "fp16")


def test_fp16_scale_grows_after_growth_interval_and_restarts_after_skip() -> None:
    """update() doubles the scale after growth_interval good steps; a skip halves it."""
    ts = _make("fp16", growth_interval=2, fault=FaultConfig(inf_grad_at_step=3))
    scales = [ts.step([_batch(seed=i)]).scaler_scale for i in range(6)]
    s = 2.0**16
    assert scales == [s, s, 2 * s, s, s, 2 * s]


def _known_underflow_step(precision: str, max_norm: float | None = None) -> TrainStep:
    """A linear model whose unscaled gradient is [1e-8, 1e-8, 1e-4, 1e-4]: half flushes in fp16.

    loss = 1e-4 * (w . x) with x = [1e-4, 1e-4, 1, 1], so dL/dw = 1e-4 * x. fp16's smallest
    subnormal is ~6e-8: 1e-8 flushes to zero, 1e-4 does not. Under the GradScaler every value
    is representable while scaled (x 65536), so the share is measured on the unscaled values.
    """
    model = nn.Linear(4, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    return TrainStep(model, opt, lambda out, _y: 1e-4 * out.float().sum(),
                     precision=PrecisionConfig(name=precision),
                     clip=ClipConfig(enabled=max_norm is not None, max_norm=max_norm or 1.0))


KNOWN_X = torch.tensor([[1e-4, 1e-4, 1.0, 1.0]])


def test_underflow_fraction_is_fp16_only_and_measured_before_clipping() -> None:
    """fp16 underflow share of a gradient built to be half sub-fp16 is 0.5, clipped or not."""
    unclipped = _known_underflow_step("fp16").step([(KNOWN_X, torch.zeros(1))])
    clipped = _known_underflow_step("fp16", max_norm=1e-9).step([(KNOWN_X, torch.zeros(1))])
    assert clipped.clipped and not unclipped.clipped
    assert unclipped.underflow_frac == pytest.approx(0.5)
    assert clipped.underflow_frac == pytest.approx(0.5)  # clipping would have made it 1.0
    for precision in ("fp32", "bf16"):
        log = _known_underflow_step(precision).step([(KNOWN_X, torch.zeros(1))])
        assert math.isnan(log.underflow_frac)


@pytest.mark.parametrize("n", [0, 3])
def test_window_size_outside_one_to_accum_steps_is_rejected(n: int) -> None:
    """A window holds 1..accum_steps micro-batches."""
    ts = _make(accum=2)
    with pytest.raises(ValueError, match="micro-batches"):
        ts.step([_batch(seed=i) for i in range(n)])


def test_skips_cumulative_is_counted_once_by_the_step() -> None:
    """Every StepLog carries the run's skips so far (the CSV and MLflow both read it)."""
    ts = _make("fp16", fault=FaultConfig(inf_grad_at_step=2))
    logs = [ts.step([_batch(seed=i)]) for i in range(4)]
    assert [lg.skipped for lg in logs] == [False, True, False, False]
    assert [lg.skips_cumulative for lg in logs] == [0, 1, 1, 1]
    assert ts.skip_count == 1
