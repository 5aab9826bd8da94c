"""Gradient accumulation: true means per window, one clip and one optimizer step per window,
DDP gradient sync only on the window's last backward."""

from __future__ import annotations

import csv
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from stability.core.config import (
    ClipConfig,
    FaultConfig,
    PrecisionConfig,
    RunConfig,
    TrainConfig,
)
from stability.core.faults import FaultInjector
from stability.core.loop import train
from stability.core.step import MicroBatch, TrainStep
from stability.tasks.sign_sum import DataConfig, ModelConfig, SequenceClassifier, make_splits

B = 8  # micro-batch size


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, 1, generator=g)
    return x, (x.sum(dim=(1, 2)) > 0).float()


def _trainer(accum: int, clip: bool = False, max_norm: float = 1.0, model: nn.Module | None = None,
             fault: FaultConfig | None = None) -> TrainStep:
    """Fresh TrainStep with identical initialisation every call (seed 0)."""
    torch.manual_seed(0)
    model = model if model is not None else SequenceClassifier(ModelConfig(hidden_size=16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    return TrainStep(model, opt, nn.BCEWithLogitsLoss(), precision=PrecisionConfig(),
                     clip=ClipConfig(enabled=clip, max_norm=max_norm), accum_steps=accum,
                     hooks=[FaultInjector(fault)] if fault else [])


def _split(x: torch.Tensor, y: torch.Tensor, k: int) -> list[MicroBatch]:
    return list(zip(x.split(B), y.split(B), strict=True))[:k]


def _max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((u - v).detach().abs().max()) for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize(
    ("accum", "k", "clip"),
    [(4, 4, False), (4, 4, True), (4, 3, False), (4, 3, True)],
    ids=["full", "full-clipped", "short-window", "short-window-clipped"],
)
def test_k_micro_batches_equal_one_big_batch(accum: int, k: int, clip: bool) -> None:
    """k micro-batches of b == one batch of k*b: gradients and the updated params (< 1e-4).

    The short window (3 micro-batches with accum_steps=4) divides by its own size, 3.
    """
    x, y = _data(k * B)
    max_norm = 0.05
    accumulated = _trainer(accum, clip, max_norm)
    single = _trainer(1, clip, max_norm)

    log_a = accumulated.step(_split(x, y, k))
    log_s = single.step([(x, y)])

    assert log_a.micro_batches == k and log_a.samples == k * B
    assert log_a.grad_l2_pre_clip == pytest.approx(log_s.grad_l2_pre_clip, rel=1e-5)
    if clip:  # the clip really happened, once, on the accumulated gradient
        assert log_a.clipped and log_s.clipped
        assert log_a.grad_l2_post_clip == pytest.approx(max_norm, rel=1e-4)
    grads_a = [p.grad for p in accumulated.model.parameters()]
    grads_s = [p.grad for p in single.model.parameters()]
    params_a = list(accumulated.model.parameters())
    params_s = list(single.model.parameters())
    assert _max_abs_diff(grads_a, grads_s) < 1e-4
    assert _max_abs_diff(params_a, params_s) < 1e-4
    # the step moved the parameters (the comparison above is not vacuous)
    fresh = list(_trainer(1).model.parameters())
    assert _max_abs_diff(params_a, fresh) > 1e-4


def test_short_window_is_not_divided_by_accum_steps() -> None:
    """Dividing a 3-micro-batch window by accum_steps=4 would give 3/4 of the true gradient."""
    x, y = _data(3 * B)
    short = _trainer(4)
    short.step(_split(x, y, 3))
    single = _trainer(1)
    single.step([(x, y)])
    ratio = torch.linalg.vector_norm(short.model.head.weight.grad) / torch.linalg.vector_norm(
        single.model.head.weight.grad)
    assert float(ratio) == pytest.approx(1.0, abs=1e-5)


def test_optimizer_state_advances_once_per_optimizer_step() -> None:
    """AdamW state['step'] counts optimizer steps taken, not micro-batches (skips excluded)."""
    ts = _trainer(4, fault=FaultConfig(inf_grad_at_step=3))
    x, y = _data(20 * B)
    batches = _split(x, y, 20)
    logs = [ts.step(batches[i : i + 4]) for i in range(0, 20, 4)]
    assert [s.skipped for s in logs] == [False, False, True, False, False]
    for p in ts.model.parameters():
        assert int(ts.optimizer.state[p]["step"]) == 4
    assert ts.step_count == 5


def test_run_steps_the_short_last_window_of_each_epoch(tmp_path: Path) -> None:
    """run.train: every epoch ends with its short window, stepped with its own size."""
    data = DataConfig(num_samples=300)
    n_train = len(make_splits(data).train)
    cfg = RunConfig(seed=0, device="cpu", data=data, output_dir=str(tmp_path),
                    train=TrainConfig(epochs=2, batch_size=16, accum_steps=4))
    result = train(cfg)
    with result.csv_path.open() as f:
        rows = list(csv.DictReader(f))
    n_batches = -(-n_train // 16)
    assert n_batches % 4 != 0, "the fixture must produce a short last window"
    per_epoch = -(-n_batches // 4)
    assert len(rows) == 2 * per_epoch
    for epoch in ("1", "2"):
        epoch_rows = [r for r in rows if r["epoch"] == epoch]
        assert sum(int(r["samples"]) for r in epoch_rows) == n_train
        assert [int(r["micro_batches"]) for r in epoch_rows] == [4] * (per_epoch - 1) + [
            n_batches % 4]
        assert all(r["skipped"] == "0" for r in epoch_rows)


# --- DDP: a real single-process gloo group ------------------------------------------------


@pytest.fixture
def gloo_group() -> Iterator[None]:
    """A world_size=1 gloo process group (FileStore rendezvous), destroyed afterwards."""
    assert not dist.is_initialized()
    with tempfile.TemporaryDirectory() as d:
        store = dist.FileStore(str(Path(d) / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def _counting_ddp() -> tuple[nn.parallel.DistributedDataParallel, list[int]]:
    """A world-1 DDP model whose comm hook records each all-reduced bucket's index."""
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(SequenceClassifier(ModelConfig(hidden_size=16)))
    hook_calls: list[int] = []

    # No annotations: DDP inspects them and rejects anything but the GradBucket class itself,
    # which ``from __future__ import annotations`` would turn into a string.
    def counting_hook(state, bucket):
        hook_calls.append(bucket.index())
        return default_hooks.allreduce_hook(None, bucket)

    ddp.register_comm_hook(None, counting_hook)
    return ddp, hook_calls


@pytest.mark.parametrize("window_sizes", [[4, 4, 4], [4, 2]], ids=["full", "with-short"])
def test_ddp_syncs_gradients_once_per_optimizer_step(
    gloo_group: None, window_sizes: list[int],
) -> None:
    """Non-final micro-batches run under no_sync(): one all-reduce per window."""
    ddp, hook_calls = _counting_ddp()
    ts = _trainer(4, model=ddp)
    x, y = _data(sum(window_sizes) * B)
    batches = _split(x, y, sum(window_sizes))
    start = 0
    for size in window_sizes:
        log = ts.step(batches[start : start + size])
        assert not log.skipped
        start += size

    assert ts.grad_syncs == len(window_sizes)
    assert hook_calls.count(0) == len(window_sizes)
    assert int(ts.optimizer.state[ts.params[0]]["step"]) == len(window_sizes)


def test_ddp_accumulated_gradient_matches_unwrapped(gloo_group: None) -> None:
    """Under DDP (world 1) the accumulated window gives the same gradient as without DDP."""
    x, y = _data(4 * B)
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(SequenceClassifier(ModelConfig(hidden_size=16)))
    wrapped = _trainer(4, model=ddp)
    plain = _trainer(4)
    wrapped.step(_split(x, y, 4))
    plain.step(_split(x, y, 4))
    grads_w = [p.grad for p in ddp.module.parameters()]
    grads_p = [p.grad for p in plain.model.parameters()]
    assert _max_abs_diff(grads_w, grads_p) < 1e-6
    assert plain.grad_syncs == 0


@pytest.mark.parametrize("bad", [1, 3], ids=["mid-window", "last-micro-batch"])
def test_ddp_nonfinite_loss_keeps_one_allreduce_per_step(gloo_group: None, bad: int) -> None:
    """A nan loss skips the window; the step after it still all-reduces exactly once.

    The skipped window's last forward ran outside no_sync(); its armed reduction must not
    leak into the next window's no_sync() backwards. Taken or skipped: one all-reduce a step.
    """
    ddp, hook_calls = _counting_ddp()
    ts = _trainer(4, model=ddp)
    plain = _trainer(4)
    x, y = _data(8 * B)
    batches = _split(x, y, 8)
    poisoned = list(batches[:4])
    poisoned[bad] = (torch.full_like(poisoned[bad][0], float("nan")), poisoned[bad][1])
    before = [p.detach().clone() for p in ddp.parameters()]

    skipped = ts.step(poisoned)
    plain.step(poisoned)

    assert skipped.skipped and skipped.skip_reason == "nonfinite_loss"
    assert all(torch.equal(p, b) for p, b in zip(ddp.parameters(), before, strict=True))
    assert hook_calls.count(0) == 1 and ts.grad_syncs == 1
    taken = ts.step(batches[4:])
    plain.step(batches[4:])
    assert not taken.skipped
    assert hook_calls.count(0) == 2 and ts.grad_syncs == 2 == ts.step_count
    assert int(ts.optimizer.state[ts.params[0]]["step"]) == 1
    params_p = list(plain.model.parameters())
    assert _max_abs_diff(list(ddp.module.parameters()), params_p) < 1e-6
