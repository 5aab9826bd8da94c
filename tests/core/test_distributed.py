"""Data-parallel training: all-reduce counts with and without no_sync, equivalence with one big
batch, agreed skips, identical GradScaler scales, rank-0-only files and tracking, and a dead or
stuck rank ending the run FAILED instead of hanging.

Ranks are real processes in a real gloo process group on 127.0.0.1, joined through
``stability.core.distributed.setup`` from the same environment torchrun sets. They are forked from
a fresh forkserver that has imported torch once (starting Python + torch per rank costs more
than the scenarios). The healthy scenarios share one pair of ranks (``ranks`` fixture); the
failure tests launch their own pair and, when one rank exits non-zero, terminate the others
with SIGTERM, as torchrun does.
"""

from __future__ import annotations

import contextlib
import csv
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DistributedSampler

from stability.core import distributed, signals
from stability.core.config import (
    ClipConfig,
    ConfigError,
    PrecisionConfig,
    RunConfig,
    TrackingConfig,
    TrainConfig,
)
from stability.core.loop import train
from stability.core.signals import Terminated
from stability.core.step import MicroBatch, TrainStep
from stability.core.steplog import EpochLog, StepLog
from stability.sweep.job import train_tracked
from stability.tasks.sign_sum import DataConfig, ModelConfig, SequenceClassifier
from stability.tracking.server import MlflowServer, free_port
from stability.tracking.uri import client

WORLD = 2
B, K = 4, 3  # micro-batch size and accumulation steps of the TrainStep-level scenarios
ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- launcher


@dataclass
class Ranks:
    """What the ranks of one launch left behind."""

    exitcodes: list[int | None]
    seconds: float
    results: list[Any]  # each rank's return value (None if it raised)
    errors: list[str]  # each rank's traceback ("" if it returned)


def _join(rank: int, port: int, timeout_s: float) -> None:
    """In a child: the environment torchrun would set, then the real process-group setup."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                      **{distributed.TIMEOUT_ENV: str(timeout_s)})
    torch.set_num_threads(1)
    assert distributed.setup("cpu") == WORLD


def _context() -> Any:
    """A forkserver context whose server has imported torch and this module (fork-safe: it
    has run no computation, so no thread pools exist to be broken by fork)."""
    ctx = mp.get_context("forkserver")
    # torch._dynamo: DDP imports it (and sympy) on first construction, ~4 s per rank.
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "stability.sweep.job", __name__])
    return ctx


def _entry(rank: int, port: int, timeout_s: float, scenario: Callable[..., Any], out: str,
           kwargs: dict[str, Any]) -> None:
    """Child process of ``_launch``: join, run one scenario, save its result."""
    try:
        _join(rank, port, timeout_s)
        result = scenario(rank, **kwargs)
    except BaseException:
        Path(out, f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    torch.save(result, Path(out, f"rank{rank}.pt"))


def _launch(scenario: Callable[..., Any], out: Path, timeout_s: float = 20.0,
            deadline_s: float = 120.0, **kwargs: Any) -> Ranks:
    """Run ``scenario(rank, **kwargs)`` on WORLD spawned ranks; fail the test if they hang."""
    ctx = _context()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, port, timeout_s, scenario, str(out), kwargs))
             for r in range(WORLD)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    terminated = False
    try:
        while any(p.is_alive() for p in procs):
            left = deadline_s - (time.monotonic() - t0)
            if left <= 0:
                pytest.fail(f"ranks still running after {deadline_s:.0f}s (a hang)")
            mp.connection.wait([p.sentinel for p in procs if p.is_alive()], timeout=min(left, 1))
            if not terminated and any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:  # what torchrun does when one rank exits non-zero
                    if p.is_alive():
                        p.terminate()
                terminated = True
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    seconds = time.monotonic() - t0
    results, errors = [], []
    for r in range(WORLD):
        res, err = out / f"rank{r}.pt", out / f"rank{r}.err"
        results.append(torch.load(res, weights_only=True) if res.exists() else None)
        errors.append(err.read_text() if err.exists() else "")
    return Ranks([p.exitcode for p in procs], seconds, results, errors)


def _serve(rank: int, port: int, conn: mp.connection.Connection) -> None:
    """Child process of the ``ranks`` fixture: run scenarios until told to stop."""
    _join(rank, port, timeout_s=30)
    conn.send(("ready", rank))
    while (job := conn.recv()) is not None:
        scenario, kwargs = job
        try:
            conn.send(("ok", scenario(rank, **kwargs)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
            raise


class RankPool:
    """WORLD long-lived ranks in one process group; ``run`` executes a scenario on all."""

    def __init__(self) -> None:
        ctx = _context()
        port = free_port()
        self.conns, self.procs = [], []
        for r in range(WORLD):
            parent, child = ctx.Pipe()
            self.conns.append(parent)
            self.procs.append(ctx.Process(target=_serve, args=(r, port, child), daemon=True))
        for p in self.procs:
            p.start()
        for r, c in enumerate(self.conns):  # startup (Python, torch, rendezvous) ends here
            if not c.poll(120):
                self.close()
                pytest.fail(f"rank {r} did not join the process group within 120 s")
            assert c.recv() == ("ready", r)

    def run(self, scenario: Callable[..., Any], deadline_s: float = 60.0,
            **kwargs: Any) -> list[Any]:
        """Results of ``scenario(rank, **kwargs)`` per rank; fails the test on error or hang."""
        for c in self.conns:
            c.send((scenario, kwargs))
        results = []
        t0 = time.monotonic()
        for r, c in enumerate(self.conns):
            if not c.poll(max(0.0, deadline_s - (time.monotonic() - t0))):
                self.close()
                pytest.fail(f"rank {r} still running {scenario.__name__} after {deadline_s}s")
            status, value = c.recv()
            if status != "ok":
                self.close()
                pytest.fail(f"rank {r} failed:\n{value}")
            results.append(value)
        return results

    def close(self) -> None:
        """Stop the ranks (kill any that do not stop)."""
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.send(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()


@pytest.fixture(scope="module")
def ranks() -> Iterator[RankPool]:
    """Two ranks shared by the healthy scenarios of this module."""
    pool = RankPool()
    yield pool
    pool.close()


# --------------------------------------------------------------------------- building blocks


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, 1, generator=g)
    return x, (x.sum(dim=(1, 2)) > 0).float()


def _global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples of one optimizer step over all ranks: WORLD * B * K of them."""
    return _data(WORLD * B * K, seed=100 + step)


def _my_micro_batches(step: int, rank: int) -> list[MicroBatch]:
    """This rank's half of the global batch (every WORLD-th sample), as K micro-batches."""
    x, y = _global_batch(step)
    return list(zip(x[rank::WORLD].split(B), y[rank::WORLD].split(B), strict=True))


def _model() -> SequenceClassifier:
    torch.manual_seed(0)
    return SequenceClassifier(ModelConfig(hidden_size=8))


def _trainer(model: nn.Module, accum: int, *, clip: bool = False, max_norm: float = 1.0,
             precision: str = "fp32", loss_fn: Callable[..., torch.Tensor] | None = None,
             growth_interval: int = 2000) -> TrainStep:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
    return TrainStep(model, opt, loss_fn or nn.BCEWithLogitsLoss(),
                     precision=PrecisionConfig(name=precision, growth_interval=growth_interval),
                     clip=ClipConfig(enabled=clip, max_norm=max_norm), accum_steps=accum)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _gathered(t: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(out, t)
    return out


def _count_allreduces(ddp: nn.parallel.DistributedDataParallel) -> list[int]:
    """Register a comm hook that counts real gradient all-reduces (one per synced backward)."""
    calls: list[int] = []

    # No annotations: DDP inspects them and rejects anything but the GradBucket class itself,
    # which ``from __future__ import annotations`` would turn into a string.
    def hook(state, bucket):  # noqa: ANN001, ANN202
        if bucket.index() == 0:
            calls.append(1)
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    return calls


class _PoisonOnRank:
    """BCE loss multiplied by ``factor`` on one rank at (optimizer step, micro-batch index)."""

    def __init__(self, rank: int, bad_rank: int, at: dict[tuple[int, int], float]) -> None:
        self.rank, self.bad_rank, self.at = rank, bad_rank, at
        self.trainer: TrainStep | None = None  # set once the TrainStep exists
        self.step, self.micro = 0, 0
        self.bce = nn.BCEWithLogitsLoss()

    def __call__(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert self.trainer is not None
        if self.trainer.step_count != self.step:
            self.step, self.micro = self.trainer.step_count, 0
        factor = self.at.get((self.step, self.micro), 1.0) if self.rank == self.bad_rank else 1.0
        self.micro += 1
        return self.bce(logits, y) * factor


def _poisoned(ts: TrainStep) -> TrainStep:
    assert isinstance(ts.loss_fn, _PoisonOnRank)
    ts.loss_fn.trainer = ts
    return ts


# --------------------------------------------------------------------------- scenarios (children)


def _scenario_allreduce_counts(rank: int, steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ddp = nn.parallel.DistributedDataParallel(_model())
    calls = _count_allreduces(ddp)
    ts = _trainer(ddp, K)
    for s in range(1, steps + 1):
        assert not ts.step(_my_micro_batches(s, rank)).skipped
    out["no_sync"] = {"allreduces": len(calls), "grad_syncs": ts.grad_syncs,
                      "params": _flat(ddp.module)}
    # What no_sync saves, measured here: the same accumulation written without it, where
    # every micro-batch's backward all-reduces.
    ddp = nn.parallel.DistributedDataParallel(_model())
    calls = _count_allreduces(ddp)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, weight_decay=1e-2)
    for s in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        window = _my_micro_batches(s, rank)
        for x, y in window:
            (nn.functional.binary_cross_entropy_with_logits(ddp(x), y) / len(window)).backward()
        opt.step()
    out["every_micro_batch"] = {"allreduces": len(calls), "params": _flat(ddp.module)}
    return out


def _scenario_equivalence(rank: int, clip_steps: int, max_norm: float) -> dict[str, Any]:
    """DDP (B x K per rank) against one process with the whole WORLD*B*K batch, both fresh."""
    out: dict[str, Any] = {}
    for name, steps, clip in (("one_step", 1, False), ("clipped", clip_steps, True)):
        ddp = nn.parallel.DistributedDataParallel(_model())
        ts = _trainer(ddp, K, clip=clip, max_norm=max_norm)
        ref = _trainer(_model(), 1, clip=clip, max_norm=max_norm)
        logs: list[StepLog] = []
        ref_logs: list[StepLog] = []
        for s in range(1, steps + 1):
            logs.append(ts.step(_my_micro_batches(s, rank)))
            ref_logs.append(ref.step([_global_batch(s)]))
        mine = _flat(ddp.module)
        out[name] = {
            "max_abs_diff": float((mine - _flat(ref.model)).abs().max()),
            "same_on_all_ranks": all(torch.equal(mine, g) for g in _gathered(mine)),
            "loss": [lg.loss for lg in logs], "ref_loss": [lg.loss for lg in ref_logs],
            "samples": [lg.samples for lg in logs],
            "clipped": [lg.clipped for lg in logs], "pre": [lg.grad_l2_pre_clip for lg in logs],
            "ref_pre": [lg.grad_l2_pre_clip for lg in ref_logs],
        }
    return out


def _scenario_nan_on_rank_1(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # NaN on rank 1 only: step 2's first (non-final) micro-batch, step 3's last one.
    ddp = nn.parallel.DistributedDataParallel(_model())
    calls = _count_allreduces(ddp)
    poison = _PoisonOnRank(rank, 1, {(2, 0): math.nan, (3, K - 1): math.nan})
    ts = _poisoned(_trainer(ddp, K, loss_fn=poison))
    params, logs, same = [], [], []
    for s in range(1, 5):
        lg = ts.step(_my_micro_batches(s, rank))
        logs.append((lg.skipped, lg.skip_reason))
        params.append(_flat(ddp.module))
        same.append(all(torch.equal(params[-1], g) for g in _gathered(params[-1])))
    out["no_sync"] = {"logs": logs, "params": params, "same_on_all_ranks": same,
                      "adam_steps": int(ts.optimizer.state[ts.params[0]]["step"]),
                      "allreduces": len(calls), "grad_syncs": ts.grad_syncs}
    return out


def _scenario_fp16_scales(rank: int) -> dict[str, Any]:
    # Loss x1e30 on rank 1 at step 4 overflows only rank 1's local fp16 gradients (the
    # all-reduce spreads the inf); a NaN loss on rank 1 at step 7 exercises the loss skip.
    ddp = nn.parallel.DistributedDataParallel(_model())
    poison = _PoisonOnRank(rank, 1, {(4, 0): 1e30, (7, 1): math.nan})
    ts = _poisoned(_trainer(ddp, K, precision="fp16", growth_interval=2, loss_fn=poison))
    scales, reasons, same_params = [], [], []
    for s in range(1, 10):
        lg = ts.step(_my_micro_batches(s, rank))
        reasons.append(lg.skip_reason)
        scales.append([float(t) for t in _gathered(torch.tensor(ts.scaler.get_scale()))])
        p = _flat(ddp.module)
        same_params.append(all(torch.equal(p, g) for g in _gathered(p)))
    return {"scales": scales, "reasons": reasons, "same_params": same_params}


def _run_config(out: Path, **train: Any) -> RunConfig:
    return RunConfig(
        seed=3, device="cpu", output_dir=str(out),
        data=DataConfig(num_samples=230),  # train split 160 = 5 x (2 ranks x 8 x 2), val 35
        model=ModelConfig(hidden_size=8),
        clip=ClipConfig(enabled=True, max_norm=0.05),
        train=TrainConfig(**({"epochs": 2, "lr": 1e-2} | train)),
        tracking=TrackingConfig(enabled=False),
    )


def _scenario_train(rank: int, root: str) -> dict[str, Any]:
    result = train(_run_config(Path(root, f"rank{rank}"), batch_size=8, accum_steps=2),
                   world_size=WORLD)
    return {"summary": {k: v for k, v in result.summary.items() if isinstance(v, int | float)},
            "val_loss": [e.val_loss for e in result.epochs]}


class _FailAt:
    """A step sink that breaks this rank at one optimizer step (raise, or hang)."""

    def __init__(self, step: int, hang: bool) -> None:
        self.step, self.hang = step, hang

    def on_step(self, log: StepLog, epoch: int) -> None:
        if log.step == self.step:
            if self.hang:
                time.sleep(600)
            raise RuntimeError(f"injected failure at step {self.step}")

    def on_epoch(self, log: EpochLog) -> None:
        pass


def _scenario_rank_1_breaks(rank: int, root: str, hang: bool, uri: str | None = None,
                            experiment: str = "") -> None:
    tracking = TrackingConfig(uri=uri, experiment=experiment, enabled=uri is not None)
    cfg = replace(_run_config(Path(root, f"rank{rank}"), epochs=3), tracking=tracking)
    sink = _FailAt(3, hang)
    train_tracked(cfg, sinks=[sink] if rank == 1 else [])


# --------------------------------------------------------------------------- tests


def test_one_gradient_allreduce_per_optimizer_step_with_no_sync(ranks: RankPool) -> None:
    """Counted with a comm hook: 1 all-reduce per step with no_sync, K without, same result."""
    steps = 3
    results = ranks.run(_scenario_allreduce_counts, steps=steps)
    for r in results:
        assert r["no_sync"]["allreduces"] == steps
        assert r["no_sync"]["grad_syncs"] == steps
        assert r["every_micro_batch"]["allreduces"] == steps * K
        diff = (r["no_sync"]["params"] - r["every_micro_batch"]["params"]).abs().max()
        assert float(diff) < 1e-6
    print(f"all-reduces over {steps} steps, accum {K}: no_sync "
          f"{results[0]['no_sync']['allreduces']}, without "
          f"{results[0]['every_micro_batch']['allreduces']}")


def test_two_ranks_match_one_process_with_the_whole_batch(ranks: RankPool) -> None:
    """2 ranks x B x K give the parameters of one process stepping on 2*B*K samples."""
    results = ranks.run(_scenario_equivalence, clip_steps=4, max_norm=0.05)
    r0 = results[0]
    for name in ("one_step", "clipped"):
        res = r0[name]
        assert res["max_abs_diff"] < 1e-5, (name, res["max_abs_diff"])
        assert res["same_on_all_ranks"]
        assert res["samples"] == [WORLD * B * K] * len(res["samples"])
        assert max(abs(a - b) for a, b in zip(res["loss"], res["ref_loss"], strict=True)) < 1e-6
        assert max(abs(a - b) for a, b in zip(res["pre"], res["ref_pre"], strict=True)) < 1e-6
    assert all(r0["clipped"]["clipped"]), "max_norm must be low enough to clip every step"
    print(f"max |param diff| vs one process: one step {r0['one_step']['max_abs_diff']:.3g}, "
          f"4 clipped steps {r0['clipped']['max_abs_diff']:.3g}")


def test_nan_loss_on_one_rank_skips_the_step_on_every_rank(ranks: RankPool) -> None:
    """Rank 1's NaN (mid-window and last micro-batch): both ranks skip, params stay equal."""
    results = ranks.run(_scenario_nan_on_rank_1)
    expected = [(False, ""), (True, "nonfinite_loss"), (True, "nonfinite_loss"), (False, "")]
    for r in results:
        res = r["no_sync"]
        assert res["logs"] == expected
        assert all(res["same_on_all_ranks"])
        assert torch.equal(res["params"][0], res["params"][1])  # skips change nothing
        assert torch.equal(res["params"][1], res["params"][2])
        assert not torch.equal(res["params"][2], res["params"][3])  # step 4 is taken
        assert res["adam_steps"] == 2
        assert res["grad_syncs"] == res["allreduces"]
    # A skipped window still completes the reduction its last forward armed: with no_sync
    # exactly one gradient all-reduce per optimizer step, taken or skipped.
    assert results[0]["no_sync"]["allreduces"] == 4
    assert torch.equal(results[0]["no_sync"]["params"][3], results[1]["no_sync"]["params"][3])


def test_fp16_grad_scaler_scale_is_identical_on_every_rank(ranks: RankPool) -> None:
    """Growth, an overflow on rank 1 only and a NaN loss on rank 1 only: same scale everywhere."""
    r0, r1 = ranks.run(_scenario_fp16_scales)
    assert r0["reasons"] == r1["reasons"]
    assert r0["reasons"][3] == "nonfinite_grad" and r0["reasons"][6] == "nonfinite_loss"
    for per_rank in r0["scales"]:
        assert per_rank[0] == per_rank[1]
    trace = [s[0] for s in r0["scales"]]
    assert any(b > a for a, b in zip(trace, trace[1:], strict=False))  # grew
    assert trace[3] < trace[2] and trace[6] < trace[5]  # backed off on both skips
    assert all(r0["same_params"]) and all(r1["same_params"])
    print(f"fp16 scale per step (both ranks): {trace}, skips {r0['reasons']}")


def test_two_rank_train_matches_one_process_and_only_rank_0_writes(
    ranks: RankPool, tmp_path: Path,
) -> None:
    """run.train: sharded epochs, reduced loss/val, DDP; rank 1 writes nothing."""
    results = ranks.run(_scenario_train, root=str(tmp_path))
    ref = train(_run_config(tmp_path / "single", batch_size=WORLD * 8 * 2, accum_steps=1))

    assert not (tmp_path / "rank1").exists()
    with (tmp_path / "rank0" / "steps.csv").open() as f:
        ddp_rows = list(csv.DictReader(f))
    with (tmp_path / "single" / "steps.csv").open() as f:
        ref_rows = list(csv.DictReader(f))
    assert len(ddp_rows) == len(ref_rows) == 10
    for a, b in zip(ddp_rows, ref_rows, strict=True):
        assert a["samples"] == b["samples"] == "32"
        for key in ("loss", "grad_l2_pre_clip"):
            assert abs(float(a[key]) - float(b[key])) < 1e-5, (key, a["step"])
    assert sum(int(row["clipped"]) for row in ddp_rows) > 0
    for r in results:
        assert max(abs(u - v) for u, v in zip(r["val_loss"], [e.val_loss for e in ref.epochs],
                                              strict=True)) < 1e-5
        assert r["summary"]["effective_batch"] == 8 * 2 * WORLD
        assert r["summary"]["grad_syncs"] == 10
    best = torch.load(tmp_path / "rank0" / "checkpoints" / "best.pt", weights_only=True)
    ref_best = torch.load(ref.checkpoint_path, weights_only=True)
    assert best.keys() == ref_best.keys()  # the unwrapped module's keys, no "module." prefix
    diff = max(float((best[k] - ref_best[k]).abs().max()) for k in best)
    assert diff < 1e-5
    print(f"run.train, 2 ranks x 8 x accum 2 vs 1 process x 32, 10 clipped steps: "
          f"max |checkpoint diff| {diff:.3g}")


def _the_run(server: MlflowServer, experiment: str) -> Any:
    c = client(server.uri)
    exp = c.get_experiment_by_name(experiment)
    assert exp is not None
    runs = c.search_runs([exp.experiment_id])
    assert len(runs) == 1
    return runs[0]


@pytest.mark.slow
@pytest.mark.server
def test_a_rank_that_dies_ends_the_run_failed_without_waiting_for_the_collective_timeout(
    tmp_path: Path, mlflow_server: MlflowServer,
) -> None:
    """Rank 1 raises at step 3: both ranks exit non-zero; rank 0's run is FAILED.

    The collective timeout (300 s) is longer than the launch's deadline (120 s, which fails the
    test as a hang): the ranks end because rank 1's failure reaches rank 0, not by timing out.
    """
    ranks = _launch(_scenario_rank_1_breaks, tmp_path, timeout_s=300, deadline_s=120,
                    root=str(tmp_path), uri=mlflow_server.uri, experiment="ddp-dead-rank",
                    hang=False)
    assert ranks.exitcodes[1] != 0 and ranks.exitcodes[0] != 0, ranks.exitcodes
    # rank 0 learnt of the failure from the store (the collective broke), it did not time out
    assert ("PeerFailedError: rank 1 failed: RuntimeError: injected failure at step 3"
            in ranks.errors[0]), ranks.errors[0][-2000:]
    assert "Timed out waiting" not in ranks.errors[0]
    assert "injected failure at step 3" in ranks.errors[1]
    run = _the_run(mlflow_server, "ddp-dead-rank")
    assert run.info.status == "FAILED"
    assert run.data.tags["stability.outcome"] == "failed"
    assert "rank 1 failed: RuntimeError: injected failure at step 3" in (
        run.data.tags["stability.reason"])
    assert run.data.params["world_size"] == "2"
    with (tmp_path / "rank0" / "steps.csv").open() as f:  # nothing logged is lost
        assert [row["step"] for row in csv.DictReader(f)][:3] == ["1", "2", "3"]
    artifacts = {a.path for a in client(mlflow_server.uri).list_artifacts(run.info.run_id)}
    assert "steps.csv" in artifacts


def test_a_stuck_rank_makes_the_others_time_out_instead_of_waiting_forever(
    tmp_path: Path,
) -> None:
    """Rank 1 hangs at step 3: rank 0's next collective raises after the timeout (3 s).

    Without tracking: the timeout also bounds how long rank 1 waits for rank 0 to create its
    MLflow run before the first collective, so with tracking it cannot be this small.
    """
    timeout_s = 3
    # rank 1 sleeps 600 s: a deadline far below that fails the test if rank 0 waits for it
    ranks = _launch(_scenario_rank_1_breaks, tmp_path, timeout_s=timeout_s, deadline_s=120,
                    root=str(tmp_path), hang=True)
    assert ranks.exitcodes[0] != 0 and ranks.exitcodes[1] != 0, ranks.exitcodes
    assert f"Timed out waiting {timeout_s * 1000}ms" in ranks.errors[0]
    assert "PeerFailedError" not in ranks.errors[0]  # rank 1 did not fail, it hangs


# --------------------------------------------------------------------------- single-process units


@pytest.mark.parametrize(("n", "world"), [(10, 2), (11, 2), (13, 3), (2, 3)])
def test_shards_are_distributed_sampler_shares_of_the_permutation(n: int, world: int) -> None:
    order = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    for r in range(world):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False)
        assert distributed.shard_indices(order, r, world).tolist() == order[list(sampler)].tolist()


@pytest.mark.parametrize("raw", ["0", "-5", "soon", "nan", "inf"])
def test_invalid_timeout_names_the_variable_and_allowed_values(
    raw: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(distributed.TIMEOUT_ENV, raw)
    with pytest.raises(ConfigError, match=f"{distributed.TIMEOUT_ENV}=.*number of seconds > 0"):
        distributed.timeout_from_env()


def test_timeout_defaults_to_60_s_and_reads_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(distributed.TIMEOUT_ENV, raising=False)
    assert distributed.timeout_from_env() == timedelta(seconds=60)
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "2.5")
    assert distributed.timeout_from_env() == timedelta(seconds=2.5)


def test_without_torchrun_nothing_is_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert distributed.setup("cpu") == 1
    assert not distributed.is_distributed()
    assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (0, 1, True)


def test_sigterm_during_a_deferred_block_is_delivered_after_it() -> None:
    """Closing rank 0's MLflow run is not cut short: the signal waits for the block's end."""
    seen: list[str] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append("SIGTERM"))
    try:
        with signals.sigterm_deferred():
            signal.raise_signal(signal.SIGTERM)
            seen.append("still closing")
        assert seen == ["still closing", "SIGTERM"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_terminated_after_a_peer_failed_becomes_peer_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchrun's SIGTERM (Terminated) after rank 1 failed ends rank 0 FAILED, not KILLED.

    The store here is a real one-process ``FileStore`` put in place of the group's: a seam, so
    that the order (SIGTERM before or after a peer's failure is written) is set by the test
    rather than by which process torchrun happens to signal first; the two-process run of
    the same path is
    test_a_rank_that_dies_ends_the_run_failed_without_waiting_for_the_collective_timeout.
    """
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ours = dist.PrefixStore("stability", store)
        monkeypatch.setattr(distributed._state, "store", ours)
        monkeypatch.setattr(distributed._state, "failed", False)
        with pytest.raises(Terminated), distributed.rank_guard():  # no peer failed: KILLED
            raise Terminated("signal 15")
        assert not ours.check(["failed"])  # a kill from outside is nobody's failure
        ours.set("failed", "rank 1 failed: RuntimeError: boom")
        peer = "rank 1 failed: RuntimeError: boom"
        with pytest.raises(distributed.PeerFailedError, match=peer), distributed.rank_guard():
            raise Terminated("signal 15")
    finally:
        dist.destroy_process_group()


def test_leave_ends_the_group_before_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``leave`` destroys the group while the interpreter is alive (not at exit); is idempotent."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    monkeypatch.setattr(distributed._state, "failed", False)
    monkeypatch.setattr(distributed._state, "rank", 0)
    distributed.leave()
    assert not dist.is_initialized()
    assert distributed.is_main() and distributed.world_size() == 1
    distributed.leave()  # the exit handler's second call finds nothing to do
    distributed.shutdown()


def test_world_size_without_a_process_group_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="world_size=2 is invalid.*torchrun"):
        train(_run_config(tmp_path), world_size=2)
    assert not (tmp_path / "steps.csv").exists()


# --------------------------------------------------------------------------- torchrun end to end


def _torchrun(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node=2",
           "experiments/sweep.py", "train.epochs=2", "data.num_samples=300",
           f"hydra.run.dir={tmp_path / 'run'}", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_torchrun_without_tracking_trains_one_configuration(tmp_path: Path) -> None:
    proc = _torchrun(tmp_path, "tracking.enabled=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (tmp_path / "run" / "steps.csv").open() as f:
        rows = list(csv.DictReader(f))  # one header: only rank 0 wrote
    assert rows and all(row["step"].isdigit() for row in rows)
    assert proc.stdout.count("finished: best val_loss") == 1  # rank 0 prints the summary


@pytest.mark.slow
@pytest.mark.server
def test_torchrun_logs_one_mlflow_run_with_world_size(
    tmp_path: Path, mlflow_server: MlflowServer,
) -> None:
    accum = 2
    proc = _torchrun(tmp_path, f"tracking.uri={mlflow_server.uri}",
                     "tracking.experiment=ddp-torchrun", f"train.accum_steps={accum}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = _the_run(mlflow_server, "ddp-torchrun")
    assert run.info.status == "FINISHED"
    assert run.data.params["world_size"] == "2"
    assert run.data.metrics["effective_batch"] == 64 * accum * 2
    assert run.data.metrics["optimizer_steps"] > 0
